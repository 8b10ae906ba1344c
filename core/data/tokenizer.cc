#include "core/data/tokenizer.h"

namespace bigmac::data {
namespace {

class ByteTokenizer : public Tokenizer {
 public:
  std::string name() const override { return "byte-level"; }

  std::vector<int32_t> Encode(const std::string& text) const override {
    std::vector<int32_t> tokens;
    tokens.reserve(text.size());
    for (const char c : text) tokens.push_back(static_cast<unsigned char>(c));
    return tokens;
  }

  std::string Decode(const std::vector<int32_t>& tokens) const override {
    std::string text;
    text.reserve(tokens.size());
    for (const int32_t token : tokens) {
      if (token >= 0 && token < 256) {
        text.push_back(static_cast<char>(token));
      } else {
        text += "<|" + std::to_string(token) + "|>";
      }
    }
    return text;
  }
};

}  // namespace

std::unique_ptr<Tokenizer> MakeByteTokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> TokenizerFor(const std::string& /*data_dir*/) {
  return MakeByteTokenizer();
}

}  // namespace bigmac::data
