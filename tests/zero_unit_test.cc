// ZeRO-1's pieces without MPI: the shard rule tiles every bucket once over the replicas for any
// dp (padding included), and AdamW with slice state, one optimizer per replica, updates the
// masters bitwise as one AdamW with whole state; a full checkpoint tensor is sliced on load.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/device/device.h"
#include "core/engine/zero_shard.h"
#include "core/optim/adamw.h"

namespace bigmac {
namespace {

using memory::DType;
using memory::Tensor;

struct Params {
  std::vector<std::unique_ptr<layer::Param>> owned;
  engine::DpBucket bucket;
};

// Parameters of `sizes` elements with seeded random values and gradients, in one bucket.
Params MakeParams(device::Device* device, const std::vector<int64_t>& sizes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Params p;
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto param = std::make_unique<layer::Param>();
    param->name = "w" + std::to_string(i);
    param->weight_decay = i % 2 == 0;
    param->value = Tensor(device, {sizes[i]}, DType::kF32);
    param->grad = Tensor(device, {sizes[i]}, DType::kF32);
    for (int64_t k = 0; k < sizes[i]; ++k) {
      param->value.data<float>()[k] = normal(rng);
      param->grad.data<float>()[k] = normal(rng) * 0.1f;
    }
    p.bucket.params.push_back({param->name, 0, param.get()});
    p.bucket.numel += sizes[i];
    p.owned.push_back(std::move(param));
  }
  p.bucket.layer_ids = {0};
  return p;
}

TEST(ShardRule, EveryElementOfABucketOnExactlyOneReplica) {
  auto device = device::MakeCpuDevice(0, int64_t{1} << 28);
  const Params p = MakeParams(device.get(), {7, 1, 13, 4, 29}, 1);  // 54 elements
  for (int dp = 1; dp <= 7; ++dp) {
    std::vector<int> owners(54, 0);
    int64_t most = 0;
    for (int r = 0; r < dp; ++r) {
      int64_t own = 0;
      for (const engine::ParamSlice& s : engine::ShardSlices(p.bucket, dp, r)) {
        int64_t offset = 0;  // the parameter's place in the bucket
        for (const auto& named : p.bucket.params) {
          if (named.param == s.named.param) break;
          offset += named.param->value.numel();
        }
        EXPECT_EQ(s.flat_offset, offset + s.begin);
        for (int64_t k = 0; k < s.length; ++k) ++owners[s.flat_offset + k];
        own += s.length;
      }
      EXPECT_LE(own, engine::PaddedNumel(54, dp) / dp) << "dp " << dp;
      most = std::max(most, own);
    }
    for (int64_t i = 0; i < 54; ++i) EXPECT_EQ(owners[i], 1) << "dp " << dp << " element " << i;
    EXPECT_EQ(most, engine::PaddedNumel(54, dp) / dp) << "dp " << dp;
  }
}

// Three steps: one AdamW with whole state against dp = 3 AdamWs, each with slice state for its
// shard and stepping only its elements (the all-gather is a copy of each replica's elements).
TEST(SlicedAdamW, ReplicasTogetherUpdateBitwiseAsOneOptimizer) {
  auto device = device::MakeCpuDevice(0, int64_t{1} << 28);
  const std::vector<int64_t> sizes = {7, 1, 13, 4, 29};
  const optim::AdamWOptions options;
  Params whole = MakeParams(device.get(), sizes, 7);
  optim::AdamW reference(options);
  std::vector<layer::Param*> whole_params;
  for (auto& param : whole.owned) whole_params.push_back(param.get());
  constexpr int kDp = 3;
  std::vector<Params> replicas;
  std::vector<std::unique_ptr<optim::AdamW>> sharded;
  for (int r = 0; r < kDp; ++r) {
    replicas.push_back(MakeParams(device.get(), sizes, 7));
    sharded.push_back(std::make_unique<optim::AdamW>(options));
    std::vector<engine::DpBucket> buckets = {replicas[r].bucket};
    for (const engine::DpBucket& b : buckets) {
      for (const auto& named : b.params) {
        const auto slices = engine::ShardSlices(b, kDp, r);
        auto it = std::find_if(slices.begin(), slices.end(), [&](const engine::ParamSlice& s) {
          return s.named.param == named.param;
        });
        if (it == slices.end()) {
          sharded[r]->InitSliceState(named.param, 0, 0);
        } else {
          sharded[r]->InitSliceState(named.param, it->begin, it->length);
        }
      }
    }
  }
  for (int step = 1; step <= 3; ++step) {
    reference.Step(whole_params, 1e-2, step);
    for (int r = 0; r < kDp; ++r) {
      std::vector<layer::Param*> params;
      for (auto& param : replicas[r].owned) params.push_back(param.get());
      sharded[r]->Step(params, 1e-2, step);
    }
    // The all-gather: every replica takes each owner's elements.
    for (int owner = 0; owner < kDp; ++owner) {
      for (const engine::ParamSlice& s : engine::ShardSlices(replicas[owner].bucket, kDp, owner)) {
        const size_t index = std::stoi(s.named.name.substr(1));
        for (int r = 0; r < kDp; ++r) {
          float* to = replicas[r].owned[index]->value.data<float>();
          const float* from = replicas[owner].owned[index]->value.data<float>();
          std::copy(from + s.begin, from + s.begin + s.length, to + s.begin);
        }
      }
    }
  }
  int64_t state = 0;
  for (int r = 0; r < kDp; ++r) {
    state += sharded[r]->StateElements();
    for (size_t i = 0; i < sizes.size(); ++i) {
      for (int64_t k = 0; k < sizes[i]; ++k) {
        ASSERT_EQ(replicas[r].owned[i]->value.data<float>()[k],
                  whole.owned[i]->value.data<float>()[k])
            << "replica " << r << " w" << i << "[" << k << "]";
      }
    }
  }
  EXPECT_EQ(state, reference.StateElements()) << "each element's moments once";

  // A checkpoint's moments are read straight into a replica's own slice (MomentsToLoad gives the
  // slice tensors themselves, which cover elements from StateBegin), never into a full copy.
  layer::Param* w4 = replicas[1].owned[4].get();
  ASSERT_TRUE(sharded[1]->HasSliceState(w4));
  const int64_t elements = sharded[1]->StateElements();
  const auto [m, v] = sharded[1]->MomentsToLoad(w4);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m, sharded[1]->FirstMoment(w4));
  EXPECT_EQ(v, sharded[1]->SecondMoment(w4));
  EXPECT_LT(m->numel(), 29) << "a slice, not the whole parameter";
  EXPECT_EQ(sharded[1]->StateElements(), elements) << "nothing allocated by the lookup";
  // Without state yet (a replicated parameter before its first step), it is created as
  // InitState would: zero, of the parameter's shape.
  optim::AdamW fresh(optim::AdamWOptions{});
  const auto [m0, v0] = fresh.MomentsToLoad(w4);
  ASSERT_NE(m0, nullptr);
  EXPECT_EQ(m0->shape(), w4->value.shape());
  for (int64_t k = 0; k < m0->numel(); ++k) EXPECT_EQ(m0->data<float>()[k], 0.0f);
  EXPECT_EQ(v0->numel(), w4->value.numel());
}

}  // namespace
}  // namespace bigmac
