// The MPI transport under mpirun, on two ranks: a send returns before its receiver computes,
// and the non-blocking data-parallel sums (StartAllReduceSumDp, TestAllReduce, WaitAllReduces)
// complete later with exact sums, in f32, f64 and bf16, and a reduction that a peer never joins
// ends in the deadline; ZeRO-1's reduce-scatter and all-gather on four ranks. The test binary
// runs itself under mpirun: with --child=SCENARIO it is one rank of that scenario and prints
// "RESULT key=value" lines.
#include <gtest/gtest.h>
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/mpi_pipeline_comm.h"
#include "core/comm/mpi_world.h"
#include "core/device/device.h"
#include "core/memory/dtype.h"
#include "core/util/compute_progress.h"
#include "tests/testing/expect.h"
#include "tests/testing/run.h"

namespace bigmac {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::string Self() {
  char path[PATH_MAX] = {};
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  return n > 0 ? std::string(path, n) : "";
}

// ---------------------------------------------------------------- the ranks' side

// One rank of a world of pp x dp ranks (two, but for the shard scenario), with its transport
// (deadline in seconds).
struct TwoRanks {
  comm::Topology topology;
  comm::GroupComms comms;
  std::unique_ptr<device::Device> cpu;
  std::unique_ptr<comm::PipelineComm> comm;
  int rank;
  TwoRanks(const comm::MpiWorld& world, int pp, int dp, double deadline,
           int64_t max_message_bytes = 0)
      : topology(pp * dp, pp, dp, 1),
        comms(comm::GroupComms::Create(topology, world.rank())),
        cpu(device::MakeCpuDevice(world.rank(), int64_t{1} << 30)),
        comm(comm::MakeMpiPipelineComm(topology, world.rank(), comms, deadline, 200e-6, false,
                                       max_message_bytes)),
        rank(world.rank()) {}
  ~TwoRanks() {
    comm.reset();
    comms.Free();
  }
};

// Rank 0 sends 8 MiB (far past any eager limit) to rank 1, which computes (sleeps) 1 s before it
// receives.
int ChildSends(comm::MpiWorld& world) {
  TwoRanks two(world, 2, 1, 30);
  const int64_t n = int64_t{1} << 21;
  if (two.rank == 0) {
    memory::Tensor tensor(two.cpu.get(), {n}, memory::DType::kF32);
    for (int64_t i = 0; i < n; ++i) tensor.data<float>()[i] = static_cast<float>(i % 1000);
    const auto start = Clock::now();
    two.comm->links().Send(std::move(tensor), 1, comm::ActivationTag(1, 0), "SendAct0@s0>r1");
    std::printf("RESULT send_ms=%.3f\n", MsSince(start));
    two.comm->links().FinishSends();
    std::printf("RESULT delivered_ms=%.3f\n", MsSince(start));
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const memory::Tensor got = two.comm->links().Receive(
        0, comm::ActivationTag(1, 0), {n}, memory::DType::kF32, two.cpu.get(), "RecvAct0@s1<r0");
    bool same = true;
    for (int64_t i = 0; i < n; ++i) same = same && got.data<float>()[i] == float(i % 1000);
    std::printf("RESULT received_intact=%d\n", same ? 1 : 0);
  }
  return 0;
}

// Receives announced ahead (PeerLinks::Expect) start while the receiver computes. Rank 0 sends
// 8 MiB (a rendezvous, in messages of at most 1 MiB), then 3 floats where rank 1 expects 4, then
// two messages with one tag, then (after 1.5 s) 5 floats. Rank 1 announces them all, computes for
// 1 s while the compute progress runs (as the GEMMs call it), then receives: the large message
// arrived during the computation, the wrong one is reported as a Receive reports it, the two with
// one tag come in the order sent, and the late one, not there while rank 1 computed, arrives in
// its Receive.
int ChildEarly(comm::MpiWorld& world) {
  TwoRanks two(world, 2, 1, 30, int64_t{1} << 20);
  const int64_t n = int64_t{1} << 21;
  comm::PeerLinks& links = two.comm->links();
  const int big = comm::ActivationTag(1, 0), wrong = comm::ActivationTag(1, 1),
            twice = comm::ActivationTag(1, 2), late = comm::ActivationTag(1, 3);
  const auto filled = [&](std::vector<float> values) {
    memory::Tensor tensor(two.cpu.get(), {static_cast<int64_t>(values.size())},
                          memory::DType::kF32);
    std::copy(values.begin(), values.end(), tensor.data<float>());
    return tensor;
  };
  if (two.rank == 0) {
    memory::Tensor tensor(two.cpu.get(), {n}, memory::DType::kF32);
    for (int64_t i = 0; i < n; ++i) tensor.data<float>()[i] = static_cast<float>(i % 1000);
    links.Send(std::move(tensor), 1, big, "SendAct(micro-batch 0, stage 0)");
    links.Send(filled({0, 0, 0}), 1, wrong, "SendAct(micro-batch 1, stage 0)");
    links.Send(filled({1, 2}), 1, twice, "SendAct(micro-batch 2, stage 0)");
    links.Send(filled({3, 4}), 1, twice, "SendAct(micro-batch 2, stage 0)");
    // Rank 0 computes for 1.5 s too, with its progress: the sends go on meanwhile.
    const auto compute_end = Clock::now() + std::chrono::milliseconds(1500);
    while (Clock::now() < compute_end) {
      links.Progress();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    links.Send(filled({0, 0.5, 1, 1.5, 2}), 1, late, "SendAct(micro-batch 3, stage 0)");
    links.FinishSends();
    return 0;
  }
  links.set_record_messages(true);
  const auto incoming = [&](int tag, int64_t numel, const std::string& what) {
    return comm::Incoming{0, tag, {numel}, memory::DType::kF32, two.cpu.get(), what};
  };
  links.Expect(incoming(big, n, "RecvAct(micro-batch 0, stage 1) activation"));
  links.Expect(incoming(wrong, 4, "RecvAct(micro-batch 1, stage 1) activation"));
  links.Expect(incoming(twice, 2, "first of two"));
  links.Expect(incoming(twice, 2, "second of two"));
  links.Expect(incoming(late, 5, "RecvAct(micro-batch 3, stage 1) activation"));
  util::SetComputeProgress([&links] { links.Progress(); }, 0);
  const auto compute_end = Clock::now() + std::chrono::seconds(1);
  while (Clock::now() < compute_end) {
    util::ComputeProgress();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  util::SetComputeProgress(nullptr, 0);
  const Clock::time_point receive_called = Clock::now();
  const memory::Tensor got = links.Receive(0, big, {n}, memory::DType::kF32, two.cpu.get(),
                                           "RecvAct(micro-batch 0, stage 1) activation");
  bool same = true;
  for (int64_t i = 0; i < n; ++i) same = same && got.data<float>()[i] == float(i % 1000);
  std::printf("RESULT received_intact=%d\n", same ? 1 : 0);
  std::vector<comm::MessageSpan> spans = links.TakeMessageSpans();
  std::printf("RESULT spans=%zu\n", spans.size());
  if (!spans.empty()) {
    std::printf("RESULT span_name=%s\n", spans[0].name.c_str());
    std::printf("RESULT arrived_before_receive=%d\n", spans[0].end < receive_called ? 1 : 0);
    std::printf("RESULT arrived_in_compute=%d\n", spans[0].in_compute ? 1 : 0);
  }
  try {
    links.Receive(0, wrong, {4}, memory::DType::kF32, two.cpu.get(),
                  "RecvAct(micro-batch 1, stage 1) activation");
  } catch (const comm::TransportError& error) {
    std::printf("RESULT mismatch=%s\n", error.what());
  }
  for (const char* which : {"first of two", "second of two"}) {
    const memory::Tensor pair =
        links.Receive(0, twice, {2}, memory::DType::kF32, two.cpu.get(), which);
    std::printf("RESULT twice=%g,%g\n", pair.data<float>()[0], pair.data<float>()[1]);
  }
  const Clock::time_point late_called = Clock::now();
  const memory::Tensor five = links.Receive(0, late, {5}, memory::DType::kF32, two.cpu.get(),
                                            "RecvAct(micro-batch 3, stage 1) activation");
  std::printf("RESULT late=%g,%g\n", five.data<float>()[1], five.data<float>()[4]);
  spans = links.TakeMessageSpans();
  std::printf("RESULT late_arrived_in_receive=%d\n",
              !spans.empty() && spans.back().end > late_called && !spans.back().in_compute ? 1 : 0);
  std::printf("RESULT still_expected=%zu\n", links.expected_receives());
  return 0;
}

// Three reductions (f32, f64, bf16). Rank 1 starts its own 1 s late, so rank 0's have to wait
// for it: started at once, not complete when first tested, exact once waited for.
int ChildReduce(comm::MpiWorld& world) {
  TwoRanks two(world, 1, 2, 30);
  comm::Group& dp = two.comm->dp();
  const int r = two.rank;
  const int64_t n = 300000;
  memory::Tensor f32(two.cpu.get(), {n}, memory::DType::kF32);
  memory::Tensor f64(two.cpu.get(), {7}, memory::DType::kF64);
  memory::Tensor bf16(two.cpu.get(), {5}, memory::DType::kBF16);
  for (int64_t i = 0; i < n; ++i) f32.data<float>()[i] = 0.25f * float(i % 97) * float(r + 1);
  for (int64_t i = 0; i < 7; ++i) f64.data<double>()[i] = 0.125 * double(i) + r;
  for (int64_t i = 0; i < 5; ++i)
    bf16.data<memory::BFloat16>()[i] = memory::ToBFloat16(float(i) + 0.5f * r);
  if (r == 1) std::this_thread::sleep_for(std::chrono::seconds(1));
  const auto start = Clock::now();
  const int a = dp.StartAllReduce(&f32, comm::ReduceOp::kSum, "bucket 1 of 3");
  const int b = dp.StartAllReduce(&f64, comm::ReduceOp::kSum, "bucket 2 of 3");
  const int c = dp.StartAllReduce(&bf16, comm::ReduceOp::kSum, "bucket 3 of 3");
  std::printf("RESULT handles=%d,%d,%d\n", a, b, c);
  std::printf("RESULT start_ms=%.3f\n", MsSince(start));
  if (r == 0) std::printf("RESULT complete_at_once=%d\n", dp.Test(a) ? 1 : 0);
  // Rank 1 polls its bf16 reduction to completion (the result comes back through Test).
  if (r == 1) {
    while (!dp.Test(c)) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  dp.WaitAll();
  std::printf("RESULT waited_ms=%.3f\n", MsSince(start));
  bool exact = true;
  for (int64_t i = 0; i < n; ++i) exact = exact && f32.data<float>()[i] == 0.75f * float(i % 97);
  for (int64_t i = 0; i < 7; ++i) exact = exact && f64.data<double>()[i] == 0.25 * double(i) + 1;
  for (int64_t i = 0; i < 5; ++i)
    exact = exact && memory::ToFloat(bf16.data<memory::BFloat16>()[i]) == 2 * float(i) + 0.5f;
  std::printf("RESULT exact=%d\n", exact ? 1 : 0);
  // A second round numbers its handles from 0 again.
  std::printf("RESULT next_handle=%d\n", dp.StartAllReduce(&f64, comm::ReduceOp::kSum, "again"));
  dp.WaitAll();
  return 0;
}

// Rank 1 joins rank 0's reduction only after 3 s; rank 0 waits with a deadline of 2 s (twice).
int ChildDeadline(comm::MpiWorld& world) {
  TwoRanks two(world, 1, 2, 2);
  memory::Tensor tensor(two.cpu.get(), {1000}, memory::DType::kF32);
  tensor.Zero();
  if (two.rank == 1) std::this_thread::sleep_for(std::chrono::seconds(3));
  two.comm->dp().StartAllReduce(&tensor, comm::ReduceOp::kSum,
                                "ReduceDp: all-reduce of bucket 2 of 4 (block 1/mlp)");
  try {
    two.comm->dp().WaitAll();
    std::printf("RESULT deadline=0\n");
  } catch (const comm::DeadlineError& error) {
    std::printf("RESULT deadline=1\nRESULT message=%s\n", error.what());
    two.comm->dp().WaitAll();  // rank 1 has joined by now: both finish cleanly
  }
  return 0;
}

// Element i of dp rank r's gradient: values whose float sum depends on the order.
float Piece(int r, int64_t i) {
  return std::ldexp(1.0f + float((i * 7919 + r * 104729) % 1000) / 1000.0f, int((i + r) % 24) - 12);
}

// ZeRO-1's collectives on four ranks (dp = 4): the reduce-scatter's shard, the all-reduce (also
// of a numel that 4 does not divide) and the sum in dp-rank order ((g0 + g1) + g2) + g3 agree
// bitwise; the all-gather brings every rank's shard, whatever the other elements held.
int ChildShards(comm::MpiWorld& world) {
  TwoRanks four(world, 1, 4, 30);
  comm::Group& dp = four.comm->dp();
  const int r = four.rank;
  const int64_t n = 4 * 1001;
  const int64_t odd = n - 3;
  auto filled = [&](int64_t numel) {
    memory::Tensor t(four.cpu.get(), {numel}, memory::DType::kF32);
    for (int64_t i = 0; i < numel; ++i) t.data<float>()[i] = Piece(r, i);
    return t;
  };
  auto ordered = [](int64_t i) {
    float sum = Piece(0, i);
    for (int q = 1; q < 4; ++q) sum += Piece(q, i);
    return sum;
  };
  memory::Tensor scattered = filled(n), reduced = filled(n), reduced_odd = filled(odd);
  memory::Tensor gathered(four.cpu.get(), {n}, memory::DType::kF32);
  const comm::ShardRange own = comm::DpShardOf(n, 4, r);
  for (int64_t i = 0; i < n; ++i)
    gathered.data<float>()[i] = own.begin <= i && i < own.end ? ordered(i) : std::nanf("");
  dp.StartReduceScatter(&scattered, "reduce-scatter");
  dp.StartAllReduce(&reduced, comm::ReduceOp::kSum, "all-reduce");
  dp.StartAllReduce(&reduced_odd, comm::ReduceOp::kSum, "all-reduce of an odd numel");
  dp.StartAllGather(&gathered, "all-gather");
  dp.WaitAll();
  bool rs = true, ar = true, ag = true;
  for (int64_t i = own.begin; i < own.end; ++i) rs = rs && scattered.data<float>()[i] == ordered(i);
  for (int64_t i = 0; i < n; ++i) ar = ar && reduced.data<float>()[i] == ordered(i);
  for (int64_t i = 0; i < odd; ++i) ar = ar && reduced_odd.data<float>()[i] == ordered(i);
  for (int64_t i = 0; i < n; ++i) ag = ag && gathered.data<float>()[i] == ordered(i);
  std::printf("RESULT shard=%lld-%lld\nRESULT exact=%d,%d,%d\n", (long long)own.begin,
              (long long)own.end, rs, ar, ag);
  return 0;
}

// ---------------------------------------------------------------- the test's side

testutil::RunResult RunScenario(const std::string& scenario, int ranks = 2) {
  return testutil::RunCommand(testutil::Mpirun(ranks) + " " + Self() + " --child=" + scenario, 120);
}

// The values of every "RESULT key=..." line, in the order printed.
std::vector<std::string> Results(const std::string& output, const std::string& key) {
  std::vector<std::string> values;
  const std::string needle = "RESULT " + key + "=";
  for (size_t at = output.find(needle); at != std::string::npos; at = output.find(needle, at + 1)) {
    const size_t begin = at + needle.size();
    values.push_back(output.substr(begin, output.find('\n', begin) - begin));
  }
  return values;
}

TEST(MpiTransport, ASendReturnsBeforeTheReceiverComputes) {
  const testutil::RunResult r = RunScenario("sends");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(Results(r.output, "send_ms").size(), 1u) << r.output;
  // The receiver sleeps 1 s before it receives; the send returns long before, and only
  // FinishSends waits for the delivery.
  EXPECT_LT(std::stod(Results(r.output, "send_ms")[0]), 300) << r.output;
  EXPECT_GT(std::stod(Results(r.output, "delivered_ms")[0]), 900) << r.output;
  EXPECT_EQ(Results(r.output, "received_intact"), std::vector<std::string>{"1"}) << r.output;
}

// Without single-copy and over TCP: both make the 8 MiB a rendezvous, which moves only while both
// ranks are inside MPI.
TEST(MpiTransport, AnExpectedReceiveMovesWhileTheReceiverComputes) {
  for (const std::string path : {"copy", "tcp"}) {
    SCOPED_TRACE(path);
    const testutil::RunResult r =
        testutil::RunCommand(testutil::Mpirun(2, path) + " " + Self() + " --child=early", 120);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(Results(r.output, "received_intact"), std::vector<std::string>{"1"}) << r.output;
    EXPECT_EQ(Results(r.output, "spans"), std::vector<std::string>{"1"}) << r.output;
    EXPECT_EQ(
        Results(r.output, "span_name"),
        std::vector<std::string>{"RecvAct(micro-batch 0, stage 1) activation from pp rank 0"});
    EXPECT_EQ(Results(r.output, "arrived_before_receive"), std::vector<std::string>{"1"})
        << r.output;
    EXPECT_EQ(Results(r.output, "arrived_in_compute"), std::vector<std::string>{"1"}) << r.output;
    // The header that does not match is reported as an unannounced Receive reports it.
    EXPECT_EQ(Results(r.output, "mismatch"),
              std::vector<std::string>{"RecvAct(micro-batch 1, stage 1) activation from pp rank "
                                       "0: expected f32[4], got f32[3] (64 bytes)"})
        << r.output;
    EXPECT_EQ(Results(r.output, "twice"), (std::vector<std::string>{"1,2", "3,4"})) << r.output;
    EXPECT_EQ(Results(r.output, "late"), std::vector<std::string>{"0.5,2"}) << r.output;
    EXPECT_EQ(Results(r.output, "late_arrived_in_receive"), std::vector<std::string>{"1"})
        << r.output;
    EXPECT_EQ(Results(r.output, "still_expected"), std::vector<std::string>{"0"}) << r.output;
  }
}

TEST(MpiTransport, NonBlockingDpSumsStartAtOnceAndCompleteExactly) {
  const testutil::RunResult r = RunScenario("reduce");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Results(r.output, "handles"), (std::vector<std::string>{"0,1,2", "0,1,2"}));
  for (const std::string& ms : Results(r.output, "start_ms")) EXPECT_LT(std::stod(ms), 300);
  // Rank 0 started 1 s before rank 1: its first reduction cannot have completed at once, and
  // its wait lasted until rank 1 joined.
  EXPECT_EQ(Results(r.output, "complete_at_once"), std::vector<std::string>{"0"}) << r.output;
  const std::vector<std::string> waited = Results(r.output, "waited_ms");
  ASSERT_EQ(waited.size(), 2u) << r.output;
  EXPECT_GT(std::max(std::stod(waited[0]), std::stod(waited[1])), 800) << r.output;
  EXPECT_EQ(Results(r.output, "exact"), (std::vector<std::string>{"1", "1"})) << r.output;
  EXPECT_EQ(Results(r.output, "next_handle"), (std::vector<std::string>{"0", "0"}));
}

TEST(MpiTransport, ReduceScatterAndAllGatherAgreeBitwiseWithTheAllReduceInRankOrder) {
  const testutil::RunResult r = RunScenario("shards", 4);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> shards = Results(r.output, "shard");
  std::sort(shards.begin(), shards.end());
  EXPECT_EQ(shards, (std::vector<std::string>{"0-1001", "1001-2002", "2002-3003", "3003-4004"}));
  EXPECT_EQ(Results(r.output, "exact"), std::vector<std::string>(4, "1,1,1")) << r.output;
}

TEST(MpiTransport, AReductionThatAPeerDoesNotJoinEndsInTheDeadline) {
  const testutil::RunResult r = RunScenario("deadline");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Results(r.output, "deadline"), (std::vector<std::string>{"1", "0"})) << r.output;
  ASSERT_FALSE(Results(r.output, "message").empty()) << r.output;
  const std::string message = Results(r.output, "message")[0];
  testutil::ExpectContains(message, "ReduceDp: all-reduce of bucket 2 of 4 (block 1/mlp)");
  testutil::ExpectContains(message, "(reduction 1 of 1 started this step)");
  testutil::ExpectContains(message, "past the deadline of 2 s (train.comm_timeout_seconds)");
}

}  // namespace
}  // namespace bigmac

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--child=", 8) != 0) continue;
    const std::string scenario = argv[i] + 8;
    bigmac::comm::MpiWorld world(&argc, &argv);
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    if (scenario == "sends") return bigmac::ChildSends(world);
    if (scenario == "early") return bigmac::ChildEarly(world);
    if (scenario == "reduce") return bigmac::ChildReduce(world);
    if (scenario == "deadline") return bigmac::ChildDeadline(world);
    if (scenario == "shards") return bigmac::ChildShards(world);
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
