#include "core/data/shard.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace bigmac::data {
namespace {

void PutU32(char* at, uint32_t value) {
  for (int i = 0; i < 4; ++i) at[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}
void PutU64(char* at, uint64_t value) {
  for (int i = 0; i < 8; ++i) at[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}
uint32_t GetU32(const unsigned char* at) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= uint32_t{at[i]} << (8 * i);
  return value;
}
uint64_t GetU64(const unsigned char* at) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= uint64_t{at[i]} << (8 * i);
  return value;
}

}  // namespace

void WriteShard(const std::string& path, uint32_t vocab_size, const std::vector<uint16_t>& tokens) {
  char header[kShardHeaderBytes] = {};
  std::memcpy(header, kShardMagic, 4);
  PutU32(header + 4, kShardVersion);
  PutU32(header + 8, vocab_size);
  PutU32(header + 12, 2);
  PutU64(header + 16, tokens.size());
  std::vector<char> body(tokens.size() * 2);
  for (size_t i = 0; i < tokens.size(); ++i) {
    body[2 * i] = static_cast<char>(tokens[i] & 0xff);
    body[2 * i + 1] = static_cast<char>(tokens[i] >> 8);
  }
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out.write(header, kShardHeaderBytes);
    out.write(body.data(), static_cast<std::streamsize>(body.size()));
    if (!out.flush()) throw DataError(path + ": cannot write the shard");
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0)
    throw DataError(path + ": cannot rename " + temporary);
}

Shard ReadShard(const std::string& path) {
  std::error_code error;
  if (std::filesystem::exists(path, error) && !std::filesystem::is_regular_file(path, error)) {
    throw DataError(path + ": not a regular file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path + ": cannot open the token shard");
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  if (bytes.size() < kShardHeaderBytes) {
    throw DataError(path + ": " + std::to_string(bytes.size()) + " bytes is shorter than the " +
                    std::to_string(kShardHeaderBytes) +
                    "-byte shard header (truncated, or not a shard)");
  }
  if (std::memcmp(bytes.data(), kShardMagic, 4) != 0) {
    throw DataError(path +
                    ": wrong magic (expected \"BMTK\"); not a BigMac token shard (make one with "
                    "`bigmac data prep`)");
  }
  const uint32_t version = GetU32(&bytes[4]);
  if (version != kShardVersion) {
    throw DataError(path + ": shard version " + std::to_string(version) +
                    " is not supported (this build reads " + std::to_string(kShardVersion) + ")");
  }
  Shard shard;
  shard.path = path;
  shard.vocab_size = GetU32(&bytes[8]);
  const uint32_t width = GetU32(&bytes[12]);
  if (width != 2)
    throw DataError(path + ": " + std::to_string(width) + " bytes per token; only 2 is supported");
  for (int i = 24; i < kShardHeaderBytes; ++i) {
    if (bytes[i] != 0) {
      throw DataError(path + ": header byte " + std::to_string(i) +
                      " is not zero (bytes 24-31 are reserved); not a shard of this version");
    }
  }
  const uint64_t count = GetU64(&bytes[16]);
  // Compared in tokens, so a count near 2^64 cannot wrap around into a plausible byte size.
  const uint64_t present = (bytes.size() - kShardHeaderBytes) / 2;
  if (count != present || (bytes.size() - kShardHeaderBytes) % 2 != 0) {
    const bool short_file = count > present;
    throw DataError(path + ": the header promises " + std::to_string(count) + " tokens" +
                    (count < (uint64_t{1} << 62)
                         ? " (" + std::to_string(kShardHeaderBytes + count * 2) + " bytes)"
                         : "") +
                    " but the file has " + std::to_string(bytes.size()) + " bytes" +
                    (short_file ? " (truncated)" : " (trailing bytes)"));
  }
  shard.tokens.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    const uint16_t token = static_cast<uint16_t>(bytes[kShardHeaderBytes + 2 * i] |
                                                 (bytes[kShardHeaderBytes + 2 * i + 1] << 8));
    if (token >= shard.vocab_size) {
      throw DataError(path + ": token " + std::to_string(token) + " at position " +
                      std::to_string(i) + " is outside the vocabulary of " +
                      std::to_string(shard.vocab_size));
    }
    shard.tokens[i] = token;
  }
  return shard;
}

}  // namespace bigmac::data
