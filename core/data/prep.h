#ifndef BIGMAC_CORE_DATA_PREP_H_
#define BIGMAC_CORE_DATA_PREP_H_

#include <cstdint>
#include <string>
#include <vector>

namespace bigmac::data {

struct PrepOptions {
  std::vector<std::string> inputs;  // text files (regular files only), concatenated in order
  std::string output;               // the data directory
  int val_every = 20;               // every val_every-th block is held out for validation
  int block_tokens = 4096;
  int64_t shard_tokens = int64_t{1} << 24;
  // "byte" (token = byte, vocabulary 256) or "sentencepiece": with `tokenizer_model`, encode with
  // that model; else train one of `model_type` ("bpe", "unigram") with `vocab_size` pieces on
  // the inputs.
  std::string tokenizer = "byte";
  int vocab_size = 0;
  std::string model_type = "bpe";
  std::string tokenizer_model;
};

// `bigmac data prep`: tokenises the inputs, cuts the token stream into blocks of `block_tokens`
// and holds out every `val_every`-th block for validation. Writes <out>/train_000.bin... and
// <out>/val_000.bin..., tokenizer.json (and tokenizer.model for SentencePiece) into a new
// directory beside <out>, then swaps it into place in one rename: <out>'s old shards (the caller
// has checked that replacing them is wanted) go in the same step, so no reader ever sees shards
// of two corpora; its other files are kept. Returns a summary line. Throws DataError for an input
// or the tokenizer, std::filesystem::filesystem_error for the output.
std::string PrepareShards(const PrepOptions& options);

}  // namespace bigmac::data

#endif  // BIGMAC_CORE_DATA_PREP_H_
