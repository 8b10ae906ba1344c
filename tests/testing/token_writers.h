#ifndef BIGMAC_TESTS_TESTING_TOKEN_WRITERS_H_
#define BIGMAC_TESTS_TESTING_TOKEN_WRITERS_H_

// Token files written byte by byte from the published layouts (llm.c's dev/data/data_common.py,
// Megatron-LM's megatron/core/datasets/indexed_dataset.py, docs/data.md), never by BigMac's
// readers or writers: what the readers are tested against.

#include <cstdint>
#include <string>
#include <vector>

namespace bigmac::testutil {

// Appends `value` as `bytes` little-endian bytes.
void Put(std::string* out, uint64_t value, int bytes);

// Writes `bytes` to `path`, replacing it.
void WriteBytes(const std::string& path, const std::string& bytes);

// llm.c: int32 header[256] = {magic, version, token count, 0...}, then the tokens (uint32 when
// `wide`, else uint16).
std::string LlmcFile(const std::vector<uint32_t>& tokens, bool wide);

// Megatron MMIDIDX: .idx = "MMIDIDX\0\0", u64 version 1, u8 dtype code (8 uint16, 4 int32), u64
// sequence count, u64 document-index count, int32 lengths, int64 byte pointers, int64 document
// indices; .bin = the tokens. `lengths` lists the sequences' lengths (summing to tokens.size());
// each sequence is one document, as preprocess_data.py writes them without sentence splitting.
void WriteMegatron(const std::string& prefix, const std::vector<uint32_t>& tokens,
                   const std::vector<int>& lengths, bool wide);

// BigMac shard (docs/data.md): "BMTK", u32 version 1, u32 vocab, u32 width, u64 count, 8 zero
// bytes, tokens.
std::string BigMacShard(const std::vector<uint32_t>& tokens, uint32_t vocab, int width);

// `n` tokens below `below` from a seeded generator.
std::vector<uint32_t> RandomTokens(size_t n, uint32_t below, uint32_t seed);

}  // namespace bigmac::testutil

#endif  // BIGMAC_TESTS_TESTING_TOKEN_WRITERS_H_
