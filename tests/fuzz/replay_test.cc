// Runs a fuzz target over its committed seed corpus (tests/fuzz/corpus/<target>/) with the
// regular build: the inputs libFuzzer starts from, and every crash it ever found once fixed, stay
// in `bazel test`. The libFuzzer builds are in launch/fuzz.sh.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

TEST(FuzzReplay, EverySeedIsAcceptedOrRefusedWithItsOwnError) {
  namespace fs = std::filesystem;
  const std::string dir = bigmac::fuzz::FuzzDataPath(std::string("corpus/") + FUZZ_TARGET);
  int inputs = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    SCOPED_TRACE(entry.path().string());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    // Every prefix too: truncation is the commonest damage.
    for (size_t cut = 0; cut < bytes.size(); cut += 1 + bytes.size() / 64) {
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), cut);
    }
    ++inputs;
  }
  EXPECT_GT(inputs, 0) << "no seeds in " << dir;
}

}  // namespace
