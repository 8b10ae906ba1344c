// The config loader and the start-up checks on arbitrary bytes: YAML when the first byte is even,
// text proto when odd (the byte is dropped), resolved against world sizes 1 to 8.
#include "core/config/errors.h"
#include "core/config/loader.h"
#include "core/config/resolve.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool yaml = data[0] % 2 == 0;
  const std::string path =
      bigmac::fuzz::ScratchDir() + (yaml ? "/config.yaml" : "/config.textproto");
  bigmac::fuzz::WriteBytes(path, data + 1, size - 1);
  try {
    bigmac::config::LoadedConfig loaded = bigmac::config::LoadConfig(path, {});
    bigmac::config::Resolve(std::move(loaded), 1 + data[0] % 8, "fuzz");
  } catch (const bigmac::config::ConfigError&) {
  }
  return 0;
}
