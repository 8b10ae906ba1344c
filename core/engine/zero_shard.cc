#include "core/engine/zero_shard.h"

#include <algorithm>
#include <cmath>

namespace bigmac::engine {

int64_t PaddedNumel(int64_t numel, int dp_size) {
  return (numel + dp_size - 1) / dp_size * dp_size;
}

std::vector<ParamSlice> ShardSlices(const DpBucket& bucket, int dp_size, int dp_rank) {
  const comm::ShardRange shard =
      comm::DpShardOf(PaddedNumel(bucket.numel, dp_size), dp_size, dp_rank);
  std::vector<ParamSlice> slices;
  int64_t offset = 0;  // of the parameter in the flat buffer
  for (const RankModel::NamedParam& named : bucket.params) {
    const int64_t numel = named.param->grad.numel();
    const int64_t begin = std::max(offset, shard.begin);
    const int64_t end = std::min(offset + numel, shard.end);
    if (begin < end) slices.push_back({named, begin - offset, end - begin, begin});
    offset += numel;
  }
  return slices;
}

ZeroShards::ZeroShards(const std::vector<DpBucket>& buckets, comm::Group* dp,
                       device::Device* device)
    : buckets_(buckets), dp_(dp), device_(device) {
  for (const DpBucket& bucket : buckets_) {
    bucket_slices_.push_back(ShardSlices(bucket, dp->size(), dp->rank()));
    slices_.insert(slices_.end(), bucket_slices_.back().begin(), bucket_slices_.back().end());
  }
}

void ZeroShards::InitState(optim::AdamW* adamw) const {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (const RankModel::NamedParam& named : buckets_[b].params) {
      auto slice = std::find_if(bucket_slices_[b].begin(), bucket_slices_[b].end(),
                                [&](const ParamSlice& s) { return s.named.param == named.param; });
      if (slice == bucket_slices_[b].end()) {
        adamw->InitSliceState(named.param, 0, 0);
      } else {
        adamw->InitSliceState(named.param, slice->begin, slice->length);
      }
    }
  }
}

double ZeroShards::SumSquares(std::string* bad) const {
  if (slices_.empty()) return 0;
  std::vector<device::Device::Region> regions;
  for (const ParamSlice& slice : slices_) {
    const memory::Tensor& grad = slice.named.param->grad;
    regions.push_back(
        {static_cast<const char*>(grad.raw()) + slice.begin * memory::DTypeSize(grad.dtype()),
         grad.dtype(), slice.length});
  }
  const std::vector<double> parts =
      slices_.front().named.param->grad.device()->SumSquaresEach(regions);
  double sum = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!std::isfinite(parts[i]) && bad->empty()) *bad = slices_[i].named.name;
    sum += parts[i];
  }
  return sum;
}

double ZeroShards::DpSum(double value) const {
  memory::Tensor sum(device_, {1}, memory::DType::kF64);
  sum.CopyFromHost(&value);
  dp_->AllReduce(&sum, comm::ReduceOp::kSum,
                 "ReduceDp: all-reduce of gradients over the data-parallel group");
  return sum.Scalar();
}

void ZeroShards::AllGatherValues() {
  std::vector<memory::Tensor> flats;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const DpBucket& bucket = buckets_[b];
    device::Device* device = bucket.params.front().param->value.device();
    const memory::DType dtype = bucket.params.front().param->value.dtype();
    const int64_t element = memory::DTypeSize(dtype);
    flats.emplace_back(device, std::vector<int64_t>{PaddedNumel(bucket.numel, dp_->size())}, dtype);
    for (const ParamSlice& slice : bucket_slices_[b]) {
      device->CopyDeviceToDevice(
          static_cast<char*>(flats.back().raw()) + slice.flat_offset * element,
          static_cast<const char*>(slice.named.param->value.raw()) + slice.begin * element,
          slice.length * element);
    }
  }
  // Started together, in bucket order on every rank, before any is waited for.
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const DpBucket& bucket = buckets_[b];
    dp_->StartAllGather(&flats[b],
                        "OptimizerStep: all-gather of the updated bucket " + std::to_string(b + 1) +
                            " of " + std::to_string(buckets_.size()) + " (" +
                            bucket.params.front().name + ", " + std::to_string(bucket.numel) +
                            " elements) over the data-parallel group");
  }
  dp_->WaitAll();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    int64_t offset = 0;
    for (const RankModel::NamedParam& named : buckets_[b].params) {
      memory::Tensor& value = named.param->value;
      value.device()->CopyDeviceToDevice(
          value.raw(),
          static_cast<const char*>(flats[b].raw()) + offset * memory::DTypeSize(value.dtype()),
          value.bytes());
      offset += value.numel();
      layer::RefreshComputeCopy(named.param);
    }
  }
}

int64_t ZeroShards::owned_elements() const {
  int64_t total = 0;
  for (const ParamSlice& slice : slices_) total += slice.length;
  return total;
}

int64_t ZeroShards::total_elements() const {
  int64_t total = 0;
  for (const DpBucket& bucket : buckets_) total += bucket.numel;
  return total;
}

}  // namespace bigmac::engine
