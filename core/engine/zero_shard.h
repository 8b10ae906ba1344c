#ifndef BIGMAC_CORE_ENGINE_ZERO_SHARD_H_
#define BIGMAC_CORE_ENGINE_ZERO_SHARD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/comm/group.h"
#include "core/engine/dp_reduce.h"
#include "core/engine/rank_model.h"
#include "core/optim/adamw.h"

namespace bigmac::engine {

// ZeRO-1 (parallel.zero_stage=1, docs/zero.md): the AdamW moments and the master update of each
// stage sharded over its data-parallel group, by the buckets of the dp reduction (MakeDpBuckets).
//
// The shard rule. A bucket of N elements is padded with zeros to N' = ceil(N / dp) * dp and cut
// into dp equal contiguous shards; rank r owns elements [r N'/dp, (r+1) N'/dp) of it that are
// below N. The buckets depend only on the stage's parameters and parallel.dp_bucket_size, never
// on dp; the gradient sums are in dp-rank order (the transport's reduce-scatter, the same sums as
// its all-reduce) and AdamW is elementwise, so an element's update does not depend on which rank
// owns it: the shard boundaries move with dp, the numbers do not.

// Elements [begin, begin + length) of one parameter, at `flat_offset` in its bucket's flat buffer.
struct ParamSlice {
  RankModel::NamedParam named;
  int64_t begin = 0;
  int64_t length = 0;
  int64_t flat_offset = 0;
};

// `numel` rounded up to a multiple of `dp_size` (a bucket's flat buffer under ZeRO-1).
int64_t PaddedNumel(int64_t numel, int dp_size);

// The pieces of `bucket`'s parameters inside rank `dp_rank`'s shard, in bucket order (at most one
// per parameter, since both a parameter and a shard are contiguous in the bucket).
std::vector<ParamSlice> ShardSlices(const DpBucket& bucket, int dp_size, int dp_rank);

// This rank's shards of a stage's buckets and what is done with them after the reduce-scatter
// (DpReducer with DpReduceOptions::shard): the slice state of AdamW, the gradient norm of the
// owned elements, and the all-gather of the updated masters. The stage's parameters, the
// dp group and the device outlive it.
class ZeroShards {
 public:
  ZeroShards(const std::vector<DpBucket>& buckets, comm::Group* dp, device::Device* device);

  // Slice state in `adamw` for every bucketed parameter (empty where this rank owns none of it).
  void InitState(optim::AdamW* adamw) const;
  // The sum of squares of this rank's final gradient elements (double, in slice order), and in
  // `bad` the name of the first parameter whose owned elements are not all finite.
  double SumSquares(std::string* bad) const;
  // `value` summed over the dp group (in dp-rank order, the same on every rank).
  double DpSum(double value) const;
  // After AdamW updated the owned elements: every bucket's masters all-gathered over the dp
  // group (started together, then waited for), then every compute copy refreshed.
  void AllGatherValues();

  const std::vector<ParamSlice>& slices() const { return slices_; }
  // Elements whose optimizer state this rank holds, and all of the buckets' elements.
  int64_t owned_elements() const;
  int64_t total_elements() const;

 private:
  std::vector<DpBucket> buckets_;
  std::vector<std::vector<ParamSlice>> bucket_slices_;  // per bucket
  std::vector<ParamSlice> slices_;                      // all of them, in bucket order
  comm::Group* dp_;
  device::Device* device_;
};

}  // namespace bigmac::engine

#endif  // BIGMAC_CORE_ENGINE_ZERO_SHARD_H_
