// The token file readers on arbitrary bytes: a BigMac shard, or whatever format the magic names
// (llm.c), read through to the last token.
#include "core/data/shard.h"
#include "core/data/token_file.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = bigmac::fuzz::ScratchDir() + "/train_000.bin";
  bigmac::fuzz::WriteBytes(path, data, size);
  try {
    bigmac::data::ReadShard(path);
  } catch (const bigmac::data::DataError&) {
  }
  try {
    bigmac::data::TokenFile(path).LargestToken();
  } catch (const bigmac::data::DataError&) {
  }
  return 0;
}
