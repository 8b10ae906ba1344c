#ifndef BIGMAC_CORE_CHECKPOINT_CRC32_H_
#define BIGMAC_CORE_CHECKPOINT_CRC32_H_

#include <cstddef>
#include <cstdint>

namespace bigmac::checkpoint {

// CRC-32 (IEEE 802.3, as zlib and gzip): Crc32(data) == Crc32Update(0, data).
uint32_t Crc32Update(uint32_t crc, const void* data, size_t size);
inline uint32_t Crc32(const void* data, size_t size) { return Crc32Update(0, data, size); }
// The CRC of A followed by B from CRC(A), CRC(B) and B's length.
uint32_t Crc32Combine(uint32_t first, uint32_t second, size_t second_size);

}  // namespace bigmac::checkpoint

#endif  // BIGMAC_CORE_CHECKPOINT_CRC32_H_
