#ifndef BIGMAC_STAGES_CPU_CHUNK_QUEUES_H_
#define BIGMAC_STAGES_CPU_CHUNK_QUEUES_H_

// How the blocked GEMM's team shares out chunks of C's rows: each thread its own share first,
// then the rest of the others' shares.
//
// Thread t of a team of T runs chunks [t * count / T, (t + 1) * count / T) in order, then takes
// chunks from the back of the other threads' shares while any are left. So a thread computes the
// same rows of C in every k block and every product (as the other kernels' static loops share
// rows out), and the lines of those rows stay in its own caches; a slowed thread still has its
// chunks taken from it. On this project's shared hosts the two vCPUs are often on different core
// complexes, 165 ns apart instead of 28, and a line one core wrote costs the other that to read
// (bench/NOTES.md, lever 23). Which thread runs a chunk never changes a bit of the result.
//
// One object per product, shared by its team, which outlives every call. Its loops are numbered
// 1, 2, ... in the order the team runs them; whoever first touches a share in a loop sets it up,
// so no loop needs a barrier before it (a thread still in an earlier loop finds the newer loop's
// shares and takes nothing from them), but whatever must follow all of a loop's chunks needs one
// after it.
#include <omp.h>

#include <array>
#include <atomic>
#include <cstdint>

namespace bigmac::sdk::cpu::internal {

class ChunkQueues {
 public:
  static constexpr int kMaxThreads = 64;

  ChunkQueues() = default;
  ChunkQueues(const ChunkQueues&) = delete;
  ChunkQueues& operator=(const ChunkQueues&) = delete;

  // Whether a team of `threads` can run loops of `count` chunks, `loops` of them, this way.
  static bool Fits(int threads, int64_t count, int64_t loops) {
    return threads <= kMaxThreads && count < kLimit && loops < kLoops;
  }

  // f(chunk) for each chunk of loop `loop` (1, 2, ...) that this thread takes. Every thread of
  // the enclosing team calls it for every loop, with the same count.
  template <typename F>
  void ForEach(int loop, int count, const F& f) {
    const int threads = omp_get_num_threads();
    const int self = omp_get_thread_num();
    for (int chunk; (chunk = Take(loop, count, threads, self, true)) >= 0;) f(chunk);
    for (int other = 1; other < threads; ++other) {
      const int owner = (self + other) % threads;
      for (int chunk; (chunk = Take(loop, count, threads, owner, false)) >= 0;) f(chunk);
    }
  }

 private:
  // A share's state in one word: its loop (16 bits), then the chunks left, [front, back) (24
  // bits each).
  static constexpr int64_t kLimit = int64_t{1} << 24;
  static constexpr int64_t kLoops = int64_t{1} << 16;
  static uint64_t Pack(uint64_t loop, uint64_t front, uint64_t back) {
    return loop << 48 | front << 24 | back;
  }

  // The next chunk of `owner`'s share in loop `loop`: its front for the owner, its back for
  // another thread; -1 when none is left.
  int Take(int loop, int count, int threads, int owner, bool front) {
    std::atomic<uint64_t>& word = shares_[owner].word;
    const uint64_t fresh =
        Pack(loop, int64_t{count} * owner / threads, int64_t{count} * (owner + 1) / threads);
    uint64_t seen = word.load(std::memory_order_acquire);
    while (true) {
      const int64_t seen_loop = static_cast<int64_t>(seen >> 48);
      if (seen_loop > loop) return -1;  // this loop's chunks are all taken: a later loop's share
      if (seen_loop < loop) {           // an earlier loop's share, emptied
        if (!word.compare_exchange_weak(seen, fresh, std::memory_order_acq_rel)) continue;
        seen = fresh;
      }
      const uint64_t begin = seen >> 24 & (kLimit - 1);
      const uint64_t end = seen & (kLimit - 1);
      if (begin >= end) return -1;
      const uint64_t next = front ? Pack(loop, begin + 1, end) : Pack(loop, begin, end - 1);
      if (word.compare_exchange_weak(seen, next, std::memory_order_acq_rel)) {
        return static_cast<int>(front ? begin : end - 1);
      }
    }
  }

  struct alignas(64) Share {  // a line each: the owners' updates do not collide
    std::atomic<uint64_t> word{0};
  };
  std::array<Share, kMaxThreads> shares_;
};

}  // namespace bigmac::sdk::cpu::internal

#endif  // BIGMAC_STAGES_CPU_CHUNK_QUEUES_H_
