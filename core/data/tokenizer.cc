#include "core/data/tokenizer.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <limits>
#include <unordered_map>

#include "core/data/error.h"
#include "core/util/files.h"
#include "core/util/format.h"

namespace sentencepiece {
class SentencePieceProcessor {};  // opaque here: only libbigmac_sentencepiece.so looks inside
}  // namespace sentencepiece

namespace bigmac::data {
namespace {

// How an id a tokenizer lacks is spelled in text: "<|300|>".
std::string IdText(int32_t token) { return "<|" + std::to_string(token) + "|>"; }

using Processor = sentencepiece::SentencePieceProcessor;
using Args = std::unordered_map<std::string, std::string>;

constexpr char kShimName[] = "libbigmac_sentencepiece.so";

// The functions of libbigmac_sentencepiece.so (sentencepiece_shim.cc explains why SentencePiece
// lives behind dlopen).
struct Shim {
  Processor* (*load)(const std::string&, std::string*);
  void (*free)(Processor*);
  int (*piece_size)(const Processor*);
  void (*piece)(const Processor*, int, std::string*, bool*, bool*);
  bool (*encode)(const Processor*, const std::string&, std::vector<int>*, std::string*);
  bool (*decode)(const Processor*, const std::vector<int>&, std::string*, std::string*);
  bool (*train)(const Args&, std::string*);
};

// Where the shim is: beside the program (bundles), or where Bazel builds it (bazel-bin/bigmac,
// bazel-bin/tests/...).
std::vector<std::string> ShimCandidates() {
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::canonical("/proc/self/exe", error);
  const std::filesystem::path dir = exe.parent_path();
  return {(dir / kShimName).string(), (dir / "../lib" / kShimName).string(),
          (dir / "core/data" / kShimName).string(), (dir / "../core/data" / kShimName).string()};
}

const Shim& LoadShim() {
  static const Shim shim = [] {
    void* library = nullptr;
    std::string tried;
    for (const std::string& path : ShimCandidates()) {
      std::error_code error;
      if (!std::filesystem::exists(path, error)) continue;
      library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (library != nullptr) break;
      tried += std::string("; ") + dlerror();
    }
    if (library == nullptr) {
      throw DataError(std::string("SentencePiece: cannot load ") + kShimName +
                      " (looked beside the program and in its build tree" + tried + ")");
    }
    auto symbol = [library](const char* name) {
      void* at = dlsym(library, name);
      if (at == nullptr) throw DataError(std::string(kShimName) + ": no symbol " + name);
      return at;
    };
    Shim loaded;
    loaded.load = reinterpret_cast<decltype(loaded.load)>(symbol("bigmac_spm_load"));
    loaded.free = reinterpret_cast<decltype(loaded.free)>(symbol("bigmac_spm_free"));
    loaded.piece_size =
        reinterpret_cast<decltype(loaded.piece_size)>(symbol("bigmac_spm_piece_size"));
    loaded.piece = reinterpret_cast<decltype(loaded.piece)>(symbol("bigmac_spm_piece"));
    loaded.encode = reinterpret_cast<decltype(loaded.encode)>(symbol("bigmac_spm_encode"));
    loaded.decode = reinterpret_cast<decltype(loaded.decode)>(symbol("bigmac_spm_decode"));
    loaded.train = reinterpret_cast<decltype(loaded.train)>(symbol("bigmac_spm_train"));
    return loaded;  // the library stays loaded for the process
  }();
  return shim;
}

// SentencePiece's reason without its source location: "Internal: ./src/x.cc(428)
// [!sentences_.empty()] Vocabulary size too high" -> "Vocabulary size too high"; `otherwise` when
// only the failed assertion is left (its text means nothing to a user).
std::string SentencePieceReason(const std::string& status, const std::string& otherwise) {
  std::string reason = status;
  if (const size_t close = reason.find(") ["); close != std::string::npos) {
    const size_t end = reason.find("] ", close);
    reason = end == std::string::npos ? "" : reason.substr(end + 2);
  }
  while (!reason.empty() && std::isspace(static_cast<unsigned char>(reason.back())))
    reason.pop_back();
  return reason.empty() ? otherwise : reason;
}

// SentencePiece writes a space as U+2581 (3 bytes in UTF-8) inside its pieces.
constexpr std::string_view kSpaceMark = "\xe2\x96\x81";

int PieceTextBytes(const std::string& piece, bool is_byte, bool is_control) {
  if (is_byte) return 1;
  if (is_control) return 0;
  int bytes = 0;
  for (size_t i = 0; i < piece.size(); ++bytes)
    i += piece.compare(i, kSpaceMark.size(), kSpaceMark) == 0 ? kSpaceMark.size() : 1;
  return bytes;
}

class ByteTokenizer : public Tokenizer {
 public:
  std::string name() const override { return "byte-level"; }
  uint32_t vocab_size() const override { return 256; }
  std::vector<int32_t> Encode(const std::string& text) const override {
    std::vector<int32_t> tokens(text.size());
    for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
    return tokens;
  }
  std::string Decode(const std::vector<int32_t>& tokens) const override {
    std::string text;
    text.reserve(tokens.size());
    for (const int32_t token : tokens) {
      if (token >= 0 && token < 256) {
        text.push_back(static_cast<char>(token));
      } else {
        text += IdText(token);
      }
    }
    return text;
  }
  int TextBytes(int32_t /*id*/) const override { return 1; }
};

class SentencePieceTokenizer : public Tokenizer {
 public:
  // `model_bytes`: the model file's contents; `name`: that file, for messages.
  SentencePieceTokenizer(const std::string& model_bytes, const std::string& name) {
    const Shim& shim = LoadShim();
    std::string error;
    Processor* loaded = shim.load(model_bytes, &error);
    if (loaded == nullptr) {
      throw DataError(name + ": not a SentencePiece model: " +
                      SentencePieceReason(error, "it does not parse as one (a ModelProto)"));
    }
    processor_ = std::shared_ptr<Processor>(loaded, shim.free);
    text_bytes_.resize(shim.piece_size(loaded));
    for (size_t id = 0; id < text_bytes_.size(); ++id) {
      std::string piece;
      bool is_byte = false, is_control = false;
      shim.piece(loaded, static_cast<int>(id), &piece, &is_byte, &is_control);
      text_bytes_[id] = PieceTextBytes(piece, is_byte, is_control);
    }
  }
  std::string name() const override {
    return "sentencepiece (" + std::to_string(vocab_size()) + " pieces)";
  }
  uint32_t vocab_size() const override { return static_cast<uint32_t>(text_bytes_.size()); }
  std::vector<int32_t> Encode(const std::string& text) const override {
    std::vector<int> ids;
    std::string error;
    if (!LoadShim().encode(processor_.get(), text, &ids, &error))
      throw DataError("SentencePiece cannot encode the text: " + error);
    return std::vector<int32_t>(ids.begin(), ids.end());
  }
  std::string Decode(const std::vector<int32_t>& tokens) const override {
    std::string text;
    std::vector<int> run;  // ids the model has, decoded together
    auto flush = [&] {
      std::string piece, error;
      if (!run.empty() && !LoadShim().decode(processor_.get(), run, &piece, &error))
        throw DataError("SentencePiece cannot decode the ids: " + error);
      text += piece;
      run.clear();
    };
    for (const int32_t token : tokens) {
      if (token >= 0 && token < static_cast<int32_t>(vocab_size())) {
        run.push_back(token);
      } else {
        flush();
        text += IdText(token);
      }
    }
    flush();
    return text;
  }
  int TextBytes(int32_t id) const override { return text_bytes_[id]; }

 private:
  std::shared_ptr<Processor> processor_;
  std::vector<int> text_bytes_;
};

// Whether any input holds a byte other than a line break: SentencePiece's sentences are the
// non-empty lines. Reads only until the first such byte (the first line of any real text).
bool AnyText(const std::vector<std::string>& inputs) {
  for (const std::string& path : inputs) {
    uint64_t size = 0;
    const int fd = OpenDataFile(path, "text file", &size);
    char buffer[65536];
    ssize_t n = 0;
    bool text = false;
    while (!text && (n = read(fd, buffer, sizeof(buffer))) > 0) {
      text = std::find_if(buffer, buffer + n, [](char c) { return c != '\n' && c != '\r'; }) !=
             buffer + n;
    }
    close(fd);
    if (text) return true;
  }
  return false;
}

}  // namespace

std::unique_ptr<Tokenizer> MakeByteTokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> MakeSentencePieceTokenizer(const std::string& model_path) {
  return MakeSentencePieceTokenizer(ReadTokenizerModel(model_path), model_path);
}

std::unique_ptr<Tokenizer> MakeSentencePieceTokenizer(const std::string& model_bytes,
                                                      const std::string& name) {
  return std::make_unique<SentencePieceTokenizer>(model_bytes, name);
}

std::unique_ptr<Tokenizer> TokenizerFor(const std::string& data_dir) {
  const std::optional<TokenizerManifest> manifest = ReadTokenizerManifest(data_dir);
  if (!manifest || manifest->kind == "byte") return MakeByteTokenizer();
  const std::string& model = manifest->model_path;
  std::unique_ptr<Tokenizer> tokenizer = MakeSentencePieceTokenizer(model);
  if (tokenizer->vocab_size() != manifest->vocab_size) {
    throw DataError(model + ": " + std::to_string(tokenizer->vocab_size()) + " pieces, but " +
                    kTokenizerManifest + " says " + std::to_string(manifest->vocab_size));
  }
  return tokenizer;
}

void CheckSameTokenizer(const std::string& recorded, const std::string& data_dir,
                        const std::string& whose) {
  const std::optional<TokenizerManifest> manifest = ReadTokenizerManifest(data_dir);
  if (recorded.empty() || !manifest || manifest->Id() == recorded) return;
  throw DataError(data_dir + "/" + kTokenizerManifest + ": tokenizer " + manifest->Id() + ", but " +
                  whose + " was trained on tokenizer " + recorded +
                  " (its token ids mean other text)");
}

std::unique_ptr<Tokenizer> RecordedTokenizer(const std::string& recorded,
                                             const std::string& data_dir, int64_t vocab_size,
                                             const std::string& whose) {
  const TokenizerManifest byte_level{"byte", 256};
  if (recorded.empty()) {
    // Data without tokenizer.json: BigMac's byte-level shards before it existed, or another
    // trainer's ids, which no tokenizer here can spell.
    if (vocab_size == byte_level.vocab_size) return MakeByteTokenizer();
    throw DataError(whose + " records no tokenizer (its data had no " + kTokenizerManifest +
                    ") and its model.vocab_size=" + std::to_string(vocab_size) +
                    " is not byte-level's 256: its token ids cannot be turned into text");
  }
  if (recorded == byte_level.Id()) return MakeByteTokenizer();
  if (!ReadTokenizerManifest(data_dir)) {
    throw DataError(whose + " was trained on tokenizer " + recorded + ", which " + data_dir + "/" +
                    kTokenizerManifest +
                    " should describe, but there is none: pass --data-dir "
                    "with the directory that holds the training data's " +
                    kTokenizerManifest + " and " + kTokenizerModel);
  }
  CheckSameTokenizer(recorded, data_dir, whose);
  return TokenizerFor(data_dir);
}

std::string IdsText(const std::vector<int32_t>& tokens) {
  std::string text;
  for (const int32_t token : tokens) text += IdText(token);
  return text;
}

void TrainSentencePiece(const std::vector<std::string>& inputs, const std::string& dir,
                        int vocab_size, const std::string& model_type) {
  // SentencePiece's answer to no text is an assertion ("[!sentences_.empty()]").
  if (!AnyText(inputs)) {
    throw DataError("data prep: " + util::Join(inputs, ", ") +
                    ": no text (empty, or only line breaks): a SentencePiece model cannot be "
                    "trained on nothing");
  }
  std::string input;
  for (const std::string& path : inputs) {
    if (path.find(',') != std::string::npos) {
      throw DataError(path +
                      ": SentencePiece takes its inputs as a comma-separated list; rename it");
    }
    input += (input.empty() ? "" : ",") + path;
  }
  const std::string prefix = dir + "/tokenizer";  // SentencePiece adds ".model"
  std::string error;
  if (!LoadShim().train({{"input", input},
                         {"model_prefix", prefix},
                         {"model_type", model_type},
                         {"vocab_size", std::to_string(vocab_size)},
                         {"character_coverage", "1.0"},
                         {"byte_fallback", "true"},
                         {"normalization_rule_name", "identity"},
                         {"remove_extra_whitespaces", "false"},
                         {"add_dummy_prefix", "false"},
                         {"split_digits", "true"},
                         {"input_sentence_size", "2000000"},
                         {"shuffle_input_sentence", "true"},
                         {"minloglevel", "1"}},
                        &error)) {
    throw DataError("SentencePiece training on " + util::Join(inputs, ", ") +
                    " failed: " + SentencePieceReason(error, "no reason given"));
  }
  std::error_code ignored;
  std::filesystem::remove(prefix + ".vocab", ignored);  // the model file holds the pieces too
}

}  // namespace bigmac::data
