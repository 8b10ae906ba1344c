#include "tests/testing/token_writers.h"

#include <fstream>
#include <random>

namespace bigmac::testutil {

void Put(std::string* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::string LlmcFile(const std::vector<uint32_t>& tokens, bool wide) {
  std::string out;
  Put(&out, wide ? 20240801 : 20240520, 4);
  Put(&out, wide ? 7 : 1, 4);
  Put(&out, tokens.size(), 4);
  out.resize(1024, '\0');
  for (uint32_t token : tokens) Put(&out, token, wide ? 4 : 2);
  return out;
}

void WriteMegatron(const std::string& prefix, const std::vector<uint32_t>& tokens,
                   const std::vector<int>& lengths, bool wide) {
  std::string bin;
  for (uint32_t token : tokens) Put(&bin, token, wide ? 4 : 2);
  std::string idx("MMIDIDX\0\0", 9);
  Put(&idx, 1, 8);
  Put(&idx, wide ? 4 : 8, 1);  // int32 : uint16
  Put(&idx, lengths.size(), 8);
  Put(&idx, lengths.size() + 1, 8);
  for (int length : lengths) Put(&idx, length, 4);
  uint64_t pointer = 0;
  for (int length : lengths) {
    Put(&idx, pointer, 8);
    pointer += uint64_t(length) * (wide ? 4 : 2);
  }
  for (size_t d = 0; d <= lengths.size(); ++d) Put(&idx, d, 8);
  WriteBytes(prefix + ".bin", bin);
  WriteBytes(prefix + ".idx", idx);
}

std::string BigMacShard(const std::vector<uint32_t>& tokens, uint32_t vocab, int width) {
  std::string out = "BMTK";
  Put(&out, 1, 4);
  Put(&out, vocab, 4);
  Put(&out, width, 4);
  Put(&out, tokens.size(), 8);
  Put(&out, 0, 8);
  for (uint32_t token : tokens) Put(&out, token, width);
  return out;
}

std::vector<uint32_t> RandomTokens(size_t n, uint32_t below, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> tokens(n);
  for (uint32_t& t : tokens) t = rng() % below;
  return tokens;
}

}  // namespace bigmac::testutil
