// The executor against hand-written action lists on one process (the local transport): batched
// exchanges, the duplicate-receive guard, the device-side loss.
#include "core/engine/executor.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "core/comm/pipeline_comm.h"
#include "core/device/device.h"
#include "core/engine/stage.h"
#include "core/partition/partition.h"
#include "tests/testing/expect.h"

namespace bigmac {
namespace {

// Two stages of a 2-block GPT on one rank (virtual stages), so activations travel over the local
// transport between stage 0 and stage 1.
struct TwoStages {
  std::unique_ptr<device::Device> cpu = device::MakeCpuDevice(0, int64_t{1} << 28);
  std::unique_ptr<comm::PipelineComm> comm = comm::MakeLocalPipelineComm();
  std::unique_ptr<engine::Stage> stage;
  std::vector<int32_t> tokens, targets;
  layer::MicroBatch mb;

  explicit TwoStages(bool bf16 = false) {
    partition::PartitionSpec spec;
    spec.num_layers = 2;
    spec.virtual_stages = 2;
    engine::StageOptions options;
    options.dims = {32, 16, 2, 2, 8};
    options.device = cpu.get();
    options.bf16 = bf16;
    stage = std::make_unique<engine::Stage>(options, partition::MakePartition(spec), 0);
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
  const int64_t before = two.comm->activation_bytes_sent();
  two.Run(kForwardBackward);
  // One activation and one gradient of 2x8x16, two bytes each.
  EXPECT_EQ(two.comm->activation_bytes_sent() - before, 2 * (2 * 8 * 16 * 2));
  TwoStages fp32;
  fp32.Run(kForwardBackward);
  EXPECT_EQ(fp32.comm->activation_bytes_sent(), 2 * (2 * 8 * 16 * 4));
}

}  // namespace
}  // namespace bigmac
