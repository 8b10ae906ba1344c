#ifndef BIGMAC_CORE_DATA_DATASET_H_
#define BIGMAC_CORE_DATA_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

namespace bigmac::data {

// All tokens of one split ("train" or "val"): the shards <dir>/<split>_NNN.bin, in name order.
class TokenDataset {
 public:
  // Throws DataError naming the directory or the bad shard.
  TokenDataset(const std::string& dir, const std::string& split);

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  uint32_t vocab_size() const { return vocab_size_; }
  const std::vector<uint16_t>& tokens() const { return tokens_; }
  const std::string& description() const { return description_; }

  // Throws DataError unless the split can serve windows of `seq` + 1 tokens to a model with
  // `model_vocab` token ids: called before training starts, so nothing is written for bad data.
  void CheckFits(int seq, int64_t model_vocab) const;

  // Training batch (batch x seq) for this (seed, step, dp_rank, micro_batch): each row is a
  // window at an offset drawn from a counter-based hash of those numbers and the row, so the
  // batch never depends on the pipeline layout or on what was read before. targets = tokens
  // shifted by one.
  void TrainBatch(uint64_t seed, int64_t step, int dp_rank, int micro_batch, int batch, int seq,
                  int32_t* tokens, int32_t* targets) const;

  // Validation batch `index`: consecutive windows from the start of the split (wrapping).
  void EvalBatch(int64_t index, int batch, int seq, int32_t* tokens, int32_t* targets) const;

 private:
  void Window(int64_t offset, int seq, int32_t* tokens, int32_t* targets) const;
  std::vector<uint16_t> tokens_;
  uint32_t vocab_size_ = 0;
  std::string description_;
  std::string first_shard_;
};

// Whether a file name is a token shard's, or a shard's temporary file: train_*.bin, val_*.bin,
// and those with .tmp after them.
bool IsShardName(const std::string& name);

// The names of the shards in `dir` (none if it is not a directory), sorted.
std::vector<std::string> ShardsIn(const std::string& dir);

// `bigmac data prep`: byte-level tokenisation (token = byte, vocabulary 256) of the input files
// (regular files only), concatenated in order, cut into blocks of `block_tokens`; every
// `val_every`-th block is held out for validation. Writes <out>/train_000.bin... and
// <out>/val_000.bin... into a new directory beside <out>, then swaps it into place in one rename:
// <out>'s old shards (the caller has checked that replacing them is wanted) go in the same step,
// so no reader ever sees shards of two corpora; its other files are kept. Returns a summary
// line. Throws DataError for an input, std::filesystem::filesystem_error for the output.
std::string PrepareByteShards(const std::vector<std::string>& inputs, const std::string& out_dir,
                              int val_every = 20, int block_tokens = 4096,
                              int64_t shard_tokens = int64_t{1} << 24);

}  // namespace bigmac::data

#endif  // BIGMAC_CORE_DATA_DATASET_H_
