#ifndef BIGMAC_CORE_DATA_TOKENIZER_H_
#define BIGMAC_CORE_DATA_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/data/tokenizer_manifest.h"

namespace bigmac::data {

// Text <-> token ids, as the data a model was trained on was made. `bigmac generate`, the
// training samples and `data prep` go through this interface only. Implementations: byte-level
// and SentencePiece (Debian's libsentencepiece, behind a dlopen shim: sentencepiece_shim.cc).
// Implementations are immutable and thread-compatible.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // "byte-level", or "sentencepiece (N pieces)".
  virtual std::string name() const = 0;
  virtual uint32_t vocab_size() const = 0;
  virtual std::vector<int32_t> Encode(const std::string& text) const = 0;
  // The text of `tokens`; an id the vocabulary lacks comes out as "<|id|>".
  virtual std::string Decode(const std::vector<int32_t>& tokens) const = 0;
  // How many bytes of text token `id` decodes to (0 for control tokens).
  virtual int TextBytes(int32_t id) const = 0;
};

// BigMac's byte-level shards: one token per byte (ids 0..255), so Decode(Encode(text)) == text
// for any bytes, UTF-8 or not.
std::unique_ptr<Tokenizer> MakeByteTokenizer();

// Loads a SentencePiece model file (ReadTokenizerModel). Throws DataError naming the file.
std::unique_ptr<Tokenizer> MakeSentencePieceTokenizer(const std::string& model_path);
// The same from the model's bytes; `name` is the file they came from, for messages.
std::unique_ptr<Tokenizer> MakeSentencePieceTokenizer(const std::string& model_bytes,
                                                      const std::string& name);

// The tokenizer of the training data in `data_dir` (a model's data.dir): the one its
// tokenizer.json names (docs/data.md), else byte-level. Throws DataError naming the file.
std::unique_ptr<Tokenizer> TokenizerFor(const std::string& data_dir);

// Refuses `data_dir` as the data of a checkpoint trained on tokenizer `recorded` (its
// Manifest.tokenizer; `whose` names it) when data_dir's tokenizer.json names another tokenizer:
// its token ids mean other text. Nothing to compare when either is absent. Throws DataError
// (exit 5) naming both. Resume checks this before the model's shapes, so that data of another
// vocabulary is reported as such and not as another model.
void CheckSameTokenizer(const std::string& recorded, const std::string& data_dir,
                        const std::string& whose);

// The tokenizer a checkpoint was trained on, found and verified: `recorded` is its
// Manifest.tokenizer ("byte/256" needs no file; "sentencepiece/N/<hash>" must be described by
// `data_dir`/tokenizer.json, whose model file has that hash), or "" when its data had no
// tokenizer.json (byte-level then, if `vocab_size` is byte-level's 256). Throws DataError (exit
// 5) naming what it looked for and where, never a guess: ids decoded with another tokenizer are
// garbage.
std::unique_ptr<Tokenizer> RecordedTokenizer(const std::string& recorded,
                                             const std::string& data_dir, int64_t vocab_size,
                                             const std::string& whose);

// `tokens` as "<|464|><|2068|>": how Decode spells an id its tokenizer lacks, for ids no
// tokenizer here can spell (RecordedTokenizer refused).
std::string IdsText(const std::vector<int32_t>& tokens);

// Trains a SentencePiece model (`model_type` "bpe" or "unigram", `vocab_size` pieces) on the
// lines of `inputs` and writes it to <dir>/tokenizer.model. The settings make decoding give back
// the exact text: identity normalization, whitespace kept, byte fallback for anything unseen.
// Throws DataError with SentencePiece's reason.
void TrainSentencePiece(const std::vector<std::string>& inputs, const std::string& dir,
                        int vocab_size, const std::string& model_type);

}  // namespace bigmac::data

#endif  // BIGMAC_CORE_DATA_TOKENIZER_H_
