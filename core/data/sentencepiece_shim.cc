// libbigmac_sentencepiece.so: the only code that touches Debian's libsentencepiece. Debian builds
// that library with its own copy of protobuf-lite and exports those symbols, which clash with
// the system libprotobuf BigMac links (a crash while the program loads). So tokenizer.cc loads
// this shim with dlopen(RTLD_LOCAL | RTLD_DEEPBIND): SentencePiece binds to its own protobuf,
// and nothing of it enters the program's global symbol scope. The interface is these functions;
// both sides share the process's libstdc++, so they pass std::string and std::vector.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <string>
#include <unordered_map>
#include <vector>

using sentencepiece::SentencePieceProcessor;

extern "C" {

// A model loaded from its bytes, or null with `error` set. BigMac reads the file itself, through
// its checked opener (SentencePiece's own Load would open a fifo and wait forever).
SentencePieceProcessor* bigmac_spm_load(const std::string& bytes, std::string* error) {
  auto* processor = new SentencePieceProcessor();
  if (const auto status = processor->LoadFromSerializedProto(bytes); !status.ok()) {
    *error = status.ToString();
    delete processor;
    return nullptr;
  }
  return processor;
}

void bigmac_spm_free(SentencePieceProcessor* processor) { delete processor; }

int bigmac_spm_piece_size(const SentencePieceProcessor* processor) {
  return processor->GetPieceSize();
}

// The piece of `id`, and whether it is a byte-fallback piece or a control/unknown one.
void bigmac_spm_piece(const SentencePieceProcessor* processor, int id, std::string* piece,
                      bool* is_byte, bool* is_control) {
  *piece = processor->IdToPiece(id);
  *is_byte = processor->IsByte(id);
  *is_control = processor->IsControl(id) || processor->IsUnknown(id);
}

bool bigmac_spm_encode(const SentencePieceProcessor* processor, const std::string& text,
                       std::vector<int>* ids, std::string* error) {
  const auto status = processor->Encode(text, ids);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

bool bigmac_spm_decode(const SentencePieceProcessor* processor, const std::vector<int>& ids,
                       std::string* text, std::string* error) {
  const auto status = processor->Decode(ids, text);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

// SentencePieceTrainer::Train with these settings (names as spm_train's flags).
bool bigmac_spm_train(const std::unordered_map<std::string, std::string>& args,
                      std::string* error) {
  const auto status = sentencepiece::SentencePieceTrainer::Train(args);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

}  // extern "C"
