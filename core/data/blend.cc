#include "core/data/blend.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "core/util/format.h"

namespace bigmac::data {
namespace {

namespace fs = std::filesystem;

// The golden ratio's fraction in 2^-64 units: the Weyl step with the most even spread.
constexpr uint64_t kGoldenStep = 0x9E3779B97F4A7C15ULL;

bool Exists(const std::string& path) {
  std::error_code error;
  return fs::exists(path, error);
}

bool IsDirectory(const std::string& path) {
  std::error_code error;
  return fs::is_directory(path, error);
}

std::string ParentOf(const std::string& path) {
  const std::string parent = fs::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

// "data/web_text_document" -> "web_text_document"; "data/llmc/*train*.bin" -> "*train*.bin".
std::string ShortName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  std::string name = fs::path(path).filename().string();
  if (name.size() > 4 && name.compare(name.size() - 4, 4, ".bin") == 0)
    name.resize(name.size() - 4);
  return name.empty() ? path : name;
}

std::string Count(int64_t documents, int64_t tokens) {
  return (documents >= 0 ? std::to_string(documents) + " documents, " : std::string()) +
         std::to_string(tokens) + " tokens";
}

// The training stream of one data.path entry (or data.dir), and its validation files when it is a
// directory that has them and no data.split is given.
void OpenStreams(const std::string& path, bool is_data_dir, const BlendedData::Options& options,
                 BlendDataset* out) {
  const bool split_given = options.spec.split.has_value();
  const auto open_directory = [&](const std::string& dir) {
    // TokenDataset's defaults for empty globs.
    const std::string train_glob =
        options.train_files.empty() ? "*train*.bin" : options.train_files;
    const std::string val_glob = options.val_files.empty() ? "*val*.bin" : options.val_files;
    const bool has_val = !MatchingPaths(dir + "/" + val_glob).empty();
    // Neither split's files (a directory of Megatron's X_text_document.bin/.idx): every token
    // file in it is the dataset, divided by the split.
    if (!has_val && MatchingPaths(dir + "/" + train_glob).empty() &&
        !MatchingPaths(dir + "/*.bin").empty()) {
      out->stream = std::make_unique<TokenDataset>(dir, "train", "*.bin");
      return;
    }
    out->stream = std::make_unique<TokenDataset>(dir, "train", options.train_files);
    if (!split_given && has_val) {
      out->val_stream = std::make_unique<TokenDataset>(dir, "val", options.val_files);
    }
  };
  if (is_data_dir) return open_directory(path);
  const std::string where = "data.path: " + path;
  if (Exists(path + ".bin") && Exists(path + ".idx")) {  // a Megatron prefix
    out->stream = std::make_unique<TokenDataset>(std::vector<std::string>{path + ".bin"}, path,
                                                 ParentOf(path));
  } else if (IsDirectory(path)) {
    open_directory(path);
  } else if (path.find_first_of("*?[") != std::string::npos) {
    const std::vector<std::string> paths = MatchingPaths(path);
    if (paths.empty()) throw DataError(where + ": the pattern matches no file");
    out->stream = std::make_unique<TokenDataset>(paths, path, ParentOf(path));
  } else if (Exists(path)) {
    out->stream =
        std::make_unique<TokenDataset>(std::vector<std::string>{path}, path, ParentOf(path));
  } else {
    throw DataError(where + ": not found: no " + path + ".bin and " + path +
                    ".idx (a Megatron prefix), token file, directory or matching files");
  }
}

// Divides `out`'s stream into train, validation and test ranges.
void Divide(const std::optional<config::SplitShares>& split, BlendDataset* out) {
  const TokenDataset& stream = *out->stream;
  if (out->val_stream) {
    out->train = TokenRange(&stream, 0, stream.size(), stream.documents());
    out->val =
        TokenRange(out->val_stream.get(), 0, out->val_stream->size(), out->val_stream->documents());
    out->division = "validation from its own files, " + out->val_stream->description();
    return;
  }
  const config::SplitShares shares = split.value_or(config::kDefaultSplit);
  const std::string how = "split " + config::SplitText(shares) +
                          (split ? std::string() : " (Megatron's default: no *val* files)");
  if (stream.documents() >= 0) {
    const std::array<int64_t, 4> at = config::SplitIndices(shares, stream.documents());
    const auto range = [&](int i) {
      return TokenRange(&stream, stream.DocumentStart(at[i]), stream.DocumentStart(at[i + 1]),
                        at[i + 1] - at[i]);
    };
    out->train = range(0);
    out->val = range(1);
    out->test = range(2);
    out->division = how + " by documents";
  } else {
    const std::array<int64_t, 4> at = config::SplitIndices(shares, stream.size());
    out->train = TokenRange(&stream, at[0], at[1], -1);
    out->val = TokenRange(&stream, at[1], at[2], -1);
    out->test = TokenRange(&stream, at[2], at[3], -1);
    out->division = how + " by tokens (its format has no documents)";
  }
}

}  // namespace

BlendSampler::BlendSampler(const std::vector<double>& weights, uint64_t seed)
    : start_(SampleKey(seed, -1, -1, -1, -1)) {  // a start drawn from the seed alone
  long double total = 0;
  for (double weight : weights) {
    total += weight;
    ends_.push_back(total >= 1 ? UINT64_MAX
                               : static_cast<uint64_t>(total * 18446744073709551616.0L));
  }
  if (!ends_.empty()) ends_.back() = UINT64_MAX;
}

int BlendSampler::DatasetOf(int64_t sample) const {
  const uint64_t x = start_ + static_cast<uint64_t>(sample) * kGoldenStep;  // mod 2^64
  const int d = static_cast<int>(std::upper_bound(ends_.begin(), ends_.end(), x) - ends_.begin());
  return std::min(d, size() - 1);
}

void BlendSampler::Count(int64_t begin, int64_t end, std::vector<int64_t>* counts) const {
  counts->resize(ends_.size(), 0);
  for (int64_t i = begin; i < end; ++i) ++(*counts)[DatasetOf(i)];
}

std::vector<config::BlendEntry> BlendEntries(const config::DataSpec& spec, const std::string& dir) {
  if (spec.blend.empty()) return {{1.0, dir}};
  return spec.blend;
}

BlendSampler BlendSampler::Of(const std::vector<config::BlendEntry>& entries, uint64_t seed) {
  std::vector<double> weights;
  for (const config::BlendEntry& entry : entries) weights.push_back(entry.weight);
  return BlendSampler(weights, seed);
}

std::vector<std::string> DatasetNames(const std::vector<config::BlendEntry>& entries) {
  std::vector<std::string> names;
  std::map<std::string, int> seen;
  for (const config::BlendEntry& entry : entries) {
    std::string name = ShortName(entry.path);
    if (const int before = seen[name]++; before > 0) name += "#" + std::to_string(before + 1);
    names.push_back(name);
  }
  return names;
}

std::string DataHome(const config::DataSpec& spec, const std::string& dir) {
  if (spec.blend.empty()) return dir;
  const std::string& first = spec.blend.front().path;
  return IsDirectory(first) ? first : ParentOf(first);
}

BlendedData::BlendedData(const Options& options) {
  const std::vector<config::BlendEntry> entries = BlendEntries(options.spec, options.dir);
  const bool from_dir = options.spec.blend.empty();
  const std::vector<std::string> names = DatasetNames(entries);
  for (size_t i = 0; i < entries.size(); ++i) {
    const config::BlendEntry& entry = entries[i];
    BlendDataset& dataset = datasets_.emplace_back();
    dataset.path = entry.path;
    dataset.weight = entry.weight;
    dataset.name = names[i];
    OpenStreams(entry.path, from_dir, options, &dataset);
    if (dataset.stream->size() == 0)
      throw DataError(dataset.stream->description() + ": the dataset is empty");
    Divide(options.spec.split, &dataset);
  }
  // One tokenizer for all: the same ids must mean the same text in every dataset.
  const TokenDataset* first_declared = nullptr;
  for (const BlendDataset& dataset : datasets_) {
    for (const TokenDataset* stream : {dataset.stream.get(), dataset.val_stream.get()}) {
      if (stream == nullptr || stream->declared_vocab() == 0) continue;
      if (first_declared == nullptr) {
        first_declared = stream;
        continue;
      }
      const auto id = [](const TokenDataset* s) {
        return s->tokenizer() ? s->tokenizer()->Id() : std::string();
      };
      if (stream->declared_vocab() != first_declared->declared_vocab() ||
          (!id(stream).empty() && !id(first_declared).empty() &&
           id(stream) != id(first_declared))) {
        throw DataError(
            "data.path: the datasets' vocabularies differ: " + stream->vocab_source() +
            (id(stream).empty() ? "" : " (tokenizer " + id(stream) + ")") + ", but " +
            first_declared->vocab_source() +
            (id(first_declared).empty() ? "" : " (tokenizer " + id(first_declared) + ")") +
            "; a blend's datasets must share one tokenizer");
      }
    }
  }
}

std::vector<double> BlendedData::weights() const {
  std::vector<double> weights;
  for (const BlendDataset& dataset : datasets_) weights.push_back(dataset.weight);
  return weights;
}

int64_t BlendedData::vocab_size() const {
  int64_t vocab = 0;
  for (const BlendDataset& dataset : datasets_) {
    vocab = std::max(vocab, dataset.stream->vocab_size());
    if (dataset.val_stream) vocab = std::max(vocab, dataset.val_stream->vocab_size());
  }
  return vocab;
}

std::string BlendedData::Summary() const {
  if (datasets_.size() == 1) return datasets_.front().stream->description();
  std::vector<std::string> parts;
  for (const BlendDataset& dataset : datasets_)
    parts.push_back(util::Format("%s %.3g", dataset.name.c_str(), dataset.weight));
  return std::to_string(datasets_.size()) + " datasets blended (" + util::Join(parts, ", ") + ")";
}

std::vector<std::string> BlendedData::Describe() const {
  std::vector<std::string> lines;
  for (const BlendDataset& dataset : datasets_) {
    std::string line = dataset.name;
    if (datasets_.size() > 1) line += util::Format(" (weight %.4g)", dataset.weight);
    line += ": " + dataset.stream->description() + "; " + dataset.division + ": train " +
            Count(dataset.train.documents(), dataset.train.size()) + ", validation " +
            Count(dataset.val.documents(), dataset.val.size());
    if (!dataset.val_stream)
      line += ", test " + Count(dataset.test.documents(), dataset.test.size());
    lines.push_back(line);
  }
  return lines;
}

std::vector<std::string> BlendedData::Warnings(int seq, int batch, int eval_batches) const {
  std::vector<std::string> warnings;
  for (const BlendDataset& dataset : datasets_) {
    std::vector<std::string> more =
        dataset.val_stream
            ? SplitWarnings(*dataset.stream, *dataset.val_stream, seq, batch, eval_batches)
            : std::vector<std::string>{EvalRepeatWarning(dataset.val.size(),
                                                         dataset.name + "'s validation split", seq,
                                                         batch, eval_batches)};
    for (std::string& warning : more) {
      if (!warning.empty()) warnings.push_back(std::move(warning));
    }
  }
  return warnings;
}

void BlendedData::CheckFits(int seq, int64_t model_vocab) const {
  for (const BlendDataset& dataset : datasets_) {
    dataset.stream->CheckFits(seq, model_vocab);
    if (dataset.val_stream) dataset.val_stream->CheckFits(seq, model_vocab);
    const auto check = [&](const TokenRange& range, const char* split) {
      if (range.Fits(seq)) return;
      throw DataError(util::Format(
          "%s: its %s split (%s) holds %s, fewer than seq_length+1 = %d tokens; %s",
          dataset.stream->description().c_str(), split, dataset.division.c_str(),
          Count(range.documents(), range.size()).c_str(), seq + 1,
          std::string(split) == "train"
              ? "give data.split a larger train share, or use more data"
              : "give data.split a larger validation share (its second number), or use more "
                "data"));
    };
    check(dataset.train, "train");
    check(dataset.val, "validation");
  }
}

void BlendedData::TrainBatch(const BlendSampler& sampler, int64_t first_sample, uint64_t seed,
                             int64_t step, int micro_batch, int batch, int seq, int32_t* tokens,
                             int32_t* targets) const {
  for (int row = 0; row < batch; ++row) {
    const int64_t sample = first_sample + int64_t{micro_batch} * batch + row;
    const int d = datasets_.size() == 1 ? 0 : sampler.DatasetOf(sample);
    datasets_[d].train.SampleWindow(SampleKey(seed, step, 0, micro_batch, row), seq,
                                    tokens + int64_t{row} * seq, targets + int64_t{row} * seq);
  }
}

}  // namespace bigmac::data
