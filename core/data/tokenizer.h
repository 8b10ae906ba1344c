#ifndef BIGMAC_CORE_DATA_TOKENIZER_H_
#define BIGMAC_CORE_DATA_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace bigmac::data {

// Text <-> token ids, as the data a model was trained on was made. `bigmac generate` and the
// training samples encode the prompt and decode what the model writes through this interface
// only, so a new vocabulary (SentencePiece) plugs in as one more implementation returned by
// TokenizerFor. Implementations are immutable and thread-compatible.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // "byte-level", or the vocabulary's own name.
  virtual std::string name() const = 0;
  virtual std::vector<int32_t> Encode(const std::string& text) const = 0;
  // The text of `tokens`; an id the vocabulary lacks comes out as "<|id|>".
  virtual std::string Decode(const std::vector<int32_t>& tokens) const = 0;
};

// BigMac's own shards: one token per byte (ids 0..255), so Decode(Encode(text)) == text for any
// bytes, UTF-8 or not.
std::unique_ptr<Tokenizer> MakeByteTokenizer();

// The tokenizer of the training data in `data_dir` (a model's data.dir). Today every format BigMac
// trains on is byte-level; a vocabulary recorded beside the shards (SentencePiece) is chosen here.
std::unique_ptr<Tokenizer> TokenizerFor(const std::string& data_dir);

}  // namespace bigmac::data

#endif  // BIGMAC_CORE_DATA_TOKENIZER_H_
