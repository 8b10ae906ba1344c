#ifndef BIGMAC_CORE_MEMORY_DTYPE_H_
#define BIGMAC_CORE_MEMORY_DTYPE_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace bigmac::memory {

// f32: masters, gradients, moments and the CPU's arithmetic; bf16: compute copies and activations
// under precision.dtype=bf16; f64: gradient checks run the very same layer code in double; i32:
// tokens.
enum class DType { kF32, kF64, kI32, kBF16 };

int64_t DTypeSize(DType dtype);
std::string DTypeName(DType dtype);

// bfloat16 storage: the upper 16 bits of an IEEE float. Arithmetic happens in float.
struct BFloat16 {
  uint16_t bits = 0;
};

// Round to nearest, ties to even (what CUDA's __float2bfloat16_rn does); NaN stays a quiet NaN
// with its sign, infinities stay infinite.
inline BFloat16 ToBFloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return BFloat16{static_cast<uint16_t>((bits >> 16) | 0x0040u)};
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>((bits + rounding) >> 16)};
}

inline float ToFloat(BFloat16 value) {
  const uint32_t bits = static_cast<uint32_t>(value.bits) << 16;
  float result;
  std::memcpy(&result, &bits, sizeof(result));
  return result;
}

template <typename T>
constexpr DType DTypeOf() {
  if constexpr (std::is_same_v<T, float>) {
    return DType::kF32;
  } else if constexpr (std::is_same_v<T, double>) {
    return DType::kF64;
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return DType::kBF16;
  } else {
    static_assert(std::is_same_v<T, int32_t>, "unsupported tensor element type");
    return DType::kI32;
  }
}

}  // namespace bigmac::memory

#endif  // BIGMAC_CORE_MEMORY_DTYPE_H_
