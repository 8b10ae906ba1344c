#ifndef BIGMAC_TESTS_FUZZ_FUZZ_UTIL_H_
#define BIGMAC_TESTS_FUZZ_FUZZ_UTIL_H_

// Shared by the fuzz targets: each writes the input to a file and calls the real file reader,
// which must either accept it or throw its own error type (ConfigError, DataError,
// CheckpointError). Anything else (a crash, a sanitizer report, std::bad_alloc from a size field
// trusted without a check, any other exception) is a bug: it escapes and aborts the run.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

namespace bigmac::fuzz {

// A directory of this process's own (under TMPDIR), created on first use.
inline const std::string& ScratchDir() {
  static const std::string dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/bigmac_fuzz_XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    return pattern;
  }();
  return dir;
}

inline void WriteBytes(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

// The runfiles or source path of tests/fuzz/`relative` (replay tests run under Bazel; the
// libFuzzer binaries from launch/fuzz.sh run in the repository root).
inline std::string FuzzDataPath(const std::string& relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir && workspace) {
    return std::string(srcdir) + "/" + workspace + "/tests/fuzz/" + relative;
  }
  const char* root = std::getenv("BIGMAC_FUZZ_DATA");
  return std::string(root ? root : "tests/fuzz") + "/" + relative;
}

}  // namespace bigmac::fuzz

#endif  // BIGMAC_TESTS_FUZZ_FUZZ_UTIL_H_
