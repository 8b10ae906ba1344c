// The emulated NCCL (core/device/cuda/emulation/nccl.cc) between real processes: each case forks
// 1-4 rank processes, which talk through the stand-in as BigMac's ranks do under mpirun. The
// parent stays single-threaded (a forked child gets only the forking thread, and inherits any lock
// another thread held: the runtime's stream workers and the bootstrap roots' threads must be born
// in the children), so a rank makes each unique id and hands it to the others through a page of
// shared memory, as MPI_Bcast does for BigMac. Children report through a pipe and their exit
// status, and through the shared page (timestamps, result hashes); a child that hangs is killed
// at the case's deadline.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/device/cuda/emulation/runtime.h"
#include "tests/testing/numeric.h"

namespace bigmac::device::cuda::emulation {
namespace {

using ::bigmac::testutil::BitwiseEqual;

// ---------------------------------------------------------------------------------------------
// Rank processes

// Visible to the parent and every child (mapped shared before the fork).
struct SharedPage {
  std::atomic<int64_t> values[64];
  std::atomic<int> id_ready[4];
  ncclUniqueId ids[4];
};
static_assert(std::atomic<int64_t>::is_always_lock_free && std::atomic<int>::is_always_lock_free);

struct Unmap {
  void operator()(SharedPage* page) const { munmap(page, sizeof(SharedPage)); }
};
using SharedPagePtr = std::unique_ptr<SharedPage, Unmap>;

SharedPagePtr NewSharedPage() {
  void* memory =
      mmap(nullptr, sizeof(SharedPage), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) return nullptr;
  return SharedPagePtr(new (memory) SharedPage{});
}

int64_t NowNs();

// Unique id `slot`: made by the rank `maker` (its bootstrap root runs there), waited for by the
// others. False if it never came.
bool ShareId(SharedPage* shared, int slot, bool maker, ncclUniqueId* id) {
  if (maker) {
    if (ncclGetUniqueId(id) != ncclSuccess) return false;
    shared->ids[slot] = *id;
    shared->id_ready[slot].store(1, std::memory_order_release);
    return true;
  }
  const int64_t end = NowNs() + 20'000'000'000;
  while (shared->id_ready[slot].load(std::memory_order_acquire) == 0) {
    if (NowNs() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  *id = shared->ids[slot];
  return true;
}

int64_t NowNs() {  // CLOCK_MONOTONIC: one clock for all the processes of the machine
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Outcome {
  bool timed_out = false;
  int exit_code = -1;  // or 128 + the signal
  std::string report;  // the body's failure text; empty when it passed
};

// Runs body(rank) in `ranks` forked processes; "" from the body is a pass. Every child is
// reaped: those still running at the deadline are killed.
std::vector<Outcome> RunRanks(int ranks, const std::function<std::string(int)>& body,
                              double deadline_s = 60) {
  std::vector<pid_t> pids(ranks, -1);
  std::vector<int> pipes(ranks, -1);
  std::fflush(nullptr);  // nothing buffered is written twice
  for (int rank = 0; rank < ranks; ++rank) {
    int fds[2];
    if (pipe(fds) != 0) break;
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      std::string report;
      try {
        report = body(rank);
      } catch (const std::exception& error) {
        report = std::string("exception: ") + error.what();
      }
      report = report.substr(0, 4000);  // fits the pipe: the write never blocks
      if (!report.empty()) {
        ssize_t ignored = write(fds[1], report.data(), report.size());
        (void)ignored;
      }
      _exit(report.empty() ? 0 : 1);  // no gtest or static teardown in the child
    }
    close(fds[1]);
    pids[rank] = pid;
    pipes[rank] = fds[0];
  }
  std::vector<Outcome> outcomes(ranks);
  const int64_t end = NowNs() + static_cast<int64_t>(deadline_s * 1e9);
  int left = 0;
  for (pid_t pid : pids) left += pid > 0;
  while (left > 0) {
    for (int rank = 0; rank < ranks; ++rank) {
      if (pids[rank] <= 0) continue;
      int status = 0;
      if (waitpid(pids[rank], &status, WNOHANG) != pids[rank]) continue;
      outcomes[rank].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      pids[rank] = -1;
      --left;
    }
    if (left > 0 && NowNs() > end) {
      for (int rank = 0; rank < ranks; ++rank) {
        if (pids[rank] <= 0) continue;
        kill(pids[rank], SIGKILL);
        waitpid(pids[rank], nullptr, 0);
        outcomes[rank].timed_out = true;
        pids[rank] = -1;
      }
      left = 0;
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int rank = 0; rank < ranks; ++rank) {
    if (pipes[rank] < 0) continue;
    char buffer[4096];
    ssize_t n;
    while ((n = read(pipes[rank], buffer, sizeof(buffer))) > 0) {
      outcomes[rank].report.append(buffer, static_cast<size_t>(n));
    }
    close(pipes[rank]);
  }
  return outcomes;
}

void ExpectAllPassed(const std::vector<Outcome>& outcomes) {
  for (size_t rank = 0; rank < outcomes.size(); ++rank) {
    EXPECT_FALSE(outcomes[rank].timed_out) << "rank " << rank << " hung: " << outcomes[rank].report;
    EXPECT_EQ(outcomes[rank].exit_code, 0) << "rank " << rank << ": " << outcomes[rank].report;
  }
}

// In a child: the body returns its failure text.
#define CHILD_REQUIRE(condition, detail)                                                   \
  do {                                                                                     \
    if (!(condition)) {                                                                    \
      return std::string(__FILE__ ":") + std::to_string(__LINE__) + ": " #condition " (" + \
             std::string(detail) + ")";                                                    \
    }                                                                                      \
  } while (0)

#define CHILD_NCCL(call)                                                           \
  do {                                                                             \
    const ncclResult_t status_ = (call);                                           \
    CHILD_REQUIRE(status_ == ncclSuccess, std::string(#call " -> ") +              \
                                              ncclGetErrorString(status_) + "; " + \
                                              ncclGetLastError(nullptr));          \
  } while (0)

cudaStream_t NewStream() {
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return nullptr;
  return stream;
}

// Polls a non-blocking communicator until its last call is done; its final state.
ncclResult_t PollReady(ncclComm_t comm, int* polls_in_progress = nullptr, double limit_s = 20) {
  const int64_t end = NowNs() + static_cast<int64_t>(limit_s * 1e9);
  while (true) {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return ncclInternalError;
    if (state != ncclInProgress) return state;
    if (polls_in_progress != nullptr) ++*polls_in_progress;
    if (NowNs() > end) return ncclInProgress;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// ---------------------------------------------------------------------------------------------
// Data: seeded, never zero.

std::vector<float> RandomFloats(uint64_t seed, size_t count) {
  std::mt19937_64 random(seed);
  std::uniform_real_distribution<float> magnitude(0.01f, 4.0f);
  std::vector<float> values(count);
  for (float& value : values) value = (random() & 1 ? 1 : -1) * magnitude(random);
  return values;
}

float Bf16ToFloat(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

uint16_t FloatToBf16(float value) {  // round to nearest even (finite values only here)
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint32_t lower = bits & 0xffff;
  uint32_t upper = bits >> 16;
  if (lower > 0x8000 || (lower == 0x8000 && (upper & 1))) ++upper;
  return static_cast<uint16_t>(upper);
}

std::vector<uint16_t> RandomBf16(uint64_t seed, size_t count) {
  std::vector<uint16_t> values;
  for (float value : RandomFloats(seed, count)) values.push_back(FloatToBf16(value));
  return values;
}

// Device memory (cudaMalloc, as NCCL needs) holding `values`; null on failure. Children exit
// without freeing it.
template <typename T>
T* ToDevice(const std::vector<T>& values) {
  void* device = nullptr;
  const size_t bytes = values.size() * sizeof(T);
  if (cudaMalloc(&device, bytes) != cudaSuccess) return nullptr;
  if (cudaMemcpy(device, values.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
    return nullptr;
  }
  // A pageable copy returns once staged; it lands later on the legacy stream, which the
  // non-blocking streams the NCCL calls run on do not wait for.
  WaitStream(nullptr);
  return static_cast<T*>(device);
}

template <typename T>
std::vector<T> ToHost(const T* device, size_t count) {
  std::vector<T> values(count);
  if (cudaMemcpy(values.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) {
    values.clear();
  }
  return values;
}

template <typename T>
uint64_t Hash(const std::vector<T>& values) {
  uint64_t hash = 1469598103934665603ULL;  // FNV-1a over the bytes
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  for (size_t i = 0; i < values.size() * sizeof(T); ++i) {
    hash ^= bytes[i];
    hash *= 1099511628211ULL;
  }
  return hash;
}

// A blocking communicator of `nranks`, its id made by rank 0.
ncclComm_t InitBlocking(SharedPage* shared, int nranks, int rank) {
  ncclUniqueId id;
  if (!ShareId(shared, 0, rank == 0, &id)) return nullptr;
  ncclComm_t comm = nullptr;
  if (ncclCommInitRankConfig(&comm, nranks, id, rank, nullptr) != ncclSuccess) return nullptr;
  return comm;
}

// A clean end: every rank finalizes (its peers' closes are then no error) and destroys.
std::string FinalizeAndDestroy(ncclComm_t comm) {
  CHILD_NCCL(ncclCommFinalize(comm));
  ncclResult_t state = ncclInternalError;
  CHILD_NCCL(ncclCommGetAsyncError(comm, &state));
  CHILD_REQUIRE(state == ncclSuccess, ncclGetErrorString(state));
  CHILD_NCCL(ncclCommDestroy(comm));
  return "";
}

// ---------------------------------------------------------------------------------------------
// Cases

TEST(EmulatedNccl, VersionErrorStringsAndMisuse) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, NCCL_VERSION_CODE);
  EXPECT_EQ(std::string(ncclGetErrorString(ncclRemoteError)),
            "remote process exited or there was a network error");
  EXPECT_EQ(std::string(ncclGetErrorString(ncclSuccess)), "no error");
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  // Ids start bootstrap roots (threads): in a child, as every case's.
  const auto body = [](int) -> std::string {
    ncclUniqueId a;
    ncclUniqueId b;
    CHILD_NCCL(ncclGetUniqueId(&a));
    CHILD_NCCL(ncclGetUniqueId(&b));
    CHILD_REQUIRE(std::memcmp(&a, &b, sizeof(a)) != 0, "two ids alike");
    ncclComm_t comm = nullptr;
    CHILD_REQUIRE(ncclCommInitRankConfig(&comm, 2, a, 2, nullptr) == ncclInvalidArgument, "");
    CHILD_REQUIRE(comm == nullptr, "");
    ncclUniqueId garbage;
    std::memset(&garbage, 7, sizeof(garbage));
    CHILD_REQUIRE(ncclCommInitRankConfig(&comm, 1, garbage, 0, nullptr) == ncclInvalidArgument,
                  "an id not from ncclGetUniqueId");
    return "";
  };
  ExpectAllPassed(RunRanks(1, body));
}

// A send's stream op ends only after its receive was posted (the peer posts it 400 ms late), and
// a pair's messages match in sending order.
TEST(EmulatedNccl, SendWaitsForItsReceiveAndMessagesMatchInOrder) {
  SharedPagePtr page = NewSharedPage();
  ASSERT_NE(page, nullptr);
  SharedPage* shared = page.get();
  enum { kReceivePosted, kSendDone, kDoneAt200Ms };
  constexpr size_t kCount = 70001;  // more than a socket buffer holds
  const auto body = [&](int rank) -> std::string {
    ncclComm_t comm = InitBlocking(shared, 2, rank);
    CHILD_REQUIRE(comm != nullptr, ncclGetLastError(nullptr));
    cudaStream_t stream = NewStream();
    const std::vector<float> first = RandomFloats(11, kCount);
    const std::vector<float> second = RandomFloats(12, kCount);
    if (rank == 0) {
      float* first_on_device = ToDevice(first);
      float* second_on_device = ToDevice(second);
      CHILD_REQUIRE(first_on_device != nullptr && second_on_device != nullptr, "cudaMalloc");
      CHILD_NCCL(ncclSend(first_on_device, kCount, ncclFloat32, 1, comm, stream));
      CHILD_NCCL(ncclSend(second_on_device, kCount, ncclFloat32, 1, comm, stream));
      Enqueue(stream, "mark", [shared] { shared->values[kSendDone] = NowNs(); });
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      shared->values[kDoneAt200Ms] = shared->values[kSendDone].load();
      WaitStream(stream);
      CHILD_REQUIRE(shared->values[kDoneAt200Ms] == 0, "the sends ended before any receive");
      CHILD_REQUIRE(shared->values[kReceivePosted] > 0, "");
      CHILD_REQUIRE(shared->values[kSendDone] > shared->values[kReceivePosted],
                    "the send ended before its receive was posted");
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(400));
      float* a = ToDevice(std::vector<float>(kCount, 0.0f));
      float* b = ToDevice(std::vector<float>(kCount, 0.0f));
      CHILD_REQUIRE(a != nullptr && b != nullptr, "cudaMalloc");
      shared->values[kReceivePosted] = NowNs();
      CHILD_NCCL(ncclRecv(a, kCount, ncclFloat32, 0, comm, stream));
      CHILD_NCCL(ncclRecv(b, kCount, ncclFloat32, 0, comm, stream));
      WaitStream(stream);
      CHILD_REQUIRE(BitwiseEqual(ToHost(a, kCount), first), "the first receive got another one");
      CHILD_REQUIRE(BitwiseEqual(ToHost(b, kCount), second), "the second receive got another one");
    }
    return FinalizeAndDestroy(comm);
  };
  ExpectAllPassed(RunRanks(2, body));
}

// Every rank, in one group on one stream, sends to and receives from both neighbours (with two
// ranks, twice each way to the same peer): each send alone would wait for ever for a receive
// that comes after it on the same stream.
TEST(EmulatedNccl, GroupSendsAndReceivesBothWaysWithoutDeadlock) {
  for (int ranks : {2, 3}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    SharedPagePtr page = NewSharedPage();
    ASSERT_NE(page, nullptr);
    SharedPage* shared = page.get();
    constexpr size_t kCount = 50003;
    // The k-th message from `from` to `to`.
    const auto payload = [](int from, int to, int k) {
      return RandomBf16(1000 + 100 * from + 10 * to + k, kCount);
    };
    const auto body = [&](int rank) -> std::string {
      ncclComm_t comm = InitBlocking(shared, ranks, rank);
      CHILD_REQUIRE(comm != nullptr, ncclGetLastError(nullptr));
      cudaStream_t stream = NewStream();
      const int left = (rank + ranks - 1) % ranks;
      const int right = (rank + 1) % ranks;
      std::vector<int> sent(ranks, 0);
      std::vector<int> received(ranks, 0);
      std::vector<uint16_t*> outgoing;
      std::vector<uint16_t*> incoming;
      std::vector<std::vector<uint16_t>> expected;
      for (int to : {left, right}) outgoing.push_back(ToDevice(payload(rank, to, sent[to]++)));
      for (int from : {left, right}) {
        incoming.push_back(ToDevice(std::vector<uint16_t>(kCount, 0)));
        expected.push_back(payload(from, rank, received[from]++));
      }
      for (int i : {0, 1}) {
        CHILD_REQUIRE(outgoing[i] != nullptr && incoming[i] != nullptr, "cudaMalloc");
      }
      CHILD_NCCL(ncclGroupStart());
      CHILD_NCCL(ncclSend(outgoing[0], kCount, ncclBfloat16, left, comm, stream));
      CHILD_NCCL(ncclSend(outgoing[1], kCount, ncclBfloat16, right, comm, stream));
      CHILD_NCCL(ncclRecv(incoming[0], kCount, ncclBfloat16, left, comm, stream));
      CHILD_NCCL(ncclRecv(incoming[1], kCount, ncclBfloat16, right, comm, stream));
      CHILD_NCCL(ncclGroupEnd());
      WaitStream(stream);
      CHILD_REQUIRE(BitwiseEqual(ToHost(incoming[0], kCount), expected[0]), "from the left");
      CHILD_REQUIRE(BitwiseEqual(ToHost(incoming[1], kCount), expected[1]), "from the right");
      return FinalizeAndDestroy(comm);
    };
    ExpectAllPassed(RunRanks(ranks, body));
  }
}

// f32 and bf16 (in place) sums, f64 and i32 (out of place): every rank's result is the rank-order
// sum (bf16 summed in f32 and rounded once), bitwise, and the same on every rank.
TEST(EmulatedNccl, AllReduceIsTheRankOrderSumOnEveryRank) {
  constexpr int kRanks = 4;
  constexpr size_t kCount = 4099;
  SharedPagePtr page = NewSharedPage();
  ASSERT_NE(page, nullptr);
  SharedPage* shared = page.get();
  const auto body = [&](int rank) -> std::string {
    ncclComm_t comm = InitBlocking(shared, kRanks, rank);
    CHILD_REQUIRE(comm != nullptr, ncclGetLastError(nullptr));
    cudaStream_t stream = NewStream();
    std::vector<float> f32 = RandomFloats(20 + rank, kCount);
    std::vector<uint16_t> bf16 = RandomBf16(30 + rank, kCount);
    std::vector<double> f64(kCount);
    std::vector<int32_t> i32(kCount);
    std::mt19937_64 random(40 + rank);
    for (size_t i = 0; i < kCount; ++i) {
      f64[i] = static_cast<double>(f32[i]) / 3.0 + 1e-9 * static_cast<double>(random() % 1000);
      i32[i] = static_cast<int32_t>(random() % 2000001) - 1000000 + 7;
    }
    float* f32_d = ToDevice(f32);
    uint16_t* bf16_d = ToDevice(bf16);
    double* f64_d = ToDevice(f64);
    int32_t* i32_d = ToDevice(i32);
    double* f64_sum_d = ToDevice(std::vector<double>(kCount, 0.0));
    int32_t* i32_sum_d = ToDevice(std::vector<int32_t>(kCount, 0));
    CHILD_REQUIRE(f32_d && bf16_d && f64_d && i32_d && f64_sum_d && i32_sum_d, "cudaMalloc");
    CHILD_NCCL(ncclAllReduce(f32_d, f32_d, kCount, ncclFloat32, ncclSum, comm, stream));
    CHILD_NCCL(ncclAllReduce(bf16_d, bf16_d, kCount, ncclBfloat16, ncclSum, comm, stream));
    CHILD_NCCL(ncclAllReduce(f64_d, f64_sum_d, kCount, ncclFloat64, ncclSum, comm, stream));
    CHILD_NCCL(ncclAllReduce(i32_d, i32_sum_d, kCount, ncclInt32, ncclSum, comm, stream));
    WaitStream(stream);
    f32 = ToHost(f32_d, kCount);
    bf16 = ToHost(bf16_d, kCount);
    const std::vector<double> f64_sum = ToHost(f64_sum_d, kCount);
    const std::vector<int32_t> i32_sum = ToHost(i32_sum_d, kCount);
    // The references, from every rank's seeded data, in rank order.
    std::vector<float> f32_expected(kCount, 0.0f);
    std::vector<float> bf16_wide(kCount, 0.0f);
    for (int r = 0; r < kRanks; ++r) {
      const std::vector<float> theirs = RandomFloats(20 + r, kCount);
      const std::vector<uint16_t> theirs16 = RandomBf16(30 + r, kCount);
      for (size_t i = 0; i < kCount; ++i) {
        f32_expected[i] = r == 0 ? theirs[i] : f32_expected[i] + theirs[i];
        bf16_wide[i] = r == 0 ? Bf16ToFloat(theirs16[i]) : bf16_wide[i] + Bf16ToFloat(theirs16[i]);
      }
    }
    std::vector<uint16_t> bf16_expected(kCount);
    for (size_t i = 0; i < kCount; ++i) bf16_expected[i] = FloatToBf16(bf16_wide[i]);
    CHILD_REQUIRE(BitwiseEqual(f32, f32_expected), "f32");
    CHILD_REQUIRE(BitwiseEqual(bf16, bf16_expected), "bf16");
    int64_t i32_check = 0;
    for (size_t i = 0; i < kCount; ++i) i32_check += i32_sum[i];
    CHILD_REQUIRE(i32_check != 0, "i32 sums are all zero");
    shared->values[rank] = static_cast<int64_t>(Hash(f32) ^ (Hash(bf16) * 3));
    shared->values[8 + rank] = static_cast<int64_t>(Hash(f64_sum) ^ (Hash(i32_sum) * 3));
    return FinalizeAndDestroy(comm);
  };
  ExpectAllPassed(RunRanks(kRanks, body));
  for (int rank = 1; rank < kRanks; ++rank) {
    EXPECT_EQ(shared->values[rank].load(), shared->values[0].load()) << "rank " << rank;
    EXPECT_EQ(shared->values[8 + rank].load(), shared->values[8].load()) << "rank " << rank;
  }
}

TEST(EmulatedNccl, ReduceScatterAndAllGather) {
  constexpr int kRanks = 3;
  constexpr size_t kBlock = 1001;
  SharedPagePtr page = NewSharedPage();
  ASSERT_NE(page, nullptr);
  SharedPage* shared = page.get();
  const auto body = [&](int rank) -> std::string {
    ncclComm_t comm = InitBlocking(shared, kRanks, rank);
    CHILD_REQUIRE(comm != nullptr, ncclGetLastError(nullptr));
    cudaStream_t stream = NewStream();
    // Reduce-scatter, out of place: block `rank` of the rank-order sum.
    float* input = ToDevice(RandomFloats(50 + rank, kRanks * kBlock));
    float* block_d = ToDevice(std::vector<float>(kBlock, 0.0f));
    CHILD_REQUIRE(input != nullptr && block_d != nullptr, "cudaMalloc");
    CHILD_NCCL(ncclReduceScatter(input, block_d, kBlock, ncclFloat32, ncclSum, comm, stream));
    // Reduce-scatter of bf16, in place (recvbuff is sendbuff + rank * recvcount).
    uint16_t* input16 = ToDevice(RandomBf16(60 + rank, kRanks * kBlock));
    CHILD_REQUIRE(input16 != nullptr, "cudaMalloc");
    uint16_t* own16 = input16 + rank * kBlock;
    CHILD_NCCL(ncclReduceScatter(input16, own16, kBlock, ncclBfloat16, ncclSum, comm, stream));
    // All-gather, out of place and in place.
    const std::vector<float> mine = RandomFloats(70 + rank, kBlock);
    float* mine_d = ToDevice(mine);
    float* gathered_d = ToDevice(std::vector<float>(kRanks * kBlock, 0.0f));
    std::vector<float> in_place_host(kRanks * kBlock, 0.0f);
    std::memcpy(in_place_host.data() + rank * kBlock, mine.data(), kBlock * sizeof(float));
    float* in_place_d = ToDevice(in_place_host);
    CHILD_REQUIRE(mine_d != nullptr && gathered_d != nullptr && in_place_d != nullptr,
                  "cudaMalloc");
    CHILD_NCCL(ncclAllGather(mine_d, gathered_d, kBlock, ncclFloat32, comm, stream));
    CHILD_NCCL(
        ncclAllGather(in_place_d + rank * kBlock, in_place_d, kBlock, ncclFloat32, comm, stream));
    WaitStream(stream);
    const std::vector<float> block = ToHost(block_d, kBlock);
    const std::vector<float> gathered = ToHost(gathered_d, kRanks * kBlock);
    const std::vector<float> in_place = ToHost(in_place_d, kRanks * kBlock);
    std::vector<float> expected(kBlock, 0.0f);
    std::vector<float> wide16(kBlock, 0.0f);
    std::vector<float> everyone;
    for (int r = 0; r < kRanks; ++r) {
      const std::vector<float> theirs = RandomFloats(50 + r, kRanks * kBlock);
      const std::vector<uint16_t> theirs16 = RandomBf16(60 + r, kRanks * kBlock);
      for (size_t i = 0; i < kBlock; ++i) {
        const float value = theirs[rank * kBlock + i];
        const float value16 = Bf16ToFloat(theirs16[rank * kBlock + i]);
        expected[i] = r == 0 ? value : expected[i] + value;
        wide16[i] = r == 0 ? value16 : wide16[i] + value16;
      }
      const std::vector<float> part = RandomFloats(70 + r, kBlock);
      everyone.insert(everyone.end(), part.begin(), part.end());
    }
    CHILD_REQUIRE(BitwiseEqual(block, expected), "reduce-scatter f32");
    const std::vector<uint16_t> own = ToHost(own16, kBlock);
    std::vector<uint16_t> expected16(kBlock);
    for (size_t i = 0; i < kBlock; ++i) expected16[i] = FloatToBf16(wide16[i]);
    CHILD_REQUIRE(BitwiseEqual(own, expected16), "reduce-scatter bf16 in place");
    CHILD_REQUIRE(BitwiseEqual(gathered, everyone), "all-gather");
    CHILD_REQUIRE(BitwiseEqual(in_place, everyone), "all-gather in place");
    return FinalizeAndDestroy(comm);
  };
  ExpectAllPassed(RunRanks(kRanks, body));
}

// config.blocking = 0: creation answers ncclInProgress and is polled (rank 2 joins 300 ms late,
// so the others see it in progress); the first collective may answer ncclInProgress too; a
// non-blocking finalize is polled as nccl_pipeline_comm.cc does.
TEST(EmulatedNccl, NonBlockingInitIsPolledUntilReady) {
  constexpr int kRanks = 3;
  SharedPagePtr page = NewSharedPage();
  ASSERT_NE(page, nullptr);
  SharedPage* shared = page.get();
  const auto body = [&](int rank) -> std::string {
    ncclUniqueId id;
    CHILD_REQUIRE(ShareId(shared, 0, rank == 0, &id), "no unique id");
    if (rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const ncclResult_t started = ncclCommInitRankConfig(&comm, kRanks, id, rank, &config);
    CHILD_REQUIRE(started == ncclInProgress, ncclGetErrorString(started));
    CHILD_REQUIRE(comm != nullptr, "no handle to poll");
    int in_progress = 0;
    const ncclResult_t ready = PollReady(comm, &in_progress);
    CHILD_REQUIRE(ready == ncclSuccess, ncclGetErrorString(ready));
    if (rank < 2) CHILD_REQUIRE(in_progress > 0, "never seen in progress");
    cudaStream_t stream = NewStream();
    std::vector<float> data = RandomFloats(80 + rank, 257);
    float* data_d = ToDevice(data);
    CHILD_REQUIRE(data_d != nullptr, "cudaMalloc");
    const ncclResult_t enqueued =
        ncclAllReduce(data_d, data_d, data.size(), ncclFloat32, ncclSum, comm, stream);
    CHILD_REQUIRE(enqueued == ncclSuccess || enqueued == ncclInProgress,
                  ncclGetErrorString(enqueued));
    if (enqueued == ncclInProgress) CHILD_REQUIRE(PollReady(comm) == ncclSuccess, "");
    WaitStream(stream);
    data = ToHost(data_d, data.size());
    std::vector<float> expected(data.size(), 0.0f);
    for (int r = 0; r < kRanks; ++r) {
      const std::vector<float> theirs = RandomFloats(80 + r, data.size());
      for (size_t i = 0; i < data.size(); ++i)
        expected[i] = r == 0 ? theirs[i] : expected[i] + theirs[i];
    }
    CHILD_REQUIRE(BitwiseEqual(data, expected), "all-reduce on a non-blocking communicator");
    const ncclResult_t finalizing = ncclCommFinalize(comm);
    CHILD_REQUIRE(finalizing == ncclSuccess || finalizing == ncclInProgress,
                  ncclGetErrorString(finalizing));
    const ncclResult_t finalized = PollReady(comm);
    CHILD_REQUIRE(finalized == ncclSuccess, ncclGetErrorString(finalized));
    CHILD_NCCL(ncclCommDestroy(comm));
    return "";
  };
  ExpectAllPassed(RunRanks(kRanks, body));
}

// As nccl_pipeline_comm.cc's CreateLinks: a communicator of two per direction (its sender makes
// the id), both created in one group of non-blocking inits, in opposite orders on the two ranks;
// then each direction's payload on its own stream outside any group (as Exchange does).
TEST(EmulatedNccl, GroupedNonBlockingInitsInEitherOrder) {
  SharedPagePtr page = NewSharedPage();
  ASSERT_NE(page, nullptr);
  SharedPage* shared = page.get();
  constexpr size_t kCount = 30011;
  const auto body = [&](int rank) -> std::string {
    // Each rank makes the id of the direction it sends on (slot = the sender).
    ncclUniqueId out;
    ncclUniqueId in;
    CHILD_REQUIRE(ShareId(shared, rank, true, &out), "");
    CHILD_REQUIRE(ShareId(shared, 1 - rank, false, &in), "no unique id from the peer");
    ncclComm_t sending = nullptr;    // this rank is its rank 0
    ncclComm_t receiving = nullptr;  // this rank is its rank 1
    ncclConfig_t configs[2] = {NCCL_CONFIG_INITIALIZER, NCCL_CONFIG_INITIALIZER};
    configs[0].blocking = configs[1].blocking = 0;
    CHILD_NCCL(ncclGroupStart());
    for (int direction : {rank, 1 - rank}) {  // opposite orders
      const bool send = direction == 0;
      const ncclResult_t status = ncclCommInitRankConfig(
          send ? &sending : &receiving, 2, send ? out : in, send ? 0 : 1, &configs[direction]);
      CHILD_REQUIRE(status == ncclSuccess || status == ncclInProgress, ncclGetErrorString(status));
    }
    const ncclResult_t ended = ncclGroupEnd();
    CHILD_REQUIRE(ended == ncclSuccess || ended == ncclInProgress, ncclGetErrorString(ended));
    CHILD_REQUIRE(PollReady(sending) == ncclSuccess, ncclGetLastError(sending));
    CHILD_REQUIRE(PollReady(receiving) == ncclSuccess, ncclGetLastError(receiving));
    cudaStream_t send_stream = NewStream();
    cudaStream_t receive_stream = NewStream();
    float* payload = ToDevice(RandomFloats(90 + rank, kCount));
    float* arrived = ToDevice(std::vector<float>(kCount, 0.0f));
    CHILD_REQUIRE(payload != nullptr && arrived != nullptr, "cudaMalloc");
    // Both ranks send first: rendezvous sends on separate communicators and streams still meet.
    ncclResult_t status = ncclSend(payload, kCount, ncclFloat32, 1, sending, send_stream);
    CHILD_REQUIRE(status == ncclSuccess || status == ncclInProgress, ncclGetErrorString(status));
    if (status == ncclInProgress) CHILD_REQUIRE(PollReady(sending) == ncclSuccess, "");
    status = ncclRecv(arrived, kCount, ncclFloat32, 0, receiving, receive_stream);
    CHILD_REQUIRE(status == ncclSuccess || status == ncclInProgress, ncclGetErrorString(status));
    if (status == ncclInProgress) CHILD_REQUIRE(PollReady(receiving) == ncclSuccess, "");
    WaitStream(send_stream);
    WaitStream(receive_stream);
    CHILD_REQUIRE(BitwiseEqual(ToHost(arrived, kCount), RandomFloats(90 + (1 - rank), kCount)),
                  "payload");
    for (ncclComm_t comm : {sending, receiving}) {
      const ncclResult_t finalizing = ncclCommFinalize(comm);
      CHILD_REQUIRE(finalizing == ncclSuccess || finalizing == ncclInProgress,
                    ncclGetErrorString(finalizing));
      CHILD_REQUIRE(PollReady(comm) == ncclSuccess, ncclGetLastError(comm));
      CHILD_NCCL(ncclCommDestroy(comm));
    }
    return "";
  };
  ExpectAllPassed(RunRanks(2, body));
}

// A send whose receive is never posted (the peer is alive) hangs without an error, as on GPUs,
// until ncclCommAbort; then its stream drains.
TEST(EmulatedNccl, AbortUnblocksASendWhoseReceiveNeverComes) {
  SharedPagePtr page = NewSharedPage();
  ASSERT_NE(page, nullptr);
  SharedPage* shared = page.get();
  enum { kAborted, kDrainedAfterNs };
  const auto body = [&](int rank) -> std::string {
    ncclComm_t comm = InitBlocking(shared, 2, rank);
    CHILD_REQUIRE(comm != nullptr, ncclGetLastError(nullptr));
    if (rank == 1) {
      const int64_t end = NowNs() + 20'000'000'000;
      while (shared->values[kAborted] == 0 && NowNs() < end) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      CHILD_NCCL(ncclCommAbort(comm));
      return "";
    }
    cudaStream_t stream = NewStream();
    float* payload = ToDevice(RandomFloats(100, 1000));
    CHILD_REQUIRE(payload != nullptr, "cudaMalloc");
    std::atomic<bool> drained{false};
    CHILD_NCCL(ncclSend(payload, 1000, ncclFloat32, 1, comm, stream));
    Enqueue(stream, "mark", [&drained] { drained = true; });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    CHILD_REQUIRE(!drained, "the send ended without a receive");
    ncclResult_t state = ncclInternalError;
    CHILD_NCCL(ncclCommGetAsyncError(comm, &state));
    CHILD_REQUIRE(state == ncclSuccess, ncclGetErrorString(state));
    const int64_t start = NowNs();
    CHILD_NCCL(ncclCommAbort(comm));
    WaitStream(stream);
    shared->values[kDrainedAfterNs] = NowNs() - start;
    shared->values[kAborted] = 1;
    CHILD_REQUIRE(drained, "");
    return "";
  };
  ExpectAllPassed(RunRanks(2, body, 30));
  EXPECT_LT(shared->values[kDrainedAfterNs].load(), 2'000'000'000) << "abort to drained, in ns";
}

// A peer that exits without a word: the pending receive's communicator reports ncclRemoteError
// (no hang), with a last-error text; abort then drains the stream.
TEST(EmulatedNccl, DeadPeerGivesAnAsyncError) {
  SharedPagePtr page = NewSharedPage();
  ASSERT_NE(page, nullptr);
  SharedPage* shared = page.get();
  enum { kZeroReady };
  const auto body = [&](int rank) -> std::string {
    ncclComm_t comm = InitBlocking(shared, 2, rank);
    CHILD_REQUIRE(comm != nullptr, ncclGetLastError(nullptr));
    if (rank == 1) {
      const int64_t end = NowNs() + 20'000'000'000;
      while (shared->values[kZeroReady] == 0 && NowNs() < end) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      _exit(0);  // as a crash: no finalize, no abort
    }
    cudaStream_t stream = NewStream();
    float* arrived = ToDevice(std::vector<float>(1000, 0.0f));
    CHILD_REQUIRE(arrived != nullptr, "cudaMalloc");
    std::atomic<bool> drained{false};
    CHILD_NCCL(ncclRecv(arrived, 1000, ncclFloat32, 1, comm, stream));
    Enqueue(stream, "mark", [&drained] { drained = true; });
    shared->values[kZeroReady] = 1;
    ncclResult_t state = PollReady(comm, nullptr, 0);  // at once: no error yet
    const int64_t end = NowNs() + 10'000'000'000;
    while (state == ncclSuccess && NowNs() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      CHILD_NCCL(ncclCommGetAsyncError(comm, &state));
    }
    CHILD_REQUIRE(state == ncclRemoteError, ncclGetErrorString(state));
    CHILD_REQUIRE(std::string(ncclGetLastError(comm)).find("peer rank 1") != std::string::npos,
                  ncclGetLastError(comm));
    CHILD_REQUIRE(!drained, "the receive ended without data");
    CHILD_NCCL(ncclCommAbort(comm));
    WaitStream(stream);
    CHILD_REQUIRE(drained, "");
    return "";
  };
  ExpectAllPassed(RunRanks(2, body, 30));
}

// cuda_nccl_test.cc's case: one process, ncclCommInitAll of one rank, a grouped send to itself
// and its receive, an all-reduce (the identity).
TEST(EmulatedNccl, OneRankGroupRoundTripAndAllReduce) {
  const auto body = [](int) -> std::string {
    ncclComm_t comm = nullptr;
    int devices[] = {0};
    CHILD_NCCL(ncclCommInitAll(&comm, 1, devices));
    cudaStream_t stream = NewStream();
    constexpr size_t kCount = (size_t{1} << 16) + 3;
    const std::vector<uint16_t> sent = RandomBf16(110, kCount);
    uint16_t* sent_d = ToDevice(sent);
    uint16_t* back_d = ToDevice(std::vector<uint16_t>(kCount, 0));
    CHILD_REQUIRE(sent_d != nullptr && back_d != nullptr, "cudaMalloc");
    CHILD_NCCL(ncclGroupStart());
    CHILD_NCCL(ncclSend(sent_d, kCount, ncclBfloat16, 0, comm, stream));
    CHILD_NCCL(ncclRecv(back_d, kCount, ncclBfloat16, 0, comm, stream));
    CHILD_NCCL(ncclGroupEnd());
    const std::vector<float> values = RandomFloats(111, 4096);
    float* summed = ToDevice(values);
    CHILD_REQUIRE(summed != nullptr, "cudaMalloc");
    CHILD_NCCL(ncclAllReduce(summed, summed, values.size(), ncclFloat32, ncclSum, comm, stream));
    WaitStream(stream);
    CHILD_REQUIRE(BitwiseEqual(ToHost(back_d, kCount), sent), "round trip");
    CHILD_REQUIRE(BitwiseEqual(ToHost(summed, values.size()), values), "all-reduce of one rank");
    CHILD_NCCL(ncclCommDestroy(comm));
    return "";
  };
  ExpectAllPassed(RunRanks(1, body));
}

}  // namespace
}  // namespace bigmac::device::cuda::emulation
