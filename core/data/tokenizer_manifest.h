#ifndef BIGMAC_CORE_DATA_TOKENIZER_MANIFEST_H_
#define BIGMAC_CORE_DATA_TOKENIZER_MANIFEST_H_

#include <cstdint>
#include <optional>
#include <string>

namespace bigmac::data {

// <data dir>/tokenizer.json, written by `bigmac data prep` beside the shards: which tokenizer
// made them, so that a checkpoint trained on one vocabulary refuses data of another, and so
// that tools can turn token ids back into text (docs/data.md).
inline constexpr char kTokenizerManifest[] = "tokenizer.json";
// The SentencePiece model beside the shards.
inline constexpr char kTokenizerModel[] = "tokenizer.model";
// The largest vocabulary a tokenizer manifest may state: model.vocab_size is an int32.
inline constexpr int64_t kMaxTokenizerVocab = 2147483647;

struct TokenizerManifest {
  std::string kind;  // "byte" or "sentencepiece"
  uint32_t vocab_size = 0;
  std::string model;       // sentencepiece: the model file's name in the data directory
  std::string model_hash;  // sentencepiece: FNV-1a 64 of the model file, 16 hex digits
  std::string model_path;  // sentencepiece, when read: the model file, resolved inside the dir
  // The validation split's tokens and the bytes of text they decode to, for bits per byte:
  // bits/byte = loss (nats/token) / ln 2 * val_tokens / val_bytes.
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  int64_t val_bytes = 0;

  // "byte/256" or "sentencepiece/8000/<model_hash>": equal ids mean the same token ids.
  std::string Id() const;
};

// The largest tokenizer.json and SentencePiece model BigMac reads (checked before reading: a
// manifest is a few hundred bytes; large SentencePiece models are a few MiB).
inline constexpr uint64_t kMaxTokenizerManifestBytes = uint64_t{1} << 20;
inline constexpr uint64_t kMaxTokenizerModelBytes = uint64_t{256} << 20;

// FNV-1a 64 of `bytes` as 16 hex digits.
std::string BytesHash(const std::string& bytes);

// The bytes of the SentencePiece model at `path`, read through the checked opener (a regular
// file of at most kMaxTokenizerModelBytes). Throws DataError naming `path`.
std::string ReadTokenizerModel(const std::string& path);

// Writes <dir>/tokenizer.json. Throws DataError.
void WriteTokenizerManifest(const std::string& dir, const TokenizerManifest& manifest);

// Reads <dir>/tokenizer.json, or nothing when there is none (llm.c or Megatron data, older
// shards). Checks that a SentencePiece model it names is inside `dir` once resolved
// (util::ResolveInside: no `..` or symbolic link leads out) and has its hash, and sets
// `model_path` to it. Throws DataError naming the file and the problem.
std::optional<TokenizerManifest> ReadTokenizerManifest(const std::string& dir);

}  // namespace bigmac::data

#endif  // BIGMAC_CORE_DATA_TOKENIZER_MANIFEST_H_
