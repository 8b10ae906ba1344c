// The manifest reader: arbitrary bytes as manifest.pb beside real layer files; the sizes,
// offsets and checksums it claims must be checked against the files before anything is read.
#include "tests/fuzz/checkpoint_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static bigmac::fuzz::CheckpointTarget target;
  bigmac::fuzz::WriteBytes(target.step_dir() + "/manifest.pb", data, size);
  target.Read();
  return 0;
}
