#ifndef BIGMAC_CORE_DATA_TOKENIZER_H_
#define BIGMAC_CORE_DATA_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/data/tokenizer_manifest.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace bigmac::data {

// Text <-> token ids: byte-level (token = byte, vocabulary 256) or a SentencePiece model
// (Debian's libsentencepiece). Copies share one loaded model; it is read-only after loading.
class Tokenizer {
 public:
  static Tokenizer Byte();
  // Loads a SentencePiece model file. Throws DataError naming the file.
  static Tokenizer SentencePiece(const std::string& model_path);
  // The tokenizer `manifest` in data directory `dir` describes. Throws DataError.
  static Tokenizer FromManifest(const std::string& dir, const TokenizerManifest& manifest);

  bool is_byte() const { return processor_ == nullptr; }
  uint32_t vocab_size() const { return vocab_size_; }
  std::vector<uint32_t> Encode(std::string_view text) const;
  std::string Decode(const std::vector<int32_t>& ids) const;
  // How many bytes of text token `id` decodes to (0 for control tokens).
  int TextBytes(uint32_t id) const { return is_byte() ? 1 : text_bytes_[id]; }

 private:
  std::shared_ptr<sentencepiece::SentencePieceProcessor> processor_;
  std::vector<int> text_bytes_;
  uint32_t vocab_size_ = 256;
};

// Trains a SentencePiece model (`model_type` "bpe" or "unigram", `vocab_size` pieces) on the
// lines of `inputs` and writes it to <dir>/tokenizer.model. The settings make decoding give back
// the exact text: identity normalization, whitespace kept, byte fallback for anything unseen.
// Throws DataError with SentencePiece's reason.
void TrainSentencePiece(const std::vector<std::string>& inputs, const std::string& dir,
                        int vocab_size, const std::string& model_type);

}  // namespace bigmac::data

#endif  // BIGMAC_CORE_DATA_TOKENIZER_H_
