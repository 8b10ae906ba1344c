#include "core/data/shard.h"

#include <cstdio>
#include <cstring>
#include <fstream>

#include "core/data/token_file.h"
#include "core/util/output_file.h"

namespace bigmac::data {
namespace {

void PutLittleEndian(char* at, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) at[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

}  // namespace

void WriteShard(const std::string& path, uint32_t vocab_size, const std::vector<uint32_t>& tokens) {
  const int width = vocab_size <= 65536 ? 2 : 4;
  char header[kShardHeaderBytes] = {};
  std::memcpy(header, kShardMagic, 4);
  PutLittleEndian(header + 4, kShardVersion, 4);
  PutLittleEndian(header + 8, vocab_size, 4);
  PutLittleEndian(header + 12, width, 4);
  PutLittleEndian(header + 16, tokens.size(), 8);
  std::vector<char> body(tokens.size() * width);
  for (size_t i = 0; i < tokens.size(); ++i) PutLittleEndian(&body[i * width], tokens[i], width);
  std::string problem;
  std::unique_ptr<util::OutputFile> out = util::OutputFile::Open(path, &problem);
  if (out) {
    out->Write(std::string_view(header, kShardHeaderBytes));
    out->Write(std::string_view(body.data(), body.size()));
    problem = out->Commit();
  }
  if (!problem.empty()) throw util::OutputError("cannot write the shard: " + problem);
}

Shard ReadShard(const std::string& path) {
  const TokenFile file(path);
  if (file.format() != TokenFormat::kBigMac) {
    throw DataError(path + ": wrong magic (expected \"BMTK\"); a " +
                    TokenFormatName(file.format()) +
                    " token file, not a BigMac shard (make one with `bigmac data prep`)");
  }
  Shard shard;
  shard.path = path;
  shard.vocab_size = file.declared_vocab();
  shard.tokens.resize(file.size());
  for (int64_t i = 0; i < file.size(); ++i) {
    const uint32_t token = file.at(i);
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
