// nccl_pingpong: two ranks through the transport BigMac trains with (docs/transport.md), checked
// by checksums. launch/device_check.sh runs it on the GPU machine (NCCL when there are two GPUs;
// the MPI path staged through pinned host memory with both ranks on one GPU), tests/
// transport_test.cc on the CPU (the staged path with the CPU device).
//
//   mpirun -np 2 nccl_pingpong [--transport auto|nccl|mpi] [--backend cuda|cpu] [--iterations N]
//       [--elements E] [--stage-host] [--share-gpus] [--deadline SECONDS]
//
// Phases, each on the real PipelineComm (headers, tags, deadlines and all):
//   1. ping-pong: rank 0 sends a bf16 tensor of E elements (finite random bit patterns) to rank 1,
//      which sends back what it got; N round trips, then its checksum against the original's.
//   2. exchange: each rank sends four tensors (bf16 and f32, four shapes, contents of its own) in
//      one Exchange and receives the peer's four in it (one NCCL group both ways); every checksum
//      is checked.
//   3. all-reduce: a second layout with dp = 2 sums an f32 and a bf16 tensor of small integers
//      (exact) over both ranks: the f32 one blocking, the bf16 one non-blocking (Start/Test/Wait).
// Rank 0 prints one line per phase and the verdict: "pingpong: PASS ...", "pingpong: FAIL ..." or
// "pingpong: SKIPPED (...)" (NCCL with fewer GPUs than ranks: it refuses two ranks on one GPU).
// Exit 0 on PASS or SKIPPED, 1 on FAIL, 2 on a usage error.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/cli/fault_env.h"
#include "core/comm/cuda/cuda_probe.h"
#include "core/comm/device.h"
#include "core/comm/mpi_pipeline_comm.h"
#include "core/comm/mpi_world.h"
#include "core/comm/nccl/nccl_pipeline_comm.h"
#include "core/comm/topology.h"
#include "core/comm/transport.h"
#include "core/device/cuda/cuda_device.h"
#include "core/device/device.h"
#include "core/memory/tensor.h"

namespace bigmac {
namespace {

using memory::DType;
using memory::Tensor;

struct Options {
  std::string transport = "auto";
  std::string backend = "cuda";
  int iterations = 100;
  int64_t elements = int64_t{1} << 20;
  bool stage_host = false;
  bool share_gpus = false;
  double deadline = 60;
};

uint64_t Checksum(const std::vector<char>& bytes) {
  uint64_t hash = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char byte : bytes) {
    hash ^= byte;
    hash *= 1099511628211ULL;
  }
  return hash;
}

// Host bytes of a tensor of `dtype` and `numel` elements: finite values from (seed, index).
std::vector<char> Pattern(DType dtype, int64_t numel, uint64_t seed) {
  std::vector<char> bytes(numel * memory::DTypeSize(dtype));
  std::mt19937_64 random(seed);
  for (int64_t i = 0; i < numel; ++i) {
    const uint64_t h = random();
    if (dtype == DType::kBF16) {
      const uint16_t bits = static_cast<uint16_t>(h) & 0xff7f;  // exponent < 0xff: finite
      std::memcpy(bytes.data() + 2 * i, &bits, 2);
    } else {
      const uint32_t bits = static_cast<uint32_t>(h) & 0xbfffffffu;  // exponent < 0xff
      std::memcpy(bytes.data() + 4 * i, &bits, 4);
    }
  }
  return bytes;
}

Tensor Upload(device::Device* device, const std::vector<int64_t>& shape, DType dtype,
              const std::vector<char>& bytes) {
  Tensor tensor(device, shape, dtype);
  tensor.CopyFromHost(bytes.data());
  device->Synchronize();  // `bytes` may go once this returns
  return tensor;
}

std::vector<char> Download(const Tensor& tensor) {
  std::vector<char> bytes(tensor.bytes());
  tensor.CopyToHost(bytes.data());
  return bytes;
}

std::string Hex(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

std::string Staging(const comm::PipelineComm& transport, device::Device* device) {
  const auto* mpi = dynamic_cast<const comm::MpiLinks*>(&transport.links());
  if (mpi == nullptr) return "";
  return " staging_buffers=" + std::to_string(mpi->staging_buffers()) + " (" +
         (device->host_staging_pinned() ? "pinned" : "pageable") + ", " +
         std::to_string(mpi->staging_bytes() >> 10) + " KiB)";
}

// Both ranks agree on a verdict; rank 0 prints it.
int Finish(const comm::MpiWorld& world, bool ok, const std::string& line) {
  const std::vector<std::string> lines = world.GatherToRoot(line);
  int mine = ok ? 1 : 0;
  int all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (world.rank() == 0) {
    for (const std::string& text : lines) {
      if (!text.empty()) std::printf("%s\n", text.c_str());
    }
    std::printf("pingpong: %s\n", all ? "PASS" : "FAIL (see the lines above)");
    std::fflush(stdout);
  }
  return all ? 0 : 1;
}

int Skip(const comm::MpiWorld& world, const std::string& why) {
  if (world.rank() == 0) {
    std::printf("pingpong: SKIPPED (%s)\n", why.c_str());
    std::fflush(stdout);
  }
  return 0;
}

int Run(const comm::MpiWorld& world, const Options& options) {
  const int rank = world.rank();
  const int peer = 1 - rank;
  const util::FaultPlan faults = cli::FaultPlanFromEnvironment();  // BIGMAC_TEST_MAX_MESSAGE_BYTES
  device::Backend backend = device::Backend::kCpu;
  if (!device::ParseBackend(options.backend, &backend))
    return Finish(world, false, "pingpong: --backend " + options.backend + ": not cpu or cuda");
  const bool cuda = backend == device::Backend::kCuda;
  const int cuda_devices = cuda ? comm::cuda::DeviceCount() : 0;
  if (cuda && cuda_devices == 0) return Skip(world, "no CUDA device visible");
  if (cuda && options.transport == "nccl" && cuda_devices < world.local_size())
    return Skip(world, "transport=nccl needs 2 GPUs: " + std::to_string(cuda_devices) +
                           " visible, and NCCL refuses two ranks on one GPU");
  const char* share_env = std::getenv(comm::kShareDevicesEnv);
  const bool share = options.share_gpus || (share_env && std::string(share_env) == "1");
  comm::DevicePlacement placement;
  std::string error;
  if (!comm::ChooseDevice(backend, world.local_rank(), world.local_size(), cuda_devices, share,
                          &placement, &error)) {
    return Finish(world, false, "pingpong: rank " + std::to_string(rank) + ": " + error);
  }
  comm::TransportRequest request;
  request.requested = options.transport;
  request.source = "--transport";
  request.backend_source = "--backend";
  comm::TransportChoice choice;
  if (!comm::ChooseJobTransport(world, request, placement, cuda_devices, &choice, &error))
    return Finish(world, false, "pingpong: rank " + std::to_string(rank) + ": " + error);

  std::unique_ptr<device::Device> device =
      cuda ? device::cuda::MakeCudaDevice(placement.index, rank)
           : device::MakeCpuDevice(placement.index, int64_t{4} << 30);
  const double spin = 2e-3;
  bool ok = true;
  std::string report = "pingpong: rank " + std::to_string(rank) + " " + choice.ToString() +
                       " device=" + placement.ToString() +
                       (cuda ? " (" + device::cuda::Describe(device.get()) + ")" : "");
  if (rank == 0 && choice.kind == comm::TransportKind::kNccl)
    report += " nccl=" + std::to_string(comm::NcclVersion());

  // 1. Ping-pong on a pipeline of two stages.
  const comm::Topology pipeline(2, 2, 1, 1);
  comm::GroupComms pipeline_comms = comm::GroupComms::Create(pipeline, rank);
  {
    std::unique_ptr<comm::PipelineComm> transport = comm::MakePipelineComm(
        choice.kind, pipeline, rank, pipeline_comms, device.get(), options.deadline, spin,
        options.stage_host, faults.max_message_bytes);
    const std::vector<int64_t> shape = {options.elements};
    const std::vector<char> original = Pattern(DType::kBF16, options.elements, 7);
    const uint64_t expected = Checksum(original);
    Tensor ball = rank == 0 ? Upload(device.get(), shape, DType::kBF16, original) : Tensor();
    transport->world().AllOk(true);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < options.iterations; ++i) {
      if (rank == 0) {
        transport->links().Send(std::move(ball), peer, 1, "ping " + std::to_string(i));
        ball = transport->links().Receive(peer, 2, shape, DType::kBF16, device.get(),
                                          "pong " + std::to_string(i));
      } else {
        Tensor got = transport->links().Receive(peer, 1, shape, DType::kBF16, device.get(),
                                                "ping " + std::to_string(i));
        transport->links().Send(std::move(got), peer, 2, "pong " + std::to_string(i));
      }
    }
    transport->links().FinishSends();
    device->Synchronize();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (rank == 0) {
      const uint64_t got = Checksum(Download(ball));
      const bool same = got == expected;
      ok = ok && same;
      char numbers[160];
      std::snprintf(numbers, sizeof(numbers),
                    " | ping-pong: %d round trips of %lld bytes bf16, %.1f us each, %.2f GB/s",
                    options.iterations, static_cast<long long>(options.elements * 2),
                    1e6 * seconds / std::max(1, options.iterations),
                    2.0 * options.iterations * options.elements * 2 / seconds / 1e9);
      report += numbers + std::string(", checksum ") + Hex(got) +
                (same ? " ok" : " WRONG (expected " + Hex(expected) + ")");
    }

    // 2. One exchange both ways (in sending order: NCCL matches a pair's messages by order).
    auto spec = [](int k) {
      return std::pair<std::vector<int64_t>, DType>{{1 + k, 97 + 31 * k},
                                                    k % 2 ? DType::kF32 : DType::kBF16};
    };
    std::vector<comm::Outgoing> sends;
    std::vector<comm::Incoming> receives;
    for (int k = 0; k < 4; ++k) {
      const auto [s, dtype] = spec(k);
      const int64_t numel = s[0] * s[1];
      sends.push_back({Upload(device.get(), s, dtype, Pattern(dtype, numel, 100 * rank + k)), peer,
                       100 + k, "exchange message " + std::to_string(k)});
    }
    for (int k = 0; k < 4; ++k) {
      const auto [s, dtype] = spec(k);
      receives.push_back(
          {peer, 100 + k, s, dtype, device.get(), "exchange message " + std::to_string(k)});
    }
    std::vector<Tensor> received = transport->links().Exchange(std::move(sends), receives);
    transport->links().FinishSends();
    int right = 0;
    for (size_t j = 0; j < received.size(); ++j) {
      const int k = static_cast<int>(j);
      const auto [s, dtype] = spec(k);
      if (Checksum(Download(received[j])) == Checksum(Pattern(dtype, s[0] * s[1], 100 * peer + k)))
        ++right;
    }
    ok = ok && right == 4;
    report += " | exchange: " + std::to_string(right) + "/4 checksums ok" +
              Staging(*transport, device.get());
  }

  // 3. All-reduce over a data-parallel pair.
  const comm::Topology data_parallel(2, 1, 2, 1);
  comm::GroupComms dp_comms = comm::GroupComms::Create(data_parallel, rank);
  {
    std::unique_ptr<comm::PipelineComm> transport = comm::MakePipelineComm(
        choice.kind, data_parallel, rank, dp_comms, device.get(), options.deadline, spin,
        options.stage_host, faults.max_message_bytes);
    const int64_t n = std::min<int64_t>(options.elements, int64_t{1} << 16);
    std::vector<float> f32(n);
    std::vector<memory::BFloat16> bf16(n);
    for (int64_t i = 0; i < n; ++i) {
      f32[i] = static_cast<float>((rank + 1) * (i % 1000));
      bf16[i] = memory::ToBFloat16(static_cast<float>((rank + 1) * (i % 50)));
    }
    Tensor a(device.get(), {n}, DType::kF32);
    a.CopyFromHost(f32.data());
    Tensor b(device.get(), {n}, DType::kBF16);
    b.CopyFromHost(bf16.data());
    device->Synchronize();
    // The f32 sum blocking; the bf16 one non-blocking, as the overlapped backward starts it
    // (tested once, then waited for).
    transport->dp().AllReduce(&a, comm::ReduceOp::kSum, "the ping-pong's f32 sum");
    const int handle =
        transport->dp().StartAllReduce(&b, comm::ReduceOp::kSum, "the ping-pong's bf16 sum");
    transport->Progress();
    transport->dp().Test(handle);
    transport->dp().WaitAll();
    a.CopyToHost(f32.data());
    b.CopyToHost(bf16.data());
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
      // (1 + 2) * v: small integers, exact in f32 and bf16.
      if (f32[i] != static_cast<float>(3 * (i % 1000))) ++wrong;
      if (memory::ToFloat(bf16[i]) != static_cast<float>(3 * (i % 50))) ++wrong;
    }
    ok = ok && wrong == 0;
    report +=
        " | all-reduce: " + std::to_string(2 * n) + " sums, " + std::to_string(wrong) + " wrong";
  }
  dp_comms.Free();

  // 4. The tensor-parallel pair: a max all-reduce (the vocab-parallel cross-entropy's), the host
  // sum of the gradient norm and the gather of a checkpoint's slices, through the transport's tp
  // group (on NCCL: one more NCCL group).
  const comm::Topology tensor_parallel(2, 1, 1, 2);
  comm::GroupComms tp_comms = comm::GroupComms::Create(tensor_parallel, rank);
  {
    std::unique_ptr<comm::PipelineComm> transport = comm::MakePipelineComm(
        choice.kind, tensor_parallel, rank, tp_comms, device.get(), options.deadline, spin,
        options.stage_host, faults.max_message_bytes);
    comm::Group& tp = transport->tp();
    const int64_t n = 4099;
    std::vector<float> values(n);
    for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>((i * 37 + 11 * rank) % 101);
    Tensor local(device.get(), {n}, DType::kF32);
    local.CopyFromHost(values.data());
    device->Synchronize();
    Tensor maximum = local.Clone();
    tp.AllReduce(&maximum, comm::ReduceOp::kMax, "the ping-pong's tp max");
    const std::vector<Tensor> slices = tp.AllGather(local, "the ping-pong's tp slices");
    const double norm = tp.Sum(rank + 1.5, "the ping-pong's tp sum");
    std::vector<float> got(n);
    maximum.CopyToHost(got.data());
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float mine = static_cast<float>((i * 37) % 101);
      const float theirs = static_cast<float>((i * 37 + 11) % 101);
      if (got[i] != std::max(mine, theirs)) ++wrong;
    }
    for (int r = 0; r < static_cast<int>(slices.size()); ++r) {
      std::vector<float> slice(n);
      slices[r].CopyToHost(slice.data());
      for (int64_t i = 0; i < n; ++i)
        wrong += slice[i] != static_cast<float>((i * 37 + 11 * r) % 101);
    }
    if (slices.size() != 2 || norm != 4.0 || tp.size() != 2 || tp.rank() != rank) ++wrong;
    ok = ok && wrong == 0;
    report += " | tp group: " + std::to_string(n) + " maxima, 2 slices, a sum, " +
              std::to_string(wrong) + " wrong";
  }
  tp_comms.Free();
  pipeline_comms.Free();
  return Finish(world, ok, report);
}

int Usage(const char* problem) {
  std::fprintf(stderr,
               "nccl_pingpong: %s\nusage: mpirun -np 2 nccl_pingpong [--transport auto|nccl|mpi] "
               "[--backend cuda|cpu] [--iterations N] [--elements E] [--stage-host] "
               "[--share-gpus] [--deadline SECONDS]\n",
               problem);
  return 2;
}

}  // namespace
}  // namespace bigmac

int main(int argc, char** argv) {
  using bigmac::Usage;
  bigmac::comm::MpiWorld world(&argc, &argv);
  bigmac::Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--stage-host") {
      options.stage_host = true;
    } else if (arg == "--share-gpus") {
      options.share_gpus = true;
    } else if (!has_value) {
      return Usage(("unknown option or missing value: " + arg).c_str());
    } else if (arg == "--transport") {
      options.transport = argv[++i];
    } else if (arg == "--backend") {
      options.backend = argv[++i];
    } else if (arg == "--iterations") {
      options.iterations = std::atoi(argv[++i]);
    } else if (arg == "--elements") {
      options.elements = std::atoll(argv[++i]);
    } else if (arg == "--deadline") {
      options.deadline = std::atof(argv[++i]);
    } else {
      return Usage(("unknown option " + arg).c_str());
    }
  }
  if (world.size() != 2) return Usage("needs exactly 2 ranks (mpirun -np 2)");
  if (options.iterations < 1 || options.elements < 1 || options.deadline <= 0)
    return Usage("--iterations, --elements and --deadline must be positive");
  world.DiscoverNode();
  try {
    return bigmac::Run(world, options);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "pingpong: FAIL on rank %d: %s\n", world.rank(), error.what());
    std::printf("pingpong: FAIL on rank %d: %s\n", world.rank(), error.what());
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
