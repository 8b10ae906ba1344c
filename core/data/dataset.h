#ifndef BIGMAC_CORE_DATA_DATASET_H_
#define BIGMAC_CORE_DATA_DATASET_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/data/error.h"
#include "core/data/token_file.h"
#include "core/data/tokenizer_manifest.h"

namespace bigmac::data {

// All tokens of one split: the files in `dir` matching a glob pattern, in name order, read as one
// stream of tokens. Each file may be a BigMac shard, an llm.c token file or a Megatron .bin/.idx
// pair (detected from its magic); every file stays memory-mapped for the dataset's lifetime.
class TokenDataset {
 public:
  // `pattern` is a glob relative to `dir` ("" means "*<split>*.bin": train_000.bin,
  // fineweb_train_000001.bin, corpus_train_text_document.bin). Opens and checks every file, and
  // scans its tokens once (for the vocabulary check). Throws DataError naming the directory or
  // the bad file.
  TokenDataset(const std::string& dir, const std::string& split, const std::string& pattern = "");
  // The files `paths` (not empty), in that order; tokenizer.json is looked for in
  // `tokenizer_dir`. `label` begins the description (a Megatron prefix, a glob).
  TokenDataset(const std::vector<std::string>& paths, const std::string& label,
               const std::string& tokenizer_dir);

  int64_t size() const { return size_; }
  // The vocabulary the files (or tokenizer.json) declare, else the largest token + 1.
  int64_t vocab_size() const { return vocab_size_; }
  // The vocabulary tokenizer.json or the files' headers declare (0: none; vocab_size() is then
  // the largest token + 1) and where it comes from, for messages.
  uint32_t declared_vocab() const { return declared_vocab_; }
  const std::string& vocab_source() const { return vocab_source_; }
  const std::string& description() const { return description_; }
  // The files read, in stream order, and the glob that chose them.
  const std::vector<std::string>& paths() const { return paths_; }
  const std::string& glob() const { return glob_; }
  // tokenizer.json beside the shards, when `bigmac data prep` wrote one.
  const std::optional<TokenizerManifest>& tokenizer() const { return tokenizer_; }

  // The documents of its files (Megatron's), or -1 when a file has none (llm.c, BigMac shards).
  // DocumentStart(d): the stream position of document d's first token (d == documents(): size()).
  int64_t documents() const { return documents_; }
  int64_t DocumentStart(int64_t d) const;

  // Throws DataError unless the split can serve windows of `seq` + 1 tokens to a model with
  // `model_vocab` token ids: called before training starts, so nothing is written for bad data.
  void CheckFits(int seq, int64_t model_vocab) const;

  // Tokens [begin, begin + n) of the stream, as int32 (crossing file boundaries).
  void Gather(int64_t begin, int64_t n, int32_t* out) const;

  // Training batch (batch x seq) for this (seed, step, dp_rank, micro_batch): each row is a
  // window at an offset drawn from a counter-based hash of those numbers and the row, so the
  // batch never depends on the pipeline layout, on what was read before, or on how the tokens
  // are cut into files or which format holds them. targets = tokens shifted by one.
  void TrainBatch(uint64_t seed, int64_t step, int dp_rank, int micro_batch, int batch, int seq,
                  int32_t* tokens, int32_t* targets) const;

  // Validation batch `index`: consecutive windows from the start of the split (wrapping).
  void EvalBatch(int64_t index, int batch, int seq, int32_t* tokens, int32_t* targets) const;

 private:
  friend class TokenRange;
  // Opens and checks `paths` (tokenizer.json from `tokenizer_dir`); sets everything but
  // description_ and glob_.
  void Open(const std::vector<std::string>& paths, const std::string& tokenizer_dir);
  void Window(int64_t offset, int seq, int32_t* tokens, int32_t* targets) const;
  std::vector<TokenFile> files_;
  std::vector<int64_t> first_documents_;  // first_documents_[i]: documents before files_[i]
  int64_t documents_ = -1;
  std::vector<int64_t> starts_;  // starts_[i]: the stream position of files_[i]'s first token
  int64_t size_ = 0;
  int64_t vocab_size_ = 0;       // int64: a largest token of 2^32 - 1 means 2^32, not 0
  uint32_t declared_vocab_ = 0;  // by tokenizer.json or the shards' headers; 0: none
  std::string vocab_source_;     // the file (and position) the vocabulary comes from
  std::optional<TokenizerManifest> tokenizer_;
  std::string description_;
  std::vector<std::string> paths_;
  std::string glob_;
};

// The hash behind a training window's position: a counter-based function of (seed, step,
// dp_rank, micro_batch, row), so a batch never depends on what was read before.
uint64_t SampleKey(uint64_t seed, int64_t step, int dp_rank, int micro_batch, int row);

// A contiguous part [begin, end) of a dataset's stream: one split of it (docs/data.md). Its
// windows never cross its ends, so a training window never reads a validation document. The
// dataset must outlive the range.
class TokenRange {
 public:
  TokenRange() = default;
  // `documents`: how many whole documents it holds, or -1 when it was divided by tokens.
  TokenRange(const TokenDataset* stream, int64_t begin, int64_t end, int64_t documents);

  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }
  int64_t size() const { return end_ - begin_; }
  int64_t documents() const { return documents_; }
  bool empty() const { return stream_ == nullptr || end_ <= begin_; }

  // Whether it holds a window of seq + 1 tokens.
  bool Fits(int seq) const { return size() >= int64_t{seq} + 1; }
  // The window of seq + 1 tokens at a position drawn uniformly from its windows by `key`.
  // Both throw DataError when the range holds no window (BlendedData::CheckFits says it first,
  // naming the split).
  void SampleWindow(uint64_t key, int seq, int32_t* tokens, int32_t* targets) const;
  // Validation batch `index`: consecutive windows from its start (wrapping).
  void EvalBatch(int64_t index, int batch, int seq, int32_t* tokens, int32_t* targets) const;

 private:
  void CheckWindow(int seq) const;
  const TokenDataset* stream_ = nullptr;
  int64_t begin_ = 0, end_ = 0, documents_ = -1;
};

// How a run would use its two splits, as warnings for the start-up log (empty when all is well):
// a file that both globs match (its windows are trained on and also validated on: the validation
// loss is not held out), and validation batches beyond the split (`eval_batches` x `batch`
// windows of seq + 1 tokens; past the split's whole windows they repeat from its start, as
// Megatron repeats its validation data, so a window counts more than once in the loss).
std::vector<std::string> SplitWarnings(const TokenDataset& train, const TokenDataset& val, int seq,
                                       int batch, int eval_batches);

// SplitWarnings' second part alone, for a validation split of `val_tokens` tokens described by
// `val_description`: the warning about windows that repeat, or "" when none do.
std::string EvalRepeatWarning(int64_t val_tokens, const std::string& val_description, int seq,
                              int batch, int eval_batches);

// The paths a glob pattern matches, sorted by name (none when nothing matches).
std::vector<std::string> MatchingPaths(const std::string& pattern);

// Whether a file name is a token shard's, or a shard's temporary file: train_*.bin, val_*.bin,
// and those with .tmp after them.
bool IsShardName(const std::string& name);

// The names of the shards in `dir` (none if it is not a directory), sorted.
std::vector<std::string> ShardsIn(const std::string& dir);

}  // namespace bigmac::data

#endif  // BIGMAC_CORE_DATA_DATASET_H_
