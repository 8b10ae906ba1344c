// The safetensors reader (ckpt import) on arbitrary bytes.
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = bigmac::fuzz::ScratchDir() + "/model.safetensors";
  bigmac::fuzz::WriteBytes(path, data, size);
  try {
    bigmac::checkpoint::ReadSafetensors(path);
  } catch (const bigmac::checkpoint::CheckpointError&) {
  }
  return 0;
}
