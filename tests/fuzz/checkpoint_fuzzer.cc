// The checkpoint reader on a manifest and a layer file together: input = 4-byte little-endian
// length L, L bytes of manifest.pb, the rest block_0000.bin (seed: the real pair).
#include <cstring>

#include "tests/fuzz/checkpoint_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static bigmac::fuzz::CheckpointTarget target;
  if (size < 4) return 0;
  uint32_t length = 0;
  std::memcpy(&length, data, 4);
  if (length > size - 4) length = static_cast<uint32_t>(size - 4);
  bigmac::fuzz::WriteBytes(target.step_dir() + "/manifest.pb", data + 4, length);
  bigmac::fuzz::WriteBytes(target.step_dir() + "/block_0000.bin", data + 4 + length,
                           size - 4 - length);
  target.Read();
  return 0;
}
