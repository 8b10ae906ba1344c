#include "core/engine/dp_reduce.h"

#include <set>
#include <stdexcept>

#include "core/engine/zero_shard.h"
#include "core/memory/allocator.h"

namespace bigmac::engine {

using memory::Tensor;

std::vector<DpBucket> MakeDpBuckets(RankModel& stage, int64_t bucket_bytes) {
  const std::vector<RankModel::NamedParam> owned = stage.OwnedParams();
  std::set<const layer::Param*> tied_owners;
  for (TiedWeight& tie : stage.tied()) {
    if (tie.owner()) tied_owners.insert(tie.owner());
  }
  // OwnedParams is in layer order, each layer's parameters in order: split it into layers, then
  // walk the layers from the last.
  std::vector<std::pair<size_t, size_t>> layers;  // [begin, end) of one layer's parameters
  for (size_t i = 0; i < owned.size(); ++i) {
    if (i == 0 || owned[i].layer_id != owned[i - 1].layer_id) layers.push_back({i, i});
    layers.back().second = i + 1;
  }
  std::vector<DpBucket> buckets;
  std::vector<DpBucket> tied;
  DpBucket current;
  auto add = [](DpBucket* bucket, const RankModel::NamedParam& named) {
    if (bucket->layer_ids.empty() || bucket->layer_ids.back() != named.layer_id)
      bucket->layer_ids.push_back(named.layer_id);
    bucket->dtype = named.param->grad.dtype();
    bucket->numel += named.param->grad.numel();
    bucket->params.push_back(named);
  };
  for (size_t l = layers.size(); l-- > 0;) {
    for (size_t i = layers[l].first; i < layers[l].second; ++i) {
      const RankModel::NamedParam& named = owned[i];
      const memory::Tensor& grad = named.param->grad;
      if (grad.numel() == 0) continue;
      if (tied_owners.count(named.param)) {
        DpBucket own;
        own.tied = true;
        add(&own, named);
        tied.push_back(std::move(own));
        continue;
      }
      const int64_t current_bytes = current.numel * memory::DTypeSize(current.dtype);
      if (!current.params.empty() &&
          (current_bytes + grad.bytes() > bucket_bytes || current.dtype != grad.dtype())) {
        buckets.push_back(std::move(current));
        current = DpBucket();
      }
      add(&current, named);
    }
  }
  if (!current.params.empty()) buckets.push_back(std::move(current));
  for (DpBucket& bucket : tied) buckets.push_back(std::move(bucket));
  return buckets;
}

DpReducer::DpReducer(RankModel* stage, comm::Group* dp, const DpReduceOptions& options,
                     int microbatches_per_flush)
    : model_(stage),
      dp_(dp),
      options_(options),
      microbatches_(microbatches_per_flush),
      active_(dp->size() > 1) {
  if (!active_) return;
  if (options_.bucket_bytes <= 0)
    throw std::invalid_argument("dp all-reduce: the bucket size must be positive");
  buckets_ = MakeDpBuckets(*stage, options_.bucket_bytes);
  for (const auto& layer : stage->layers()) layer_id_of_index_.push_back(layer->layer_id());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (int id : buckets_[b].layer_ids) buckets_of_layer_[id].push_back(b);
  }
  for (const DpBucket& b : buckets_)
    // Padded with zeros to a multiple of dp: the shape ZeRO-1's collectives need, and the one
    // the transport's all-reduce works on without a staging copy.
    flat_numel_.push_back(PaddedNumel(b.numel, dp->size()));
  in_flight_.resize(buckets_.size());
  layers_left_.resize(buckets_.size());
}

int64_t DpReducer::bytes() const {
  int64_t total = 0;
  for (const DpBucket& b : buckets_) total += b.numel * memory::DTypeSize(b.dtype);
  return total;
}

int64_t DpReducer::tied_bytes() const {
  int64_t total = 0;
  for (const DpBucket& b : buckets_) total += b.tied ? b.numel * memory::DTypeSize(b.dtype) : 0;
  return total;
}

void DpReducer::BeginLastFlush() {
  if (!active_) return;
  counting_ = options_.overlap;
  tail_ = false;
  tied_final_ = false;
  next_ = 0;
  started_early_ = 0;
  for (const auto& [id, buckets] : buckets_of_layer_) weight_gradients_left_[id] = microbatches_;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    layers_left_[b] = static_cast<int>(buckets_[b].layer_ids.size());
    in_flight_[b] = InFlight();
  }
}

void DpReducer::WeightGradientDone(int layer_index) {
  if (!counting_) return;
  const int id = layer_id_of_index_.at(layer_index);
  auto it = weight_gradients_left_.find(id);
  if (it != weight_gradients_left_.end() && it->second > 0 && --it->second == 0) {
    for (size_t b : buckets_of_layer_[id]) --layers_left_[b];
    StartReady();
  }
  Progress();
}

void DpReducer::TiedReduced() {
  if (!active_) return;
  tail_ = true;
  tied_final_ = true;
  if (counting_) StartReady();
}

bool DpReducer::Ready(size_t bucket) const {
  return layers_left_[bucket] <= 0 && (!buckets_[bucket].tied || tied_final_);
}

void DpReducer::StartReady() {
  // In bucket order on every rank (MPI matches collectives on one communicator by order).
  while (next_ < buckets_.size() && Ready(next_)) Start(next_++);
}

void DpReducer::Start(size_t bucket) {
  const DpBucket& b = buckets_[bucket];
  InFlight& f = in_flight_[bucket];
  device::Device* device = model_->device();
  f.flat = Tensor(device, {flat_numel_[bucket]}, b.dtype);
  const int64_t element = memory::DTypeSize(b.dtype);
  int64_t offset = 0;
  for (const RankModel::NamedParam& named : b.params) {
    device->CopyDeviceToDevice(static_cast<char*>(f.flat.raw()) + offset * element,
                               named.param->grad.raw(), named.param->grad.bytes());
    offset += named.param->grad.numel();
  }
  device->Memset(static_cast<char*>(f.flat.raw()) + offset * element,
                 (flat_numel_[bucket] - offset) * element);  // ZeRO-1's padding
  f.start = metrics::Timeline::Clock::now();
  const std::string what =
      std::string("ReduceDp: ") + (options_.shard ? "reduce-scatter" : "all-reduce") +
      " of bucket " + std::to_string(bucket + 1) + " of " + std::to_string(buckets_.size()) + " (" +
      b.params.front().name + (b.params.size() > 1 ? " .. " + b.params.back().name : "") + ", " +
      std::to_string(b.numel) + " elements) over the data-parallel group";
  f.handle = options_.shard ? dp_->StartReduceScatter(&f.flat, what)
                            : dp_->StartAllReduce(&f.flat, comm::ReduceOp::kSum, what);
  if (!tail_) ++started_early_;
}

void DpReducer::Complete(size_t bucket) {
  const DpBucket& b = buckets_[bucket];
  InFlight& f = in_flight_[bucket];
  device::Device* device = model_->device();
  const int64_t element = memory::DTypeSize(b.dtype);
  if (options_.shard) {
    // Only this rank's shard holds sums; the rest of each gradient is left as it was.
    for (const ParamSlice& slice : ShardSlices(b, dp_->size(), dp_->rank())) {
      device->CopyDeviceToDevice(
          static_cast<char*>(slice.named.param->grad.raw()) + slice.begin * element,
          static_cast<const char*>(f.flat.raw()) + slice.flat_offset * element,
          slice.length * element);
    }
  } else {
    int64_t offset = 0;
    for (const RankModel::NamedParam& named : b.params) {
      device->CopyDeviceToDevice(named.param->grad.raw(),
                                 static_cast<const char*>(f.flat.raw()) + offset * element,
                                 named.param->grad.bytes());
      offset += named.param->grad.numel();
    }
  }
  f.flat = Tensor();
  f.done = true;
  if (timeline_) {
    timeline_->Record(std::string(options_.shard ? "ReduceScatter" : "AllReduce") + " bucket " +
                          std::to_string(bucket + 1) + "/" + std::to_string(buckets_.size()) +
                          " (" + memory::FormatMiB(b.numel * element) + ")",
                      "dp_reduce", f.start, metrics::Timeline::Clock::now(),
                      metrics::Timeline::kCommTrack);
  }
}

void DpReducer::Progress() {
  for (size_t b = 0; b < next_; ++b) {
    if (!in_flight_[b].done && dp_->Test(in_flight_[b].handle)) Complete(b);
  }
}

void DpReducer::Finish() {
  if (!active_) return;
  tail_ = true;
  tied_final_ = true;
  // Every layer's gradient is final once the flushes are done.
  for (int& left : layers_left_) left = 0;
  if (!counting_) {
    // Not reset by BeginLastFlush (overlap off, or a caller that never marked the last flush).
    next_ = 0;
    for (InFlight& f : in_flight_) f = InFlight();
  }
  StartReady();
  Progress();  // what has completed already, with the time it was seen
  dp_->WaitAll();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!in_flight_[b].done) Complete(b);
  }
  reported_early_ = started_early_;
  started_early_ = 0;
  counting_ = false;
  next_ = 0;
}

}  // namespace bigmac::engine
