#include "core/memory/tensor.h"

#include <cstring>
#include <utility>

namespace bigmac::memory {

int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
    case DType::kI32:
      return 4;
  }
  return 0;
}

std::string DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kI32:
      return "i32";
  }
  return "?";
}

Tensor::Tensor(DeviceAllocator* allocator, std::vector<int64_t> shape, DType dtype)
    : allocator_(allocator), shape_(std::move(shape)), numel_(1), dtype_(dtype) {
  for (int64_t extent : shape_) {
    if (extent <= 0) throw std::invalid_argument("tensor extent must be > 0: " + ShapeString());
    numel_ *= extent;
  }
  data_ = allocator_->Allocate(bytes());
  std::memset(data_, 0, bytes());
}

Tensor::~Tensor() { Release(); }

Tensor::Tensor(Tensor&& other) noexcept { *this = std::move(other); }

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    Release();
    allocator_ = std::exchange(other.allocator_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    shape_ = std::move(other.shape_);
    numel_ = std::exchange(other.numel_, 0);
    dtype_ = other.dtype_;
  }
  return *this;
}

void Tensor::Release() {
  if (data_) allocator_->Free(data_);
  data_ = nullptr;
}

std::string Tensor::ShapeString() const {
  std::string text = DTypeName(dtype_) + "[";
  for (size_t i = 0; i < shape_.size(); ++i) text += (i ? ", " : "") + std::to_string(shape_[i]);
  return text + "]";
}

double Tensor::Scalar() const {
  return dtype_ == DType::kF64 ? data<double>()[0] : data<float>()[0];
}

void Tensor::Zero() {
  if (data_) std::memset(data_, 0, bytes());
}

void Tensor::CopyFrom(const Tensor& other) {
  if (other.shape_ != shape_ || other.dtype_ != dtype_) {
    throw std::invalid_argument("tensor copy " + other.ShapeString() + " -> " + ShapeString());
  }
  std::memcpy(data_, other.data_, bytes());
}

Tensor Tensor::Clone() const {
  Tensor copy(allocator_, shape_, dtype_);
  copy.CopyFrom(*this);
  return copy;
}

void Tensor::CheckType(DType wanted) const {
  if (wanted != dtype_) {
    throw std::logic_error("tensor " + ShapeString() + " read as " + DTypeName(wanted));
  }
}

}  // namespace bigmac::memory
