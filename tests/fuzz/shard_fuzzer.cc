// The token shard reader on arbitrary bytes.
#include "core/data/shard.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = bigmac::fuzz::ScratchDir() + "/train_000.bin";
  bigmac::fuzz::WriteBytes(path, data, size);
  try {
    bigmac::data::ReadShard(path);
  } catch (const bigmac::data::DataError&) {
  }
  return 0;
}
