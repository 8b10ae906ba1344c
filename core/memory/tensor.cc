#include "core/memory/tensor.h"

#include <cstring>
#include <utility>

namespace bigmac::memory {

Tensor::Tensor(device::Device* device, std::vector<int64_t> shape, DType dtype)
    : Tensor(device, std::move(shape), dtype, /*zeroed=*/true) {}

Tensor Tensor::ForOverwrite(device::Device* device, std::vector<int64_t> shape, DType dtype) {
  return Tensor(device, std::move(shape), dtype, /*zeroed=*/false);
}

Tensor::Tensor(device::Device* device, std::vector<int64_t> shape, DType dtype, bool zeroed)
    : device_(device), shape_(std::move(shape)), numel_(1), dtype_(dtype) {
  for (int64_t extent : shape_) {
    if (extent <= 0) throw std::invalid_argument("tensor extent must be > 0: " + ShapeString());
    numel_ *= extent;
  }
  data_ = device_->allocator().Allocate(bytes());
  if (zeroed) device_->Memset(data_, bytes());
}

Tensor::~Tensor() { Release(); }

Tensor::Tensor(Tensor&& other) noexcept { *this = std::move(other); }

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    Release();
    device_ = std::exchange(other.device_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    shape_ = std::move(other.shape_);
    numel_ = std::exchange(other.numel_, 0);
    dtype_ = other.dtype_;
  }
  return *this;
}

void Tensor::Release() {
  if (data_) device_->allocator().Free(data_);
  data_ = nullptr;
}

std::string Tensor::ShapeString() const {
  std::string text = DTypeName(dtype_) + "[";
  for (size_t i = 0; i < shape_.size(); ++i) text += (i ? ", " : "") + std::to_string(shape_[i]);
  return text + "]";
}

double Tensor::Scalar() const {
  if (dtype_ == DType::kF64) {
    double value = 0;
    device_->CopyDeviceToHost(&value, data_, sizeof(value));
    return value;
  }
  float value = 0;
  CheckType(DType::kF32);
  device_->CopyDeviceToHost(&value, data_, sizeof(value));
  return value;
}

void Tensor::Zero() {
  if (data_) device_->Memset(data_, bytes());
}

void Tensor::ConvertFrom(const Tensor& other) {
  if (other.shape_ != shape_) {
    throw std::invalid_argument("tensor conversion " + other.ShapeString() + " -> " +
                                ShapeString());
  }
  device_->Convert(data_, dtype_, other.data_, other.dtype_, numel_);
}

void Tensor::CopyToHost(void* host) const { device_->CopyDeviceToHost(host, data_, bytes()); }

void Tensor::CopyFromHost(const void* host) { device_->CopyHostToDevice(data_, host, bytes()); }

void Tensor::CopyFrom(const Tensor& other) {
  if (other.shape_ != shape_ || other.dtype_ != dtype_) {
    throw std::invalid_argument("tensor copy " + other.ShapeString() + " -> " + ShapeString());
  }
  device_->CopyDeviceToDevice(data_, other.data_, bytes());
}

Tensor Tensor::Clone() const {
  Tensor copy = ForOverwrite(device_, shape_, dtype_);  // every byte is copied next
  copy.CopyFrom(*this);
  return copy;
}

void Tensor::CheckType(DType wanted) const {
  if (wanted != dtype_) {
    throw std::logic_error("tensor " + ShapeString() + " read as " + DTypeName(wanted));
  }
}

}  // namespace bigmac::memory
