// The transport: the automatic choice and its forcing (pure), and the MPI path that stages device
// tensors through host buffers, run under mpirun with the CPU device (tests/nccl_pingpong).
#include "core/comm/transport.h"

#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "tests/testing/run.h"

namespace bigmac::comm {
namespace {

TransportRequest Request(const std::string& requested, const std::string& backend, int on_device,
                         int most) {
  TransportRequest request;
  request.requested = requested;
  request.source = requested == "auto" ? "default" : "launch: BIGMAC_TRANSPORT";
  device::ParseBackend(backend, &request.backend);
  request.backend_source = "--set";
  request.ranks_on_device = on_device;
  request.max_ranks_on_device = most;
  request.device = backend + ":0";
  return request;
}

TransportChoice Choose(const TransportRequest& request) {
  TransportChoice choice;
  std::string error;
  EXPECT_TRUE(ChooseTransport(request, &choice, &error)) << error;
  return choice;
}

std::string Refusal(const TransportRequest& request) {
  TransportChoice choice;
  std::string error;
  EXPECT_FALSE(ChooseTransport(request, &choice, &error)) << choice.ToString();
  return error;
}

TEST(TransportChoice, AutoIsNcclWithAGpuPerRankAndStagedMpiWhenRanksShare) {
  EXPECT_EQ(Choose(Request("auto", "cuda", 1, 1)).ToString(), "transport=nccl");
  EXPECT_EQ(Choose(Request("auto", "cuda", 2, 2)).ToString(),
            "transport=mpi-staged (2 ranks share cuda:0)");
  // Another node shares: every rank of the job takes the same transport.
  EXPECT_EQ(Choose(Request("auto", "cuda", 1, 3)).ToString(),
            "transport=mpi-staged (3 ranks share a GPU elsewhere in the job)");
  EXPECT_EQ(Choose(Request("auto", "cpu", 1, 1)).ToString(), "transport=mpi");
}

TEST(TransportChoice, ForcedByTheLaunchLayer) {
  EXPECT_EQ(Choose(Request("mpi", "cuda", 1, 1)).ToString(),
            "transport=mpi-staged (forced by device.transport=mpi (launch: BIGMAC_TRANSPORT))");
  EXPECT_EQ(Choose(Request("mpi", "cuda", 2, 2)).kind, TransportKind::kMpiStaged);
  EXPECT_EQ(Choose(Request("nccl", "cuda", 1, 1)).ToString(),
            "transport=nccl (forced by device.transport=nccl (launch: BIGMAC_TRANSPORT))");
  EXPECT_EQ(Choose(Request("mpi", "cpu", 1, 1)).ToString(), "transport=mpi");
}

TEST(TransportChoice, NcclIsRefusedOnTheCpuBackendAndOnASharedGpu) {
  EXPECT_EQ(Refusal(Request("nccl", "cpu", 1, 1)),
            "device.transport=nccl (launch: BIGMAC_TRANSPORT) needs device.backend=cuda, but "
            "device.backend=cpu (--set) (rule: NCCL moves GPU memory; the cpu backend's tensors "
            "travel over MPI: set BIGMAC_TRANSPORT to auto or mpi, or unset it)");
  const std::string shared = Refusal(Request("nccl", "cuda", 2, 2));
  EXPECT_EQ(shared.rfind("device.transport=nccl (launch: BIGMAC_TRANSPORT) cannot run: 2 ranks "
                         "share cuda:0 (BIGMAC_SHARE_DEVICES=1), and NCCL does not support two "
                         "ranks on one GPU",
                         0),
            0u)
      << shared;
  EXPECT_NE(Refusal(Request("nccl", "cuda", 1, 2)).find("2 ranks share a GPU elsewhere"),
            std::string::npos);
  EXPECT_EQ(Refusal(Request("infiniband", "cuda", 1, 1)),
            "device.transport=infiniband (launch: BIGMAC_TRANSPORT) is not one of: auto, nccl, "
            "mpi");
}

TEST(TransportChoice, RanksOnDeviceFollowsChooseDevice) {
  // ChooseDevice shares only with fewer GPUs than local ranks: local rank r uses r % count.
  EXPECT_EQ(RanksOnDevice(0, 4, 4), 1);
  EXPECT_EQ(RanksOnDevice(3, 4, 8), 1);
  EXPECT_EQ(RanksOnDevice(0, 2, 1), 2);
  EXPECT_EQ(RanksOnDevice(1, 3, 2), 1);  // ranks 0 and 2 on GPU 0, rank 1 alone on GPU 1
  EXPECT_EQ(RanksOnDevice(2, 3, 2), 2);
  EXPECT_EQ(RanksOnDevice(0, 1, 0), 1);
}

// The MPI path's staging (what device tensors take on CUDA, through pinned buffers there) on the
// CPU device: ping-pong, an exchange both ways, the all-reduce.
std::string PingPong(const std::string& args, const std::string& env = "") {
  const testutil::RunResult r =
      testutil::RunCommand(env + " " + testutil::Mpirun(2) + " " +
                               testutil::Runfile("tests/nccl_pingpong") + " " + args + " 2>&1",
                           120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

TEST(StagedTransport, PingPongExchangeAndAllReduceOnTheCpuDevice) {
  const std::string out =
      PingPong("--backend cpu --transport mpi --stage-host --iterations 50 --elements 100000");
  EXPECT_NE(out.find("pingpong: rank 0 transport=mpi device=cpu:0"), std::string::npos) << out;
  EXPECT_NE(out.find("ping-pong: 50 round trips of 200000 bytes bf16"), std::string::npos) << out;
  EXPECT_NE(out.find(" ok | exchange: 4/4 checksums ok"), std::string::npos) << out;
  EXPECT_NE(out.find("all-reduce: 131072 sums, 0 wrong"), std::string::npos) << out;
  EXPECT_NE(out.find("tp group: 4099 maxima, 2 slices, a sum, 0 wrong"), std::string::npos) << out;
  EXPECT_NE(out.find("pingpong: PASS"), std::string::npos) << out;
  // 100 ping-pong messages and 8 exchanged reuse a few buffers instead of taking one each.
  std::smatch match;
  ASSERT_TRUE(std::regex_search(out, match, std::regex(R"(staging_buffers=(\d+) \(pageable)")))
      << out;
  EXPECT_GE(std::stoi(match[1]), 1);
  EXPECT_LE(std::stoi(match[1]), 8) << out;
}

TEST(StagedTransport, SplitMessagesStillMatchTheirChecksums) {
  // 1 GiB message splits, made small: every payload is several messages.
  const std::string out = PingPong("--backend cpu --transport mpi --stage-host --iterations 5",
                                   "BIGMAC_TEST_MAX_MESSAGE_BYTES=65536");
  EXPECT_NE(out.find("pingpong: PASS"), std::string::npos) << out;
  EXPECT_NE(out.find("checksum"), std::string::npos) << out;
}

TEST(StagedTransport, NcclIsRefusedOnTheCpuBackend) {
  const testutil::RunResult r =
      testutil::RunCommand(testutil::Mpirun(2) + " " + testutil::Runfile("tests/nccl_pingpong") +
                               " --backend cpu --transport nccl 2>&1",
                           60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("needs device.backend=cuda"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace bigmac::comm
