#ifndef BIGMAC_CORE_DATA_SHARD_H_
#define BIGMAC_CORE_DATA_SHARD_H_

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace bigmac::data {

// A token shard file (docs/data.md), little-endian:
//   bytes 0-3   magic "BMTK"
//   bytes 4-7   uint32 version (1)
//   bytes 8-11  uint32 vocab_size
//   bytes 12-15 uint32 bytes per token (2)
//   bytes 16-23 uint64 token count
//   bytes 24-31 reserved, zero
//   then token count uint16 tokens, each < vocab_size.
inline constexpr char kShardMagic[4] = {'B', 'M', 'T', 'K'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr int kShardHeaderBytes = 32;

// A data file that cannot be used; the message names the file and the problem.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Shard {
  std::string path;
  uint32_t vocab_size = 0;
  std::vector<uint16_t> tokens;
};

// Writes atomically (temporary file, then rename). Throws DataError.
void WriteShard(const std::string& path, uint32_t vocab_size, const std::vector<uint16_t>& tokens);

// Reads and checks a shard: magic, version, token width, the size the header promises (truncation)
// and every token against the vocabulary. Throws DataError naming the file.
Shard ReadShard(const std::string& path);

}  // namespace bigmac::data

#endif  // BIGMAC_CORE_DATA_SHARD_H_
