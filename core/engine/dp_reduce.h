#ifndef BIGMAC_CORE_ENGINE_DP_REDUCE_H_
#define BIGMAC_CORE_ENGINE_DP_REDUCE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/comm/group.h"
#include "core/engine/rank_model.h"
#include "core/metrics/timeline.h"

namespace bigmac::engine {

// One bucket of the data-parallel all-reduce: whole parameter gradients, summed as one flat
// tensor.
struct DpBucket {
  std::vector<RankModel::NamedParam> params;
  std::vector<int> layer_ids;  // the distinct layers of `params`
  int64_t numel = 0;
  memory::DType dtype = memory::DType::kF32;
  bool tied = false;  // a tied weight's owner: final only after ReduceTied
};

// The bucket rule. The rank's owned parameters (tied copies excluded) in reverse layer order, the
// order in which their gradients become final in the backward, each layer's parameters in their
// own order; a bucket takes whole parameters until the next one would take it over
// `bucket_bytes` (a parameter larger than that is a bucket of its own), and a new dtype starts a
// new bucket. A tied weight's owner (the embedding's wte, which still receives the head's
// gradient in ReduceTied) is a bucket of its own, after all the others. The buckets depend only on
// the stage's parameters and `bucket_bytes`, never on timing, so every dp replica of a stage cuts
// the same ones, and the serial and the overlapped step sum the same buffers.
std::vector<DpBucket> MakeDpBuckets(RankModel& stage, int64_t bucket_bytes);

struct DpReduceOptions {
  // Start a bucket's all-reduce as soon as its gradients are final in the step's last flush
  // (parallel.overlap_dp_reduce); otherwise all buckets start in ReduceDp.
  bool overlap = true;
  int64_t bucket_bytes = int64_t{25} << 20;  // parallel.dp_bucket_size
  // ZeRO-1 (parallel.zero_stage=1, zero_shard.h): each bucket is reduce-scattered instead, and
  // only this rank's shard of the sums is copied back into the gradients.
  bool shard = false;
};

// The data-parallel all-reduce of one rank's owned gradients, in the buckets of MakeDpBuckets,
// started in bucket order on every rank. In the step's last flush (BeginLastFlush) it counts each
// layer's weight gradients (WeightGradientDone, called from the stage's hook); a layer is final
// once every micro-batch of the flush has added its part, a bucket once all its layers are (a tied
// bucket after TiedReduced). With overlap on, a final bucket's gradients are copied into a flat
// buffer and its all-reduce is started right away (Group::StartAllReduce), and every later weight
// gradient polls the transport so that MPI moves it along; ReduceDp (Finish) starts whatever is
// left, waits for all (with the transport's deadline) and copies the sums back. With overlap off
// the same buckets start in Finish: the same counts and the same reductions, so the same sums,
// bitwise. Each bucket's span, from its start to the observed completion, goes to the timeline's
// communication track. Inactive (nothing to do) when dp = 1. The stage, the dp group and the
// timeline outlive it.
class DpReducer {
 public:
  DpReducer(RankModel* stage, comm::Group* dp, const DpReduceOptions& options,
            int microbatches_per_flush);

  void BeginLastFlush();
  void WeightGradientDone(int layer_index);  // index into RankModel::layers()
  void TiedReduced();
  void Finish();
  // Tests the buckets in flight; a completed one is copied back and its span recorded.
  void Progress();

  void set_timeline(metrics::Timeline* timeline) { timeline_ = timeline; }
  const std::vector<DpBucket>& buckets() const { return buckets_; }
  // Bytes summed per step: all buckets, and the tied ones (which wait for ReduceTied).
  int64_t bytes() const;
  int64_t tied_bytes() const;
  // Of the last finished step: buckets started before the step's tail (during the last flush).
  int started_early() const { return reported_early_; }

 private:
  struct InFlight {
    int handle = -1;
    memory::Tensor flat;
    metrics::Timeline::Clock::time_point start;
    bool done = false;
  };
  bool Ready(size_t bucket) const;
  void StartReady();
  void Start(size_t bucket);
  void Complete(size_t bucket);

  RankModel* model_;
  comm::Group* dp_;
  DpReduceOptions options_;
  int microbatches_;
  bool active_;
  std::vector<DpBucket> buckets_;
  std::vector<int> layer_id_of_index_;                   // RankModel::layers() index -> layer_id
  std::map<int, std::vector<size_t>> buckets_of_layer_;  // layer_id -> buckets holding it
  std::vector<int64_t> flat_numel_;                      // per bucket, padded to a multiple of dp
  // Per step.
  bool counting_ = false;  // in the last flush
  bool tail_ = false;      // the step's tail has begun
  bool tied_final_ = false;
  std::map<int, int> weight_gradients_left_;  // layer_id -> micro-batches still to add
  std::vector<int> layers_left_;              // per bucket: layers not final yet
  size_t next_ = 0;                           // the next bucket to start
  std::vector<InFlight> in_flight_;           // per bucket, once started
  int started_early_ = 0;
  int reported_early_ = 0;
  metrics::Timeline* timeline_ = nullptr;
};

}  // namespace bigmac::engine

#endif  // BIGMAC_CORE_ENGINE_DP_REDUCE_H_
