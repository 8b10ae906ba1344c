// The executor against hand-written action lists on one process (the local transport): batched
// exchanges, the duplicate-receive guard, the device-side loss.
#include "core/engine/executor.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/comm/pipeline_comm.h"
#include "core/device/device.h"
#include "core/engine/dp_reduce.h"
#include "core/engine/rank_model.h"
#include "core/partition/partition.h"
#include "tests/testing/expect.h"

namespace bigmac {
namespace {

// Two stages of a 2-block GPT on one rank (virtual stages), so activations travel over the local
// transport between stage 0 and stage 1.
struct TwoStages {
  std::unique_ptr<device::Device> cpu = device::MakeCpuDevice(0, int64_t{1} << 28);
  std::unique_ptr<comm::PipelineComm> comm = comm::MakeLocalPipelineComm();
  std::unique_ptr<engine::RankModel> stage;
  std::vector<int32_t> tokens, targets;
  layer::MicroBatch mb;

  explicit TwoStages(bool bf16 = false) {
    partition::PartitionSpec spec;
    spec.num_layers = 2;
    spec.virtual_stages = 2;
    engine::RankModelOptions options;
    options.dims = {32, 16, 2, 2, 8};
    options.device = cpu.get();
    options.bf16 = bf16;
    stage = std::make_unique<engine::RankModel>(options, partition::MakePartition(spec), 0);
    tokens.resize(2 * 8);
    targets.resize(2 * 8);
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int32_t>((i * 7) % 32);
      targets[i] = static_cast<int32_t>((i * 11 + 3) % 32);
    }
    mb = {2, 8, tokens.data(), targets.data(), 1.0 / 16, 0};
  }

  // Runs `flush`, written as short names ("F0@s0 SendAct0@s0>r0 ...").
  double Run(const std::string& flush) {
    const schedule::ScheduleSpec spec{schedule::Kind::kInterleaved1F1B, 1, 1, 2};
    engine::Executor executor(stage.get(), comm.get(), spec, 16, schedule::ParseActions(flush), {});
    return executor.RunFlush([this](int) -> const layer::MicroBatch& { return mb; });
  }
};

// Both stages of one micro-batch, forward and backward, through the local transport.
const char kForwardBackward[] =
    "F0@s0 SendAct0@s0>r0 RecvAct0@s1<r0 F0@s1 B0@s1 SendGrad0@s1>r0 RecvGrad0@s0<r0 B0@s0";

TEST(Executor, BatchedExchangesGiveTheWholeModelsLoss) {
  TwoStages two;
  // The send and the receive with the same peer go out as one exchange.
  const double loss = two.Run(kForwardBackward);
  TwoStages reference;
  EXPECT_EQ(loss, reference.stage->ForwardBackward(reference.mb));
  EXPECT_GT(loss, 0);
}

TEST(Executor, ASecondReceiveForTheSameMicroBatchAndStageThrows) {
  TwoStages two;
  // Within one exchange.
  EXPECT_THROW(
      {
        try {
          two.Run("F0@s0 SendAct0@s0>r0 RecvAct0@s1<r0 RecvAct0@s1<r0");
        } catch (const std::logic_error& error) {
          testutil::ExpectContains(error.what(),
                                   "RecvAct(micro-batch 0, stage 1): a second receive for this "
                                   "(micro-batch, stage) while the first is still unused");
          throw;
        }
      },
      std::logic_error);
  // And across exchanges: the first is still in the inbox when the second arrives.
  TwoStages again;
  EXPECT_THROW(again.Run("F0@s0 SendAct0@s0>r0 RecvAct0@s1<r0 F0@s0 SendAct0@s0>r0 "
                         "RecvAct0@s1<r0"),
               std::logic_error);
}

TEST(Executor, Bf16ActivationsTravelAsBf16) {
  TwoStages two(/*bf16=*/true);
  const int64_t before = two.comm->links().activation_bytes_sent();
  two.Run(kForwardBackward);
  // One activation and one gradient of 2x8x16, two bytes each.
  EXPECT_EQ(two.comm->links().activation_bytes_sent() - before, 2 * (2 * 8 * 16 * 2));
  TwoStages fp32;
  fp32.Run(kForwardBackward);
  EXPECT_EQ(fp32.comm->links().activation_bytes_sent(), 2 * (2 * 8 * 16 * 4));
}

// One rank of a two-replica data-parallel group with identical replicas: a reduction doubles its
// tensor, but only once it is tested or waited for (as if it were still in flight before). Records
// every reduction it starts: its size, and whether the stage still held activations then (that
// is, whether the backward was still running).
class FakeDpGroup : public comm::LocalGroup {
 public:
  explicit FakeDpGroup(const engine::RankModel* stage) : LocalGroup("dp"), stage_(stage) {}
  int size() const override { return 2; }
  int StartAllReduce(memory::Tensor* tensor, comm::ReduceOp, const std::string& what) override {
    started.push_back({tensor->numel(), stage_->in_flight() > 0, what});
    in_flight_.push_back(tensor);
    return static_cast<int>(in_flight_.size()) - 1;
  }
  bool Test(int handle) override {
    Complete(handle);
    return true;
  }
  void WaitAll() override {
    for (size_t i = 0; i < in_flight_.size(); ++i) Complete(static_cast<int>(i));
    in_flight_.clear();
  }

  struct Started {
    int64_t numel;
    bool during_backward;
    std::string what;
  };
  std::vector<Started> started;

 private:
  static void Double(memory::Tensor* tensor) {
    float* data = tensor->data<float>();
    for (int64_t i = 0; i < tensor->numel(); ++i) data[i] *= 2;
  }
  void Complete(int handle) {
    if (in_flight_.at(handle) == nullptr) return;
    Double(in_flight_[handle]);
    in_flight_[handle] = nullptr;
  }
  const engine::RankModel* stage_;
  std::vector<memory::Tensor*> in_flight_;
};

// The local transport with a FakeDpGroup for its dp group.
struct FakeDpComm {
  explicit FakeDpComm(const engine::RankModel* stage) {
    auto group = std::make_unique<FakeDpGroup>(stage);
    dp = group.get();
    transport = comm::MakeLocalPipelineComm(std::move(group));
  }
  FakeDpGroup* dp;  // owned by transport
  std::unique_ptr<comm::PipelineComm> transport;
};

// Every owned gradient of the stage, flattened in OwnedParams order.
std::vector<float> Gradients(engine::RankModel& stage) {
  std::vector<float> all;
  for (const engine::RankModel::NamedParam& named : stage.OwnedParams()) {
    const float* g = named.param->grad.data<float>();
    all.insert(all.end(), g, g + named.param->grad.numel());
  }
  return all;
}

// Both stages, two micro-batches, then the tail, with a dp group of two: returns the reduced
// gradients and what the transport saw.
struct DpRun {
  std::vector<float> reduced;
  std::vector<float> local;  // after the flush, before the tail
  std::vector<FakeDpGroup::Started> started;
  int overlapped = 0;
  size_t buckets = 0;
};

DpRun RunWithDp(bool overlap, int64_t bucket_bytes) {
  TwoStages two;
  FakeDpComm comm(two.stage.get());
  const schedule::ScheduleSpec spec{schedule::Kind::kInterleaved1F1B, 1, 2, 2};
  const std::string mb0 =
      "F0@s0 SendAct0@s0>r0 RecvAct0@s1<r0 F0@s1 B0@s1 SendGrad0@s1>r0 RecvGrad0@s0<r0 B0@s0 ";
  std::string mb1 = mb0;
  for (size_t at; (at = mb1.find("0@")) != std::string::npos;) mb1[at] = '1';
  engine::Executor executor(two.stage.get(), comm.transport.get(), spec, 16,
                            schedule::ParseActions(mb0 + mb1),
                            schedule::ParseActions("ReduceTied ReduceDp OptimizerStep"));
  executor.set_dp_reduce({overlap, bucket_bytes});
  two.stage->ZeroGrads();
  executor.RunFlush([&two](int) -> const layer::MicroBatch& { return two.mb; });
  DpRun run;
  run.local = Gradients(*two.stage);  // serial: nothing is reduced before the tail
  executor.RunTail([&] { run.reduced = Gradients(*two.stage); });
  run.started = comm.dp->started;
  run.overlapped = executor.dp_reducer().started_early();
  run.buckets = executor.dp_reducer().buckets().size();
  return run;
}

TEST(DpReduce, BucketsFollowReverseLayerOrderWithTheTiedWeightLast) {
  TwoStages two;
  // 1 byte: every parameter is a bucket of its own.
  const std::vector<engine::DpBucket> each = engine::MakeDpBuckets(*two.stage, 1);
  const std::vector<engine::RankModel::NamedParam> owned = two.stage->OwnedParams();
  ASSERT_EQ(each.size(), owned.size());
  EXPECT_EQ(each.front().params.front().name, "head/lnf.weight");
  EXPECT_EQ(each.back().params.front().name, "embedding/wte");
  EXPECT_TRUE(each.back().tied);
  EXPECT_EQ(each[each.size() - 2].params.front().name, "embedding/wpe");
  for (size_t b = 0; b + 1 < each.size(); ++b) {
    EXPECT_FALSE(each[b].tied) << b;
    EXPECT_GE(each[b].params.front().layer_id, each[b + 1].params.front().layer_id) << b;
  }
  // Large buckets: everything but the tied weight in one, the tied weight alone.
  const std::vector<engine::DpBucket> two_buckets = engine::MakeDpBuckets(*two.stage, 1 << 30);
  ASSERT_EQ(two_buckets.size(), 2u);
  EXPECT_EQ(two_buckets[0].layer_ids, (std::vector<int>{2, 1, 0, -1}));
  EXPECT_EQ(two_buckets[1].numel, 32 * 16);
  // A bucket closes before the parameter that would take it over the size.
  const int64_t block_bytes = 4 * (16 * 16 * 12 + 16 * 13);  // one block's parameters
  for (const engine::DpBucket& b : engine::MakeDpBuckets(*two.stage, block_bytes)) {
    EXPECT_TRUE(b.numel * 4 <= block_bytes || b.params.size() == 1) << b.params.front().name;
  }
}

TEST(DpReduce, OverlapStartsBucketsDuringTheBackwardAndSumsTheSame) {
  const int64_t bucket = 4 * 16 * 16 * 4;  // a few parameters per bucket
  const DpRun serial = RunWithDp(/*overlap=*/false, bucket);
  const DpRun overlapped = RunWithDp(/*overlap=*/true, bucket);
  ASSERT_GT(serial.buckets, 3u);
  // The same reductions, in the same order, give the same sums: bitwise.
  ASSERT_EQ(serial.started.size(), serial.buckets);
  ASSERT_EQ(overlapped.started.size(), serial.buckets);
  for (size_t b = 0; b < serial.buckets; ++b) {
    EXPECT_EQ(serial.started[b].numel, overlapped.started[b].numel) << b;
    EXPECT_EQ(serial.started[b].what, overlapped.started[b].what) << b;
    EXPECT_FALSE(serial.started[b].during_backward) << b;
  }
  EXPECT_EQ(serial.reduced, overlapped.reduced);
  EXPECT_NE(serial.local, overlapped.local) << "overlapped: some buckets were reduced already";
  ASSERT_EQ(serial.reduced.size(), serial.local.size());
  // wte (first in OwnedParams) still receives the head's part in ReduceTied; the rest is doubled.
  for (size_t i = 32 * 16; i < serial.local.size(); ++i)
    ASSERT_EQ(serial.reduced[i], 2 * serial.local[i]) << i;
  EXPECT_EQ(serial.overlapped, 0);
  // Stage 1's buckets (head, block 1) start while stage 0 still holds micro-batch 1's
  // activations, that is during the backward; the tied weight (which ReduceTied completes) only
  // in the tail.
  EXPECT_TRUE(overlapped.started.front().during_backward);
  EXPECT_FALSE(overlapped.started.back().during_backward);
  EXPECT_GT(overlapped.overlapped, 0);
  EXPECT_LT(overlapped.overlapped, static_cast<int>(overlapped.buckets));
  testutil::ExpectContains(overlapped.started.back().what, "embedding/wte");
  testutil::ExpectContains(overlapped.started.front().what, "ReduceDp: all-reduce of bucket 1 of " +
                                                                std::to_string(overlapped.buckets) +
                                                                " (head/lnf.weight");
}

}  // namespace
}  // namespace bigmac
