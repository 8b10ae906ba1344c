#include "core/data/dataset.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>

#include "core/data/shard.h"
#include "core/util/files.h"

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

// Replaces `out_dir` by `fresh` in one rename (RENAME_EXCHANGE where the filesystem has it),
// after moving out_dir's files that are not shards into `fresh`; the old shards end in `fresh`,
// which is then removed.
void SwapIntoPlace(const fs::path& fresh, const fs::path& out_dir) {
  std::error_code error;
  if (!fs::exists(out_dir, error)) {
    fs::rename(fresh, out_dir);
    return;
  }
  for (const auto& entry : fs::directory_iterator(out_dir)) {
    if (!IsShardName(entry.path().filename().string()))
      fs::rename(entry.path(), fresh / entry.path().filename());
  }
  if (renameat2(AT_FDCWD, fresh.c_str(), AT_FDCWD, out_dir.c_str(), RENAME_EXCHANGE) != 0) {
    // No exchange on this filesystem: two renames, with no moment where shards mix.
    const fs::path old = fresh.string() + ".old";
    fs::rename(out_dir, old);
    fs::rename(fresh, out_dir);
    fs::remove_all(old);
    return;
  }
  fs::remove_all(fresh);
}

// A new, empty directory beside `out_dir` (the same filesystem, so the swap is a rename).
fs::path FreshSibling(const fs::path& out_dir) {
  const fs::path parent = out_dir.has_parent_path() ? out_dir.parent_path() : fs::path(".");
  fs::create_directories(parent);
  std::string name = (parent / ("." + out_dir.filename().string() + ".prep_XXXXXX")).string();
  if (mkdtemp(name.data()) == nullptr) {
    throw fs::filesystem_error("cannot create a directory beside the output", parent,
                               std::error_code(errno, std::generic_category()));
  }
  return name;
}

}  // namespace

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

TokenDataset::TokenDataset(const std::string& dir, const std::string& split) {
  std::vector<std::string> paths;
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
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(split + "_", 0) == 0 && entry.path().extension() == ".bin")
      paths.push_back(entry.path().string());
  }
  std::sort(paths.begin(), paths.end());
  if (paths.empty()) throw DataError(dir + ": no " + split + "_*.bin shards");
  for (const std::string& path : paths) {
    Shard shard = ReadShard(path);
    if (vocab_size_ != 0 && shard.vocab_size != vocab_size_) {
      throw DataError(path + ": vocabulary " + std::to_string(shard.vocab_size) + " differs from " +
                      std::to_string(vocab_size_) + " in " + paths.front());
    }
    vocab_size_ = shard.vocab_size;
    tokens_.insert(tokens_.end(), shard.tokens.begin(), shard.tokens.end());
  }
  first_shard_ = paths.front();
  description_ = dir + "/" + split + "_*.bin (" + std::to_string(paths.size()) + " shards, " +
                 std::to_string(tokens_.size()) + " tokens)";
}

void TokenDataset::CheckFits(int seq, int64_t model_vocab) const {
  if (size() < int64_t{seq} + 1) {
    throw DataError(description_ + ": fewer tokens than seq_length+1 = " + std::to_string(seq + 1));
  }
  if (int64_t{vocab_size_} > model_vocab) {
    throw DataError(first_shard_ + ": vocabulary " + std::to_string(vocab_size_) +
                    " is larger than model.vocab_size=" + std::to_string(model_vocab) +
                    " (its token ids would index past the embedding)");
  }
}

void TokenDataset::Window(int64_t offset, int seq, int32_t* tokens, int32_t* targets) const {
  for (int i = 0; i < seq; ++i) {
    tokens[i] = tokens_[offset + i];
    targets[i] = tokens_[offset + i + 1];
  }
}

void TokenDataset::TrainBatch(uint64_t seed, int64_t step, int dp_rank, int micro_batch, int batch,
                              int seq, int32_t* tokens, int32_t* targets) const {
  const int64_t windows = size() - seq;  // window start in [0, size - seq - 1]
  if (windows < 1)
    throw DataError(description_ + ": fewer tokens than seq_length+1 = " + std::to_string(seq + 1));
  for (int row = 0; row < batch; ++row) {
    uint64_t key = Mix(seed ^ 0x5bd1e995ULL);
    key = Mix(key ^ static_cast<uint64_t>(step));
    key = Mix(key ^ static_cast<uint64_t>(dp_rank));
    key = Mix(key ^ static_cast<uint64_t>(micro_batch));
    key = Mix(key ^ static_cast<uint64_t>(row));
    const int64_t offset = static_cast<int64_t>(key % static_cast<uint64_t>(windows));
    Window(offset, seq, tokens + int64_t{row} * seq, targets + int64_t{row} * seq);
  }
}

void TokenDataset::EvalBatch(int64_t index, int batch, int seq, int32_t* tokens,
                             int32_t* targets) const {
  const int64_t windows = size() / (seq + 1);
  if (windows < 1)
    throw DataError(description_ + ": fewer tokens than seq_length+1 = " + std::to_string(seq + 1));
  for (int row = 0; row < batch; ++row) {
    const int64_t window = (index * batch + row) % windows;
    Window(window * (seq + 1), seq, tokens + int64_t{row} * seq, targets + int64_t{row} * seq);
  }
}

std::string PrepareByteShards(const std::vector<std::string>& inputs, const std::string& out_dir,
                              int val_every, int block_tokens, int64_t shard_tokens) {
  std::vector<uint16_t> train;
  std::vector<uint16_t> val;
  int64_t block = 0;
  int64_t in_block = 0;
  int64_t total = 0;
  for (const std::string& input : inputs) {
    if (std::string problem = util::CheckUserFile(input, "text file"); !problem.empty())
      throw DataError(problem);
    std::ifstream in(input, std::ios::binary);
    if (!in) throw DataError(input + ": cannot open the text file");
    char ch;
    while (in.get(ch)) {
      (block % val_every == val_every - 1 ? val : train).push_back(static_cast<unsigned char>(ch));
      if (++in_block == block_tokens) {
        in_block = 0;
        ++block;
      }
      ++total;
    }
  }
  if (train.empty() || val.empty()) {
    throw DataError("data prep: " + std::to_string(total) +
                    " bytes of text is too little for a train/validation split (need at least " +
                    std::to_string(int64_t{val_every} * block_tokens) + ")");
  }
  const fs::path fresh = FreshSibling(out_dir);
  auto write = [&](const std::string& split, const std::vector<uint16_t>& tokens) {
    int shard = 0;
    for (int64_t start = 0; start < static_cast<int64_t>(tokens.size());
         start += shard_tokens, ++shard) {
      const int64_t end = std::min<int64_t>(tokens.size(), start + shard_tokens);
      char name[32];
      std::snprintf(name, sizeof(name), "/%s_%03d.bin", split.c_str(), shard);
      WriteShard(fresh.string() + name, 256,
                 std::vector<uint16_t>(tokens.begin() + start, tokens.begin() + end));
    }
  };
  try {
    write("train", train);
    write("val", val);
    SwapIntoPlace(fresh, out_dir);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(fresh, ignored);
    throw;
  }
  return "data prep: " + std::to_string(inputs.size()) + " files, " + std::to_string(total) +
         " tokens (byte-level, vocab 256) -> " + out_dir + ": train " +
         std::to_string(train.size()) + " tokens, val " + std::to_string(val.size()) +
         " tokens (every " + std::to_string(val_every) + "th block of " +
         std::to_string(block_tokens) + ")";
}

}  // namespace bigmac::data
