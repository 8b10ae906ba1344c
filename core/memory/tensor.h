#ifndef BIGMAC_CORE_MEMORY_TENSOR_H_
#define BIGMAC_CORE_MEMORY_TENSOR_H_

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/device/device.h"
#include "core/memory/allocator.h"
#include "core/memory/dtype.h"

namespace bigmac::memory {

// A dense, row-major, zero-initialised array in a device's memory (from its allocator, so every
// byte counts against the device's capacity). data() is a device pointer: host code reads it only
// on the CPU backend, or through CopyToHost. Move-only; frees on destruction. The device outlives
// the tensor.
class Tensor {
 public:
  Tensor() = default;
  Tensor(device::Device* device, std::vector<int64_t> shape, DType dtype);
  // The same tensor without the zeroing: its contents are unspecified (often a freed tensor's
  // bytes). Only for outputs a kernel overwrites whole before anything reads them, where the
  // zeroing pass would be wasted (on the CPU it was 5% of a step, bench/NOTES.md lever 14).
  static Tensor ForOverwrite(device::Device* device, std::vector<int64_t> shape, DType dtype);
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

  void* raw() { return data_; }
  const void* raw() const { return data_; }
  device::Device* device() const { return device_; }

  bool empty() const { return data_ == nullptr; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  int64_t bytes() const { return numel_ * DTypeSize(dtype_); }
  std::string ShapeString() const;  // "f32[4, 64, 128]"

  void Zero();
  // The first element as a double (the loss a head writes), whatever the float dtype; on a GPU
  // this waits for the stream.
  double Scalar() const;
  // Same shape and dtype required.
  void CopyFrom(const Tensor& other);
  // Same shape required; converts the dtype (f32 <-> bf16 rounds to nearest even).
  void ConvertFrom(const Tensor& other);
  // A new tensor with the same shape, dtype and values, on the same device.
  Tensor Clone() const;
  // bytes() bytes between host memory and this tensor.
  void CopyToHost(void* host) const;
  void CopyFromHost(const void* host);

 private:
  Tensor(device::Device* device, std::vector<int64_t> shape, DType dtype, bool zeroed);
  void CheckType(DType wanted) const;
  void Release();

  device::Device* device_ = nullptr;
  void* data_ = nullptr;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::kF32;
};

}  // namespace bigmac::memory

#endif  // BIGMAC_CORE_MEMORY_TENSOR_H_
