#ifndef BIGMAC_CORE_MEMORY_TENSOR_H_
#define BIGMAC_CORE_MEMORY_TENSOR_H_

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "core/memory/allocator.h"

namespace bigmac::memory {

// fp32 is the training dtype on CPU; fp64 exists so that gradient checks run the very same layer
// code in double precision; int32 holds tokens.
enum class DType { kF32, kF64, kI32 };

int64_t DTypeSize(DType dtype);
std::string DTypeName(DType dtype);

template <typename T>
constexpr DType DTypeOf() {
  if constexpr (std::is_same_v<T, float>) {
    return DType::kF32;
  } else if constexpr (std::is_same_v<T, double>) {
    return DType::kF64;
  } else {
    static_assert(std::is_same_v<T, int32_t>, "unsupported tensor element type");
    return DType::kI32;
  }
}

// A dense, row-major, zero-initialised array whose memory comes from a DeviceAllocator (so every
// byte counts against the device's capacity). Move-only; frees on destruction.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DeviceAllocator* allocator, std::vector<int64_t> shape, DType dtype);
  ~Tensor();
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  template <typename T>
  T* data() {
    CheckType(DTypeOf<T>());
    return static_cast<T*>(data_);
  }
  template <typename T>
  const T* data() const {
    CheckType(DTypeOf<T>());
    return static_cast<const T*>(data_);
  }

  bool empty() const { return data_ == nullptr; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  int64_t bytes() const { return numel_ * DTypeSize(dtype_); }
  std::string ShapeString() const;  // "f32[4, 64, 128]"

  void Zero();
  // The first element as a double (the loss a head writes), whatever the float dtype.
  double Scalar() const;
  // Same shape and dtype required.
  void CopyFrom(const Tensor& other);
  // A new tensor with the same shape, dtype and values, from the same allocator.
  Tensor Clone() const;

 private:
  void CheckType(DType wanted) const;
  void Release();

  DeviceAllocator* allocator_ = nullptr;
  void* data_ = nullptr;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::kF32;
};

}  // namespace bigmac::memory

#endif  // BIGMAC_CORE_MEMORY_TENSOR_H_
