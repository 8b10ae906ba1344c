#ifndef BIGMAC_CORE_DATA_SHARD_H_
#define BIGMAC_CORE_DATA_SHARD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/data/error.h"

namespace bigmac::data {

// A BigMac token shard file (docs/data.md), little-endian:
//   bytes 0-3   magic "BMTK"
//   bytes 4-7   uint32 version (1)
//   bytes 8-11  uint32 vocab_size
//   bytes 12-15 uint32 bytes per token (2, or 4 for a vocabulary over 65536)
//   bytes 16-23 uint64 token count
//   bytes 24-31 reserved, zero
//   then token count tokens of that width, each < vocab_size.
inline constexpr char kShardMagic[4] = {'B', 'M', 'T', 'K'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr int kShardHeaderBytes = 32;

struct Shard {
  std::string path;
  uint32_t vocab_size = 0;
  std::vector<uint32_t> tokens;
};

// Writes atomically (temporary file, then rename), 2 bytes per token when `vocab_size` <= 65536,
// else 4. Throws DataError.
void WriteShard(const std::string& path, uint32_t vocab_size, const std::vector<uint32_t>& tokens);

// Reads and checks a BigMac shard: magic, version, token width, the size the header promises
// (truncation) and every token against the vocabulary. Throws DataError naming the file.
Shard ReadShard(const std::string& path);

}  // namespace bigmac::data

#endif  // BIGMAC_CORE_DATA_SHARD_H_
