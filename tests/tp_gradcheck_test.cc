// The tensor-parallel GPT and llama blocks (stages/gpt/tp_block.cc, stages/llama/block.cc) in
// double precision: its gradients
// against central finite differences, and its output and gradients against the tp = 1 block's
// from the same initial weights. The tp ranks are threads of this process joined by an
// in-process TpGroup (the layer sees only that interface; tests/mpi/tp_test.cc covers MPI).
#include <gtest/gtest.h>
#include <omp.h>

#include <barrier>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/layer/tp_layer.h"
#include "plugins/sdk/init.h"
#include "tests/testing/gradcheck.h"

namespace bigmac {
namespace {

using layer::Layer;
using layer::Saved;
using memory::DType;
using memory::Tensor;

// `size` threads, one per tp rank. Sums in rank order, so every rank gets the same bits.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), slots_(size), barrier_(size) {}

  class Member : public layer::TpGroup {
   public:
    Member(ThreadGroup* group, int rank) : group_(group), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return group_->size_; }
    void AllReduceSum(Tensor* tensor, const std::string&) override { Reduce(tensor, false); }
    void AllReduceMax(Tensor* tensor, const std::string&) override { Reduce(tensor, true); }

   private:
    void Reduce(Tensor* tensor, bool max) {
      group_->slots_[rank_] = tensor;
      group_->barrier_.arrive_and_wait();
      std::vector<double> result(tensor->numel());
      for (int r = 0; r < group_->size_; ++r) {
        const double* d = group_->slots_[r]->data<double>();
        for (size_t i = 0; i < result.size(); ++i)
          result[i] = r == 0 ? d[i] : (max ? std::max(result[i], d[i]) : result[i] + d[i]);
      }
      group_->barrier_.arrive_and_wait();
      tensor->CopyFromHost(result.data());
    }
    ThreadGroup* group_;
    int rank_;
  };

  // Runs `work(rank)` on every rank's thread and waits for all.
  void Run(const std::function<void(int)>& work) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r) threads.emplace_back(work, r);
    for (std::thread& t : threads) t.join();
  }

 private:
  int size_;
  std::vector<Tensor*> slots_;
  std::barrier<> barrier_;
};

// One block split over `tp` thread ranks, an input x and a seeded R for J = sum(y * R).
struct TpBlocks {
  std::unique_ptr<device::Device> cpu = device::MakeCpuDevice(0, int64_t{1} << 30);
  ThreadGroup group;
  std::vector<std::unique_ptr<ThreadGroup::Member>> members;
  std::vector<std::unique_ptr<Layer>> ranks;
  std::vector<layer::TpShard> shards;  // rank 0's, in Params() order
  testutil::Batch batch = testutil::MakeBatch(2, 5, testutil::GradcheckDims().vocab_size);
  Tensor x, r;

  TpBlocks(int tp, bool checkpointing, const std::string& type = "gpt_block",
           const layer::ModelDims& dims = testutil::GradcheckDims())
      : group(tp) {
    const layer::LayerSpec spec =
        testutil::GradcheckSpec(type, 1, DType::kF64, cpu.get(), checkpointing, dims);
    for (int rank = 0; rank < tp; ++rank) {
      members.push_back(std::make_unique<ThreadGroup::Member>(&group, rank));
      layer::TpBuiltLayer built = layer::CreateTpLayer(spec, members.back().get());
      built.layer->InitParams(5);
      ranks.push_back(std::move(built.layer));
      if (rank == 0) shards = built.shards;
    }
    const int c = spec.dims.hidden_size;
    x = Tensor(cpu.get(), {2, 5, c}, DType::kF64);
    r = Tensor(cpu.get(), {2, 5, c}, DType::kF64);
    sdk::FillNormal(&x, 1.0, 21, 0, "x");
    sdk::FillNormal(&r, 1.0, 22, 0, "r");
    // Off the initial values (zero biases, unit norms), so that every term is exercised: noise
    // drawn for the full tensor and sliced, so replicated parameters stay equal on every rank.
    for (size_t p = 0; p < shards.size(); ++p) {
      Tensor noise(cpu.get(), shards[p].full_shape, DType::kF64);
      sdk::FillNormal(&noise, 0.05, 23, 1, ranks[0]->Params()[p]->name);
      for (int rank = 0; rank < tp; ++rank) {
        layer::TpShard shard = Shard(p, rank);
        Tensor& value = ranks[rank]->Params()[p]->value;
        std::vector<double> local(value.numel());
        layer::FullToLocal(shard, noise.raw(), local.data(), sizeof(double));
        for (int64_t i = 0; i < value.numel(); ++i) value.data<double>()[i] += local[i];
      }
    }
  }

  layer::TpShard Shard(size_t param, int rank) const {
    layer::TpShard shard = shards[param];
    shard.rank = rank;
    return shard;
  }

  // J = sum(y * R) with y from rank 0 (every rank has the same y).
  double Objective() {
    std::vector<Tensor> ys(ranks.size());
    group.Run([&](int rank) {
      Saved saved;
      ranks[rank]->Forward(batch.mb, x, &ys[rank], &saved);
    });
    double j = 0;
    for (int64_t i = 0; i < ys[0].numel(); ++i) j += ys[0].data<double>()[i] * r.data<double>()[i];
    return j;
  }

  // Every rank's parameter gradients of J (zeroed first), and dx from rank 0.
  Tensor Backward() {
    std::vector<Tensor> dxs(ranks.size());
    group.Run([&](int rank) {
      for (layer::Param* param : ranks[rank]->Params()) param->grad.Zero();
      Saved saved;
      Tensor y;
      ranks[rank]->Forward(batch.mb, x, &y, &saved);
      ranks[rank]->BackwardInput(batch.mb, r, &dxs[rank], &saved);
      ranks[rank]->BackwardWeight(batch.mb, &saved);
    });
    return std::move(dxs[0]);
  }
};

void CheckTpBlock(int tp, bool checkpointing, const std::string& type = "gpt_block",
                  const layer::ModelDims& dims = testutil::GradcheckDims()) {
  omp_set_num_threads(1);
  TpBlocks blocks(tp, checkpointing, type, dims);
  const Tensor dx = blocks.Backward();
  testutil::CheckAllElements("tp block input", &blocks.x, dx, [&] { return blocks.Objective(); });
  for (size_t p = 0; p < blocks.shards.size(); ++p) {
    if (!blocks.shards[p].sliced()) {
      // A replicated parameter is one variable: perturb rank 0's and copy it to the others.
      layer::Param* param = blocks.ranks[0]->Params()[p];
      testutil::CheckAllElements(
          "replicated " + param->name, &param->value, param->grad,
          [&] { return blocks.Objective(); },
          [&] {
            for (int rank = 1; rank < tp; ++rank)
              blocks.ranks[rank]->Params()[p]->value.CopyFrom(param->value);
          });
      continue;
    }
    for (int rank = 0; rank < tp; ++rank) {
      layer::Param* param = blocks.ranks[rank]->Params()[p];
      testutil::CheckAllElements("tp rank " + std::to_string(rank) + " " + param->name,
                                 &param->value, param->grad, [&] { return blocks.Objective(); });
    }
  }
}

TEST(TpGradCheck, BlockOnTwoRanks) { CheckTpBlock(2, false); }
TEST(TpGradCheck, BlockOnTwoRanksWithActivationCheckpointing) { CheckTpBlock(2, true); }
// 4 query heads over 2 key/value heads: each rank holds one group (2 q, 1 k, 1 v).
TEST(TpGradCheck, LlamaBlockOnTwoRanks) {
  CheckTpBlock(2, false, "llama_block", testutil::LlamaGradcheckDims());
}
TEST(TpGradCheck, LlamaBlockOnTwoRanksWithActivationCheckpointing) {
  CheckTpBlock(2, true, "llama_block", testutil::LlamaGradcheckDims());
}

// From the same seed, the tp = 2 block's output equals the tp = 1 block's, and each rank's
// gradient slice equals the matching slice of the full gradient (double precision: only the
// order of the row-parallel sums differs).
void CheckMatchesTheUnshardedBlock(const std::string& type, const layer::ModelDims& dims) {
  omp_set_num_threads(1);
  TpBlocks split(2, false, type, dims);
  const layer::LayerSpec spec =
      testutil::GradcheckSpec(type, 1, DType::kF64, split.cpu.get(), false, dims);
  std::unique_ptr<Layer> whole = layer::CreateLayer(spec);
  whole->InitParams(5);
  // The tp ranks' weights (with their noise), assembled into the full tensors.
  const std::vector<layer::Param*> full = whole->Params();
  for (size_t p = 0; p < full.size(); ++p) {
    for (int rank = 0; rank < 2; ++rank) {
      layer::LocalToFull(split.Shard(p, rank), split.ranks[rank]->Params()[p]->value.raw(),
                         full[p]->value.raw(), sizeof(double));
    }
  }
  Saved saved;
  Tensor y, dx;
  for (layer::Param* param : full) param->grad.Zero();
  whole->Forward(split.batch.mb, split.x, &y, &saved);
  whole->BackwardInput(split.batch.mb, split.r, &dx, &saved);
  whole->BackwardWeight(split.batch.mb, &saved);
  const Tensor split_dx = split.Backward();
  for (int64_t i = 0; i < dx.numel(); ++i)
    EXPECT_NEAR(split_dx.data<double>()[i], dx.data<double>()[i], 1e-12) << "dx " << i;
  for (size_t p = 0; p < full.size(); ++p) {
    for (int rank = 0; rank < 2; ++rank) {
      const layer::TpShard shard = split.Shard(p, rank);
      const Tensor& grad = split.ranks[rank]->Params()[p]->grad;
      std::vector<double> expected(grad.numel());
      layer::FullToLocal(shard, full[p]->grad.raw(), expected.data(), sizeof(double));
      for (int64_t i = 0; i < grad.numel(); ++i)
        ASSERT_NEAR(grad.data<double>()[i], expected[i], 1e-12)
            << full[p]->name << " rank " << rank;
    }
  }
}

TEST(TpBlock, MatchesTheUnshardedBlock) {
  CheckMatchesTheUnshardedBlock("gpt_block", testutil::GradcheckDims());
}
TEST(TpBlock, LlamaMatchesTheUnshardedBlock) {
  CheckMatchesTheUnshardedBlock("llama_block", testutil::LlamaGradcheckDims());
}
// Two key/value groups per rank (8 query heads over 4 key/value heads at tp = 2).
TEST(TpBlock, LlamaWithTwoGroupsPerRankMatchesTheUnshardedBlock) {
  layer::ModelDims dims = testutil::LlamaGradcheckDims();
  dims.num_heads = 8;
  dims.num_kv_heads = 4;
  CheckMatchesTheUnshardedBlock("llama_block", dims);
}

// Slices and their inverse, with the padding of a vocabulary that tp does not divide.
TEST(TpShard, SlicesAndAssemblesWithPadding) {
  layer::TpShard shard;
  shard.dim = 0;
  shard.size = 2;
  shard.full_shape = {5, 2};  // 5 rows over 2 ranks: 3 each, the last one padding
  EXPECT_EQ(shard.LocalShape(), (std::vector<int64_t>{3, 2}));
  const std::vector<float> full = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<float> assembled(10, -1);
  for (int rank = 0; rank < 2; ++rank) {
    shard.rank = rank;
    std::vector<float> local(6, -1);
    layer::FullToLocal(shard, full.data(), local.data(), sizeof(float));
    if (rank == 1) {
      EXPECT_EQ(local, (std::vector<float>{6, 7, 8, 9, 0, 0}));
    }
    layer::LocalToFull(shard, local.data(), assembled.data(), sizeof(float));
  }
  EXPECT_EQ(assembled, full);
  // q, k, v: each third split over the ranks.
  layer::TpShard qkv;
  qkv.dim = 0;
  qkv.blocks = 3;
  qkv.size = 2;
  qkv.rank = 1;
  qkv.full_shape = {6};
  const std::vector<float> fused = {0, 1, 2, 3, 4, 5};
  std::vector<float> local(3);
  layer::FullToLocal(qkv, fused.data(), local.data(), sizeof(float));
  EXPECT_EQ(local, (std::vector<float>{1, 3, 5}));
  // Grouped-query q, k, v: unequal parts (4 query rows, 2 key, 2 value), each split over the
  // ranks; the round trip through every rank restores the whole.
  layer::TpShard gqa;
  gqa.dim = 0;
  gqa.parts = {4, 2, 2};
  gqa.size = 2;
  gqa.full_shape = {8, 1};
  const std::vector<float> rows = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<float> whole(8, -1);
  for (int rank = 0; rank < 2; ++rank) {
    gqa.rank = rank;
    ASSERT_EQ(gqa.LocalShape(), (std::vector<int64_t>{4, 1}));
    std::vector<float> mine(4);
    layer::FullToLocal(gqa, rows.data(), mine.data(), sizeof(float));
    EXPECT_EQ(mine,
              rank == 0 ? (std::vector<float>{0, 1, 4, 6}) : (std::vector<float>{2, 3, 5, 7}));
    layer::LocalToFull(gqa, mine.data(), whole.data(), sizeof(float));
  }
  EXPECT_EQ(whole, rows);
}

}  // namespace
}  // namespace bigmac
