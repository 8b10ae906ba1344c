#include "core/data/dataset.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "core/util/format.h"

namespace bigmac::data {
namespace {

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

namespace fs = std::filesystem;

// The paths matching `pattern` under `dir`, sorted by name.
std::vector<std::string> Glob(const std::string& dir, const std::string& pattern) {
  return MatchingPaths(dir + "/" + pattern);
}

}  // namespace

std::vector<std::string> MatchingPaths(const std::string& full) {
  glob_t matches{};
  std::vector<std::string> paths;
  if (glob(full.c_str(), 0, nullptr, &matches) == 0) {
    for (size_t i = 0; i < matches.gl_pathc; ++i) paths.emplace_back(matches.gl_pathv[i]);
  }
  globfree(&matches);
  std::sort(paths.begin(), paths.end());
  return paths;
}

bool IsShardName(const std::string& name) {
  const bool prefix = name.rfind("train_", 0) == 0 || name.rfind("val_", 0) == 0;
  auto ends = [&name](const std::string& tail) {
    return name.size() >= tail.size() &&
           name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return prefix && (ends(".bin") || ends(".bin.tmp"));
}

std::vector<std::string> ShardsIn(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code error;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    if (IsShardName(it->path().filename().string()))
      names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

TokenDataset::TokenDataset(const std::string& dir, const std::string& split,
                           const std::string& pattern) {
  std::error_code error;
  const fs::file_status status = fs::status(dir, error);
  if (!fs::exists(status) && (!error || error == std::errc::no_such_file_or_directory)) {
    throw DataError(dir + ": data directory not found (prepare one with `bigmac data prep`)");
  }
  if (error) throw DataError(dir + ": cannot use the data directory: " + error.message());
  if (!fs::is_directory(status)) {
    throw DataError(dir +
                    ": is a file, not a data directory (data.dir names the directory "
                    "`bigmac data prep --output` wrote)");
  }
  const std::string glob = pattern.empty() ? "*" + split + "*.bin" : pattern;
  const std::vector<std::string> paths = Glob(dir, glob);
  if (paths.empty()) throw DataError(dir + ": no " + split + " files matching " + glob);
  Open(paths, dir);
  glob_ = glob;
  description_ = dir + "/" + glob + " (" + std::to_string(paths.size()) + " " +
                 TokenFormatName(files_.front().format()) + " files, " + std::to_string(size_) +
                 " tokens)";
}

TokenDataset::TokenDataset(const std::vector<std::string>& paths, const std::string& label,
                           const std::string& tokenizer_dir) {
  Open(paths, tokenizer_dir);
  glob_ = label;
  description_ =
      label + " (" +
      (paths.size() == 1 ? std::string("1 ") + TokenFormatName(files_.front().format()) + " file"
                         : std::to_string(paths.size()) + " " +
                               TokenFormatName(files_.front().format()) + " files") +
      ", " + std::to_string(size_) + " tokens)";
}

void TokenDataset::Open(const std::vector<std::string>& paths, const std::string& tokenizer_dir) {
  paths_ = paths;
  tokenizer_ = ReadTokenizerManifest(tokenizer_dir);
  uint32_t declared = tokenizer_ ? tokenizer_->vocab_size : 0;
  std::string declared_by = tokenizer_ ? tokenizer_dir + "/" + kTokenizerManifest : "";
  TokenFile::Largest largest;
  std::string largest_in;
  for (const std::string& path : paths) {
    files_.emplace_back(path);
    const TokenFile& file = files_.back();
    if (const uint32_t vocab = file.declared_vocab(); vocab != 0) {
      if (declared != 0 && vocab != declared) {
        throw DataError(path + ": vocabulary " + std::to_string(vocab) + " differs from " +
                        std::to_string(declared) + " in " + declared_by);
      }
      if (declared == 0) {
        declared = vocab;
        declared_by = path;
      }
    }
    const TokenFile::Largest top = file.LargestToken();
    if (top.position >= 0 && (largest.position < 0 || top.token > largest.token)) {
      largest = top;
      largest_in = path;
    }
    starts_.push_back(size_);
    size_ += file.size();
  }
  // Documents only when every file has them (Megatron's); the stream is then divided by them.
  int64_t documents = 0;
  for (const TokenFile& file : files_) {
    first_documents_.push_back(documents);
    documents = file.documents() < 0 || documents < 0 ? -1 : documents + file.documents();
  }
  documents_ = documents;
  const std::string at_largest = largest_in + ": token " + std::to_string(largest.token) +
                                 " at position " + std::to_string(largest.position);
  if (declared != 0 && largest.position >= 0 && largest.token >= declared) {
    throw DataError(at_largest + " is outside the vocabulary of " + std::to_string(declared) +
                    " (" + declared_by + ")");
  }
  vocab_size_ = declared != 0 ? declared : int64_t{largest.token} + 1;
  vocab_source_ = declared != 0 ? declared_by + ": vocabulary " + std::to_string(declared)
                                : at_largest + " (the largest) means a vocabulary of at least " +
                                      std::to_string(vocab_size_);
  declared_vocab_ = declared;
}

int64_t TokenDataset::DocumentStart(int64_t d) const {
  if (documents_ < 0 || d >= documents_) return size_;
  // The last file whose first document is at or before d (past files that hold none).
  const size_t i = std::upper_bound(first_documents_.begin(), first_documents_.end(), d) -
                   first_documents_.begin() - 1;
  return starts_[i] + files_[i].DocumentStart(d - first_documents_[i]);
}

// A file both splits read (by its real path: a link to the other split's file is that file).
static std::vector<std::string> SharedFileWarnings(const TokenDataset& train,
                                                   const TokenDataset& val) {
  std::vector<std::string> warnings;
  // The same file under two names (a link) is the same file: compare where they lead.
  std::map<std::string, std::string> train_files;
  for (const std::string& path : train.paths()) {
    std::error_code error;
    const fs::path real = fs::canonical(path, error);
    train_files[error ? path : real.string()] = path;
  }
  for (const std::string& path : val.paths()) {
    std::error_code error;
    const fs::path real = fs::canonical(path, error);
    const auto both = train_files.find(error ? path : real.string());
    if (both == train_files.end()) continue;
    warnings.push_back(
        (both->second == path ? path : path + " (the same file as " + both->second + ")") +
        " is read by both splits: data.train_files " + train.glob() + " and data.val_files " +
        val.glob() +
        " match it, so the run trains on the windows it validates on and val_loss "
        "is not a held-out loss");
  }
  return warnings;
}

std::string EvalRepeatWarning(int64_t val_tokens, const std::string& val_description, int seq,
                              int batch, int eval_batches) {
  const int64_t have = val_tokens / (int64_t{seq} + 1);
  const int64_t need = int64_t{eval_batches} * batch;
  if (have > 0 && need > have) {
    return util::Format(
        "train.eval_batches=%d x train.micro_batch_size=%d = %lld validation windows of "
        "seq_length+1=%d tokens, but %s holds %lld: the windows after the first %lld repeat "
        "them (each counts up to %lld times in val_loss); train.eval_batches=%lld uses each "
        "window once",
        eval_batches, batch, static_cast<long long>(need), seq + 1, val_description.c_str(),
        static_cast<long long>(have), static_cast<long long>(have),
        static_cast<long long>((need + have - 1) / have),
        static_cast<long long>(std::max<int64_t>(1, have / batch)));
  }
  return "";
}

std::vector<std::string> SplitWarnings(const TokenDataset& train, const TokenDataset& val, int seq,
                                       int batch, int eval_batches) {
  std::vector<std::string> warnings = SharedFileWarnings(train, val);
  if (std::string repeat =
          EvalRepeatWarning(val.size(), val.description(), seq, batch, eval_batches);
      !repeat.empty()) {
    warnings.push_back(repeat);
  }
  return warnings;
}

void TokenDataset::CheckFits(int seq, int64_t model_vocab) const {
  if (size() < int64_t{seq} + 1) {
    throw DataError(description_ + ": fewer tokens than seq_length+1 = " + std::to_string(seq + 1));
  }
  if (int64_t{vocab_size_} > model_vocab) {
    throw DataError(vocab_source_ +
                    ", larger than model.vocab_size=" + std::to_string(model_vocab) +
                    " (its token ids would index past the embedding)");
  }
}

void TokenDataset::Gather(int64_t begin, int64_t n, int32_t* out) const {
  size_t i = std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin() - 1;
  while (n > 0) {
    const int64_t local = begin - starts_[i];
    const int64_t take = std::min(n, files_[i].size() - local);
    files_[i].Copy(local, take, out);
    out += take;
    begin += take;
    n -= take;
    ++i;
  }
}

void TokenDataset::Window(int64_t offset, int seq, int32_t* tokens, int32_t* targets) const {
  Gather(offset, seq, tokens);
  std::copy(tokens + 1, tokens + seq, targets);
  Gather(offset + seq, 1, targets + seq - 1);
}

uint64_t SampleKey(uint64_t seed, int64_t step, int dp_rank, int micro_batch, int row) {
  uint64_t key = Mix(seed ^ 0x5bd1e995ULL);
  key = Mix(key ^ static_cast<uint64_t>(step));
  key = Mix(key ^ static_cast<uint64_t>(dp_rank));
  key = Mix(key ^ static_cast<uint64_t>(micro_batch));
  return Mix(key ^ static_cast<uint64_t>(row));
}

void TokenDataset::TrainBatch(uint64_t seed, int64_t step, int dp_rank, int micro_batch, int batch,
                              int seq, int32_t* tokens, int32_t* targets) const {
  if (size() < int64_t{seq} + 1)
    throw DataError(description_ + ": fewer tokens than seq_length+1 = " + std::to_string(seq + 1));
  const TokenRange all(this, 0, size(), documents_);
  for (int row = 0; row < batch; ++row) {
    all.SampleWindow(SampleKey(seed, step, dp_rank, micro_batch, row), seq,
                     tokens + int64_t{row} * seq, targets + int64_t{row} * seq);
  }
}

void TokenDataset::EvalBatch(int64_t index, int batch, int seq, int32_t* tokens,
                             int32_t* targets) const {
  if (size() < int64_t{seq} + 1)
    throw DataError(description_ + ": fewer tokens than seq_length+1 = " + std::to_string(seq + 1));
  TokenRange(this, 0, size(), documents_).EvalBatch(index, batch, seq, tokens, targets);
}

TokenRange::TokenRange(const TokenDataset* stream, int64_t begin, int64_t end, int64_t documents)
    : stream_(stream), begin_(begin), end_(end), documents_(documents) {}

void TokenRange::CheckWindow(int seq) const {
  if (!Fits(seq)) {
    throw DataError(stream_->description() + ": a part of " + std::to_string(size()) +
                    " tokens, fewer than seq_length+1 = " + std::to_string(seq + 1));
  }
}

void TokenRange::SampleWindow(uint64_t key, int seq, int32_t* tokens, int32_t* targets) const {
  CheckWindow(seq);
  const int64_t windows = size() - seq;  // window start in [begin, end - seq - 1]
  const int64_t offset = begin_ + static_cast<int64_t>(key % static_cast<uint64_t>(windows));
  stream_->Window(offset, seq, tokens, targets);
}

void TokenRange::EvalBatch(int64_t index, int batch, int seq, int32_t* tokens,
                           int32_t* targets) const {
  CheckWindow(seq);
  const int64_t windows = size() / (seq + 1);
  for (int row = 0; row < batch; ++row) {
    const int64_t window = (index * batch + row) % windows;
    stream_->Window(begin_ + window * (seq + 1), seq, tokens + int64_t{row} * seq,
                    targets + int64_t{row} * seq);
  }
}

}  // namespace bigmac::data
