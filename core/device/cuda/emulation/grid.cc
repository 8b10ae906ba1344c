// The execution model (grid.h): blocks spread over OS threads, each block's threads as fibers
// (Boost.Context's fcontext, a few nanoseconds per switch) run round-robin between barriers.
#include "core/device/cuda/emulation/grid.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <boost/context/detail/fcontext.hpp>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/device/cuda/emulation/runtime.h"

namespace bigmac::device::cuda::emulation {

namespace internal {
__thread const ThreadCoordinates* current_thread = nullptr;

void OutsideKernel(const char* what) {
  std::fprintf(stderr, "emulated CUDA: %s used outside a kernel\n", what);
  std::abort();
}
}  // namespace internal

namespace {

namespace fc = boost::context::detail;

constexpr int kWarpSize = 32;
constexpr int kMaxThreadsPerBlock = 1024;
constexpr size_t kDefaultSharedBytes = 48 << 10;  // without the opt-in
constexpr size_t kMaxSharedBytes = 227 << 10;     // Hopper's opt-in limit per block
constexpr size_t kStackBytes = 64 << 10;

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// A fiber stack with a PROT_NONE guard page below it: an overflow faults instead of corrupting
// the next stack.
class Stack {
 public:
  Stack() {
    bytes_ = kStackBytes + PageSize();
    base_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base_ == MAP_FAILED) {
      std::fprintf(stderr, "emulated CUDA: cannot map a fiber stack\n");
      std::abort();
    }
    mprotect(base_, PageSize(), PROT_NONE);
  }
  ~Stack() { munmap(base_, bytes_); }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
  void* top() const { return static_cast<char*>(base_) + bytes_; }
  size_t size() const { return kStackBytes; }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0;
};

enum class FiberState { kReady, kAtBlockBarrier, kAtWarpBarrier, kDone };

struct Fiber {
  fc::fcontext_t context = nullptr;
  ThreadCoordinates coordinates{};
  FiberState state = FiberState::kReady;
  unsigned warp_mask = 0;       // while kAtWarpBarrier: the lanes it waits for
  const char* waiting_in = "";  // the operation it waits in, for reports
};

struct Launch {
  std::string name;
  dim3 grid, block;
  size_t shared_bytes = 0;
  std::function<void()> body;
};

std::string Dim(const dim3& d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}
std::string Dim(const uint3& d) { return Dim(dim3(d.x, d.y, d.z)); }

// Raised by the scheduler when a block cannot go on (a barrier not every thread reaches); the
// launch is abandoned and the stream faults.
struct BlockFailure {
  std::string message;
};

// Runs blocks on the calling OS thread. One per OS thread, reused across launches (its stacks
// too).
class BlockRunner {
  struct Warp;

 public:
  void Run(const Launch& launch, uint3 block_idx) {
    launch_ = &launch;
    const int threads = static_cast<int>(launch.block.x * launch.block.y * launch.block.z);
    while (static_cast<int>(stacks_.size()) < threads) stacks_.push_back(std::make_unique<Stack>());
    fibers_.assign(threads, Fiber{});
    shared_.assign(launch.shared_bytes, 0xff);  // NaN in float, bf16 and double
    for (int i = 0; i < threads; ++i) {
      Fiber& f = fibers_[i];
      f.coordinates.thread_idx = {static_cast<unsigned>(i % launch.block.x),
                                  static_cast<unsigned>((i / launch.block.x) % launch.block.y),
                                  static_cast<unsigned>(i / (launch.block.x * launch.block.y))};
      f.coordinates.block_idx = block_idx;
      f.coordinates.block_dim = launch.block;
      f.coordinates.grid_dim = launch.grid;
      f.context = fc::make_fcontext(stacks_[i]->top(), stacks_[i]->size(), &Entry);
    }
    warps_.assign((threads + kWarpSize - 1) / kWarpSize, Warp{});
    for (int w = 0; w < static_cast<int>(warps_.size()); ++w) {
      const int lanes = std::min(kWarpSize, threads - w * kWarpSize);
      warps_[w].existing = lanes == kWarpSize ? 0xffffffffu : (1u << lanes) - 1;
    }
    at_block_barrier_ = 0;
    done_ = 0;
    while (done_ < threads) {
      bool ran = false;
      for (int i = 0; i < threads; ++i) {
        if (fibers_[i].state != FiberState::kReady) continue;
        ran = true;
        Resume(i);
      }
      if (!ran) throw BlockFailure{Stuck()};
    }
    launch_ = nullptr;
  }

  const ThreadCoordinates& Current() const { return fibers_[current_].coordinates; }
  void* shared() { return shared_.data(); }
  bool in_kernel() const { return in_fiber_; }
  const Launch* launch() const { return launch_; }

  void SyncThreads() {
    Fiber& me = fibers_[current_];
    me.state = FiberState::kAtBlockBarrier;
    me.waiting_in = "__syncthreads";
    if (++at_block_barrier_ == static_cast<int>(fibers_.size())) {
      at_block_barrier_ = 0;
      for (Fiber& f : fibers_) f.state = FiberState::kReady;
      return;  // the last to arrive goes on at once
    }
    Yield();
  }

  // Each lane posts its value (and the lane it reads); the last lane to arrive resolves every
  // lane's result before any goes on, so no later warp operation can overwrite what a lane has
  // yet to read, whatever masks the lanes use in between.
  uint64_t Exchange(unsigned mask, uint64_t value, int source_lane, const char* operation) {
    const int lane = static_cast<int>(current_ % kWarpSize);
    Warp& warp = warps_[current_ / kWarpSize];
    warp.values[lane] = value;
    warp.sources[lane] = source_lane;
    WarpBarrier(mask, operation, [](Warp& w, unsigned m) {
      for (unsigned lanes = m; lanes != 0; lanes &= lanes - 1) {
        const int l = std::countr_zero(lanes);
        const int from = w.sources[l];
        const bool valid = from >= 0 && from < kWarpSize && (m >> from & 1u);
        w.results[l] = valid ? w.values[from] : w.values[l];
      }
    });
    return warp.results[lane];
  }

  unsigned Ballot(unsigned mask, bool predicate, const char* operation) {
    const int lane = static_cast<int>(current_ % kWarpSize);
    Warp& warp = warps_[current_ / kWarpSize];
    warp.values[lane] = predicate ? 1 : 0;
    WarpBarrier(mask, operation, [](Warp& w, unsigned m) {
      unsigned bits = 0;
      for (unsigned lanes = m; lanes != 0; lanes &= lanes - 1) {
        const int l = std::countr_zero(lanes);
        if (w.values[l] != 0) bits |= 1u << l;
      }
      for (unsigned lanes = m; lanes != 0; lanes &= lanes - 1)
        w.results[std::countr_zero(lanes)] = bits;
    });
    return static_cast<unsigned>(warp.results[lane]);
  }

  // Released when every lane of the mask waits here with the same mask. Per-warp bit sets keep
  // an arrival O(1): the exchanges of a warp reduction arrive here 32 times per step.
  using Resolve = void (*)(Warp& warp, unsigned mask);
  void WarpBarrier(unsigned mask, const char* operation, Resolve resolve = nullptr) {
    const int lane = static_cast<int>(current_ % kWarpSize);
    Warp& warp = warps_[current_ / kWarpSize];
    Fiber& me = fibers_[current_];
    if (!(mask >> lane & 1u)) {
      Fail(std::string(operation) + " called by a lane missing from its mask 0x" + Hex(mask));
    }
    if ((mask & ~warp.existing) != 0) {
      const int lanes = std::popcount(warp.existing);
      Fail(std::string(operation) + " with mask 0x" + Hex(mask) + " names lanes " +
           std::to_string(lanes) + "+ of a partial warp of " + std::to_string(lanes) + " lanes");
    }
    if ((mask & warp.exited) != 0) {
      Fail(std::string(operation) + " with mask 0x" + Hex(mask) + ": lane " +
           std::to_string(std::countr_zero(mask & warp.exited)) + " has exited");
    }
    if (warp.waiting == 0) warp.waiting_mask = mask;
    if (warp.waiting_mask != mask) {
      Fail(std::string(operation) + " with mask 0x" + Hex(mask) + " while lanes 0x" +
           Hex(warp.waiting) + " wait with mask 0x" + Hex(warp.waiting_mask));
    }
    warp.waiting |= 1u << lane;
    if (warp.waiting != mask) {
      me.state = FiberState::kAtWarpBarrier;
      me.waiting_in = operation;
      Yield();
      return;
    }
    // The last to arrive resolves the operation, releases the others and goes on at once.
    if (resolve != nullptr) resolve(warp, mask);
    const int warp_base = static_cast<int>(current_ - lane);
    for (unsigned others = mask & ~(1u << lane); others != 0; others &= others - 1) {
      fibers_[warp_base + std::countr_zero(others)].state = FiberState::kReady;
    }
    warp.waiting = 0;
  }

  // A finished thread: warp operations naming it can no longer complete.
  // (Lanes already waiting for it are reported by the scheduler as stuck.)
  void Exited(int index) { warps_[index / kWarpSize].exited |= 1u << (index % kWarpSize); }

 private:
  struct Warp {
    uint64_t values[kWarpSize] = {};   // posted by each lane at a shuffle or ballot
    int sources[kWarpSize] = {};       // the lane each reads (a shuffle)
    uint64_t results[kWarpSize] = {};  // resolved by the last lane to arrive
    unsigned existing = 0;             // the lanes this block has in the warp
    unsigned exited = 0;               // lanes that have returned
    unsigned waiting = 0;              // lanes at the warp barrier
    unsigned waiting_mask = 0;         // the mask they wait with
  };

  static std::string Hex(unsigned v) {
    char text[16];
    std::snprintf(text, sizeof(text), "%08x", v);
    return text;
  }

  // Called on the fiber: the sanitizer's verdict ends the block.
  [[noreturn]] void Fail(const std::string& what) {
    failure_ = "thread " + Dim(fibers_[current_].coordinates.thread_idx) + ": " + what;
    fibers_[current_].state = FiberState::kDone;
    failed_ = true;
    Yield();
    std::abort();  // never resumed
  }

  static void Entry(fc::transfer_t transfer);
  void Resume(int index) {
    current_ = index;
    in_fiber_ = true;
    internal::current_thread = &fibers_[index].coordinates;
    fc::transfer_t back = fc::jump_fcontext(fibers_[index].context, this);
    internal::current_thread = nullptr;
    in_fiber_ = false;
    fibers_[index].context = back.fctx;
    if (failed_) {
      failed_ = false;
      throw BlockFailure{failure_};
    }
  }
  void Yield() {
    fc::transfer_t back = fc::jump_fcontext(scheduler_, nullptr);
    scheduler_ = back.fctx;
  }

  // No thread can run: name who waits where, and who has left.
  std::string Stuck() const {
    std::string waiting, exited;
    int waiting_count = 0, exited_count = 0;
    for (const Fiber& f : fibers_) {
      if (f.state == FiberState::kDone) {
        if (exited_count++ < 4)
          exited += (exited.empty() ? "" : " ") + Dim(f.coordinates.thread_idx);
      } else if (waiting_count++ < 4) {
        waiting +=
            (waiting.empty() ? "" : ", ") + Dim(f.coordinates.thread_idx) + " in " + f.waiting_in;
      }
    }
    if (!exited.empty()) {
      return "a barrier not every thread reaches: threads " + waiting + " wait, while threads " +
             exited + " (and maybe more) have exited";
    }
    return "deadlock: threads " + waiting + " (and maybe more) wait at different barriers";
  }

  const Launch* launch_ = nullptr;
  std::vector<std::unique_ptr<Stack>> stacks_;
  std::vector<Fiber> fibers_;
  std::vector<Warp> warps_;
  std::vector<unsigned char> shared_;
  fc::fcontext_t scheduler_ = nullptr;
  int current_ = 0;
  int at_block_barrier_ = 0;
  int done_ = 0;
  bool in_fiber_ = false;
  bool failed_ = false;
  std::string failure_;
};

thread_local BlockRunner* t_runner = nullptr;  // the OS thread's runner, once it ran a block

BlockRunner& Runner() {
  thread_local std::unique_ptr<BlockRunner> runner;
  if (runner == nullptr) {
    runner = std::make_unique<BlockRunner>();
    t_runner = runner.get();
  }
  return *runner;
}

void BlockRunner::Entry(fc::transfer_t transfer) {
  auto* runner = static_cast<BlockRunner*>(transfer.data);
  runner->scheduler_ = transfer.fctx;
  runner->launch_->body();
  Fiber& me = runner->fibers_[runner->current_];
  me.state = FiberState::kDone;
  ++runner->done_;
  runner->Exited(runner->current_);
  fc::jump_fcontext(runner->scheduler_, nullptr);  // never returns: the stack is reused
  std::abort();
}

void InstallFaultHandler();

using internal::OutsideKernel;

// Where the blocks of a launch run: the calling stream worker and these helpers, each taking
// the next block index until none is left.
class BlockPool {
 public:
  static BlockPool& Get() {
    static BlockPool* pool = new BlockPool();  // never destroyed: workers may outlive main
    return *pool;
  }

  // Runs every block of `launch`; returns the first failure ("" when none).
  std::string RunAll(const Launch& launch) {
    const int64_t blocks = int64_t{launch.grid.x} * launch.grid.y * launch.grid.z;
    auto job = std::make_shared<Job>();
    job->launch = &launch;
    job->blocks = blocks;
    const int helpers = static_cast<int>(std::min<int64_t>(workers_, blocks - 1));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (int i = 0; i < helpers; ++i) jobs_.push_back(job);
    }
    cv_.notify_all();
    Work(*job);
    std::unique_lock<std::mutex> lock(job->mutex);
    job->cv.wait(lock, [&] { return job->active == 0 && job->taken >= helpers; });
    return job->failure;
  }

 private:
  struct Job {
    const Launch* launch = nullptr;
    int64_t blocks = 0;
    std::atomic<int64_t> next{0};
    std::atomic<bool> failed{false};
    std::mutex mutex;
    std::condition_variable cv;
    int active = 0;  // helpers inside Work
    int taken = 0;   // helper slots consumed
    std::string failure;
  };

  BlockPool() {
    const char* env = std::getenv("BIGMAC_EMULATED_BLOCK_THREADS");
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    workers_ = env ? std::max(0, std::atoi(env) - 1) : std::min(cores, 8) - 1;
    for (int i = 0; i < workers_; ++i) {
      std::thread([this] { Serve(); }).detach();
    }
  }

  void Serve() {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return !jobs_.empty(); });
        job = jobs_.front();
        jobs_.erase(jobs_.begin());
      }
      {
        std::lock_guard<std::mutex> lock(job->mutex);
        ++job->active;
        ++job->taken;
      }
      Work(*job);
      {
        std::lock_guard<std::mutex> lock(job->mutex);
        --job->active;
      }
      job->cv.notify_all();
    }
  }

  static void Work(Job& job) {
    const Launch& launch = *job.launch;
    InstallFaultHandler();
    BlockRunner& runner = Runner();
    for (;;) {
      if (job.failed) return;
      const int64_t b = job.next.fetch_add(1);
      if (b >= job.blocks) return;
      const uint3 block_idx = {static_cast<unsigned>(b % launch.grid.x),
                               static_cast<unsigned>((b / launch.grid.x) % launch.grid.y),
                               static_cast<unsigned>(b / (int64_t{launch.grid.x} * launch.grid.y))};
      try {
        runner.Run(launch, block_idx);
      } catch (const BlockFailure& failure) {
        std::lock_guard<std::mutex> lock(job.mutex);
        if (!job.failed.exchange(true)) {
          job.failure =
              "kernel " + launch.name + ", block " + Dim(block_idx) + ", " + failure.message;
        }
        return;
      }
    }
  }

  int workers_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Job>> jobs_;
};

std::mutex g_attributes_mutex;
std::map<const void*, int> g_max_dynamic_shared;

// SIGSEGV/SIGBUS inside a kernel (a guard page of an allocation, a fiber stack's guard): name
// the kernel, block and thread before the process dies, as compute-sanitizer would.
struct sigaction g_previous_segv, g_previous_bus;
void OnFault(int signal, siginfo_t* info, void* context) {
  BlockRunner* runner = t_runner;
  if (runner != nullptr && runner->in_kernel() && runner->launch() != nullptr) {
    const ThreadCoordinates& c = runner->Current();
    char text[512];
    const int n = std::snprintf(
        text, sizeof(text),
        "emulated CUDA: invalid device memory access at %p in kernel %s, block (%u,%u,%u), "
        "thread (%u,%u,%u) (out of bounds, freed, or a fiber stack overflow)\n",
        info->si_addr, runner->launch()->name.c_str(), c.block_idx.x, c.block_idx.y, c.block_idx.z,
        c.thread_idx.x, c.thread_idx.y, c.thread_idx.z);
    if (n > 0) (void)!write(STDERR_FILENO, text, static_cast<size_t>(std::min<int>(n, 511)));
  }
  sigaction(signal, signal == SIGSEGV ? &g_previous_segv : &g_previous_bus, nullptr);
  (void)context;
  // Returning re-executes the access under the previous handler.
}

// Signal handlers run on an alternate stack: a fiber stack overflow leaves no room on its own.
void InstallFaultHandler() {
  static const bool installed = [] {
    struct sigaction action {};
    action.sa_sigaction = &OnFault;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &g_previous_segv);
    sigaction(SIGBUS, &action, &g_previous_bus);
    return true;
  }();
  (void)installed;
  thread_local const bool alternate = [] {
    stack_t stack{};
    stack.ss_size = 64 << 10;
    stack.ss_sp = std::malloc(stack.ss_size);
    sigaltstack(&stack, nullptr);
    return true;
  }();
  (void)alternate;
}

}  // namespace

void SyncThreads() {
  if (t_runner == nullptr || !t_runner->in_kernel()) OutsideKernel("__syncthreads");
  t_runner->SyncThreads();
}

uint64_t WarpExchange(unsigned mask, uint64_t value, int source_lane, const char* operation) {
  if (t_runner == nullptr || !t_runner->in_kernel()) OutsideKernel(operation);
  return t_runner->Exchange(mask, value, source_lane, operation);
}

void SyncWarp(unsigned mask) {
  if (t_runner == nullptr || !t_runner->in_kernel()) OutsideKernel("__syncwarp");
  t_runner->WarpBarrier(mask, "__syncwarp");
}

unsigned WarpBallot(unsigned mask, bool predicate, const char* operation) {
  if (t_runner == nullptr || !t_runner->in_kernel()) OutsideKernel(operation);
  return t_runner->Ballot(mask, predicate, operation);
}

void* DynamicSharedMemory() {
  if (t_runner == nullptr || !t_runner->in_kernel()) OutsideKernel("extern __shared__");
  return t_runner->shared();
}

void SetMaxDynamicSharedMemory(const void* kernel, int bytes) {
  std::lock_guard<std::mutex> lock(g_attributes_mutex);
  g_max_dynamic_shared[kernel] = bytes;
}

void LaunchGrid(const char* name, const void* kernel, dim3 grid, dim3 block, size_t shared_bytes,
                cudaStream_t stream, std::function<void()> thread_body) {
  const int64_t threads = int64_t{block.x} * block.y * block.z;
  size_t shared_limit = kDefaultSharedBytes;
  {
    std::lock_guard<std::mutex> lock(g_attributes_mutex);
    if (auto it = g_max_dynamic_shared.find(kernel); it != g_max_dynamic_shared.end()) {
      shared_limit = static_cast<size_t>(it->second);
    }
  }
  std::string invalid;
  if (threads <= 0 || threads > kMaxThreadsPerBlock || block.z > 64) {
    invalid = "block " + Dim(block) + " (at most 1024 threads, z at most 64)";
  } else if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 ||
             grid.x > 2147483647u) {
    invalid = "grid " + Dim(grid);
  } else if (shared_bytes > shared_limit || shared_bytes > kMaxSharedBytes) {
    invalid = std::to_string(shared_bytes) + " bytes of dynamic shared memory (limit " +
              std::to_string(shared_limit) + ")";
  }
  if (!invalid.empty()) {
    SetLaunchError(cudaErrorInvalidConfiguration,
                   std::string("emulated CUDA: launch of ") + name + ": invalid " + invalid);
    return;
  }
  GetCounters().kernel_launches++;
  auto launch = std::make_shared<Launch>();
  launch->name = name;
  launch->grid = grid;
  launch->block = block;
  launch->shared_bytes = shared_bytes;
  launch->body = std::move(thread_body);
  Enqueue(stream, name, [launch] {
    const std::string failure = BlockPool::Get().RunAll(*launch);
    if (!failure.empty()) {
      Fault(cudaErrorLaunchFailure, "emulated CUDA sanitizer: " + failure);
      return;
    }
    AfterKernel(launch->name);
  });
}

}  // namespace bigmac::device::cuda::emulation
