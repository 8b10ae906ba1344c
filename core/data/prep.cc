#include "core/data/prep.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/data/dataset.h"
#include "core/data/error.h"
#include "core/data/shard.h"
#include "core/data/tokenizer.h"
#include "core/data/tokenizer_manifest.h"
#include "core/util/files.h"
#include "core/util/format.h"
#include "core/util/output_file.h"

namespace bigmac::data {
namespace {

namespace fs = std::filesystem;

// The process's umask, read without changing it (umask(2) can only read by setting).
mode_t CurrentUmask() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Umask:", 0) == 0) return static_cast<mode_t>(std::stoul(line.substr(6), 0, 8));
  }
  return 022;
}

// "shards/" and "./shards" as "shards": the form the staging directory's parent is compared in.
fs::path NormalPath(const fs::path& path) {
  fs::path normal = path.lexically_normal();
  if (!normal.has_filename() && normal.has_parent_path()) normal = normal.parent_path();
  return normal;
}

// Where the new shards are written before they go into place: a directory inside `out_dir` when
// it exists (the same filesystem, and new files get the layout the user gave the directory, such
// as Lustre striping), else beside it. Made by mkdtemp, so private until it is used.
fs::path StagingDirectory(const fs::path& given) {
  const fs::path out_dir = NormalPath(given);
  std::error_code error;
  const bool inside = fs::is_directory(out_dir, error);
  const fs::path parent =
      inside ? out_dir : (out_dir.has_parent_path() ? out_dir.parent_path() : fs::path("."));
  if (!inside) fs::create_directories(parent);
  std::string name = (parent / (inside ? std::string(".prep_XXXXXX")
                                       : "." + out_dir.filename().string() + ".prep_XXXXXX"))
                         .string();
  if (mkdtemp(name.data()) == nullptr) {
    throw fs::filesystem_error("cannot create a staging directory for the new shards", parent,
                               std::error_code(errno, std::generic_category()));
  }
  return name;
}

// Puts the staged files in place. A new `out_dir` is the staging directory itself, renamed, with
// the umask's mode instead of mkdtemp's 0700. An existing one is kept (its inode, mode, owner and
// other files): each staged file is renamed over its namesake, then shards of the old corpus that
// the new one does not have are removed, so only this step's shards remain.
void MoveIntoPlace(const fs::path& staging, const fs::path& given) {
  const fs::path out_dir = NormalPath(given);
  std::error_code error;
  if (staging.parent_path() != out_dir) {
    fs::permissions(staging, static_cast<fs::perms>(0777 & ~CurrentUmask()));
    fs::rename(staging, out_dir);
    return;
  }
  std::vector<fs::path> staged;
  for (const auto& entry : fs::directory_iterator(staging)) staged.push_back(entry.path());
  // Shards first, the tokenizer files (which describe them) last.
  std::stable_partition(staged.begin(), staged.end(),
                        [](const fs::path& file) { return IsShardName(file.filename().string()); });
  for (const fs::path& file : staged) fs::rename(file, out_dir / file.filename());
  for (const auto& entry : fs::directory_iterator(out_dir)) {
    const std::string name = entry.path().filename().string();
    if (IsShardName(name) &&
        std::find_if(staged.begin(), staged.end(), [&name](const fs::path& file) {
          return file.filename() == name;
        }) == staged.end()) {
      fs::remove(entry.path());
    }
  }
  fs::remove(staging, error);
}

// One split's shards, written as they fill: <dir>/<split>_NNN.bin.
class ShardWriter {
 public:
  ShardWriter(std::string dir, std::string split, uint32_t vocab, int64_t shard_tokens)
      : dir_(std::move(dir)),
        split_(std::move(split)),
        vocab_(vocab),
        shard_tokens_(shard_tokens) {}
  void Add(uint32_t token) {
    buffer_.push_back(token);
    ++count_;
    if (static_cast<int64_t>(buffer_.size()) == shard_tokens_) Flush();
  }
  void Flush() {
    if (buffer_.empty()) return;
    WriteShard(dir_ + "/" + util::Format("%s_%03d.bin", split_.c_str(), shards_++), vocab_,
               buffer_);
    buffer_.clear();
  }
  int64_t count() const { return count_; }

 private:
  std::string dir_, split_;
  uint32_t vocab_;
  int64_t shard_tokens_;
  std::vector<uint32_t> buffer_;
  int64_t count_ = 0;
  int shards_ = 0;
};

// Calls `line` with each line of `input` (its '\n' kept), read through the checked opener.
template <typename LineFn>
void ForEachLine(const std::string& input, LineFn line) {
  uint64_t size = 0;
  const int fd = OpenDataFile(input, "text file", &size);
  FILE* file = fdopen(fd, "rb");
  if (file == nullptr) {
    close(fd);
    throw DataError(input + ": cannot read the text file: " + util::OsReason(errno));
  }
  char* buffer = nullptr;
  size_t capacity = 0;
  ssize_t length = 0;
  while ((length = getline(&buffer, &capacity, file)) >= 0) line(std::string(buffer, length));
  const bool failed = ferror(file) != 0;
  free(buffer);
  fclose(file);
  if (failed) throw DataError(input + ": cannot read the text file");
}

// The tokenizer of `options`, its model (if any) written into `fresh`, and its manifest.
std::unique_ptr<Tokenizer> MakeTokenizer(const PrepOptions& options, const fs::path& fresh,
                                         TokenizerManifest* manifest) {
  manifest->kind = options.tokenizer;
  if (options.tokenizer == "byte") {
    manifest->vocab_size = 256;
    return MakeByteTokenizer();
  }
  const fs::path model = fresh / kTokenizerModel;
  std::string bytes;
  std::unique_ptr<Tokenizer> tokenizer;
  if (!options.tokenizer_model.empty()) {
    // Loaded from the user's file, so that every message names it, then copied beside the
    // shards from the same bytes.
    bytes = ReadTokenizerModel(options.tokenizer_model);
    tokenizer = MakeSentencePieceTokenizer(bytes, options.tokenizer_model);
    if (std::string problem = util::WriteWholeFile(model.string(), bytes); !problem.empty())
      throw util::OutputError("cannot write the tokenizer model: " + problem);
  } else {
    TrainSentencePiece(options.inputs, fresh.string(), options.vocab_size, options.model_type);
    bytes = ReadTokenizerModel(model.string());
    tokenizer = MakeSentencePieceTokenizer(bytes, model.string());
  }
  manifest->vocab_size = tokenizer->vocab_size();
  manifest->model = kTokenizerModel;
  manifest->model_hash = BytesHash(bytes);
  return tokenizer;
}

}  // namespace

std::string PrepareShards(const PrepOptions& options) {
  for (const std::string& input : options.inputs) {
    if (std::string problem = util::CheckUserFile(input, "text file"); !problem.empty())
      throw DataError(problem);
  }
  const fs::path fresh = StagingDirectory(options.output);
  try {
    TokenizerManifest manifest;
    const std::unique_ptr<Tokenizer> tokenizer = MakeTokenizer(options, fresh, &manifest);
    ShardWriter train(fresh.string(), "train", tokenizer->vocab_size(), options.shard_tokens);
    ShardWriter val(fresh.string(), "val", tokenizer->vocab_size(), options.shard_tokens);
    int64_t position = 0, text_bytes = 0;
    for (const std::string& input : options.inputs) {
      ForEachLine(input, [&](const std::string& line) {
        text_bytes += static_cast<int64_t>(line.size());
        for (const int32_t token : tokenizer->Encode(line)) {
          const bool held_out =
              (position++ / options.block_tokens) % options.val_every == options.val_every - 1;
          if (held_out) manifest.val_bytes += tokenizer->TextBytes(token);
          (held_out ? val : train).Add(static_cast<uint32_t>(token));
        }
      });
    }
    if (train.count() == 0 || val.count() == 0) {
      throw DataError("data prep: " + std::to_string(position) +
                      " tokens of text is too little for a train/validation split (need at least " +
                      std::to_string(int64_t{options.val_every} * options.block_tokens) + ")");
    }
    train.Flush();
    val.Flush();
    manifest.train_tokens = train.count();
    manifest.val_tokens = val.count();
    WriteTokenizerManifest(fresh.string(), manifest);
    MoveIntoPlace(fresh, options.output);
    const std::string kind = options.tokenizer == "byte"
                                 ? std::string("byte-level")
                                 : "sentencepiece" + (options.tokenizer_model.empty()
                                                          ? " " + options.model_type + ", trained"
                                                          : " from " + options.tokenizer_model);
    return util::Format(
        "data prep: %zu files, %lld bytes -> %lld tokens (%s, vocab %u, %.3f bytes/token) -> %s: "
        "train %lld tokens, val %lld tokens (every %dth block of %d)",
        options.inputs.size(), static_cast<long long>(text_bytes), static_cast<long long>(position),
        kind.c_str(), tokenizer->vocab_size(), double(text_bytes) / double(position),
        options.output.c_str(), static_cast<long long>(train.count()),
        static_cast<long long>(val.count()), options.val_every, options.block_tokens);
  } catch (const util::OutputError& error) {
    std::error_code ignored;
    fs::remove_all(fresh, ignored);
    // Name the user's output, not the staging directory the file was being written in.
    std::string message = error.what();
    const std::string staging = fresh.string() + "/";
    for (size_t at; (at = message.find(staging)) != std::string::npos;)
      message.erase(at, staging.size());
    throw util::OutputError("--output " + options.output + ": " + message);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(fresh, ignored);
    throw;
  }
}

}  // namespace bigmac::data
