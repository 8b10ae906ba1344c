// The CPU's blocked causal attention alone (plugins/sdk/cpu_kernels.h FlashAttentionForward and
// FlashAttentionBackward) on seeded random inputs: milliseconds per call, the GFLOP/s of the
// full-square FLOPs the benchmarks count (4 b t^2 c forward, twice that backward), and a checksum
// of the gradients, so that two builds can be compared for time and bits.
//
//   attention_speed [b t c h kv_heads repeats]   (default 4 256 512 8 8 20; OMP_NUM_THREADS)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "plugins/sdk/cpu_kernels.h"

int main(int argc, char** argv) {
  if (argc > 1 && argc != 7) {
    std::fprintf(stderr, "usage: attention_speed [b t c h kv_heads repeats]\n");
    return 2;
  }
  const int b = argc > 1 ? std::atoi(argv[1]) : 4;
  const int t = argc > 1 ? std::atoi(argv[2]) : 256;
  const int c = argc > 1 ? std::atoi(argv[3]) : 512;
  const int h = argc > 1 ? std::atoi(argv[4]) : 8;
  const int kv = argc > 1 ? std::atoi(argv[5]) : 8;
  const int repeats = argc > 1 ? std::atoi(argv[6]) : 20;
  if (b <= 0 || t <= 0 || c <= 0 || h <= 0 || kv <= 0 || c % h != 0 || h % kv != 0 ||
      repeats <= 0) {
    std::fprintf(stderr,
                 "attention_speed: need b, t, c, h, kv_heads, repeats > 0, h | c, kv | h\n");
    return 2;
  }
  const int64_t width = c + 2 * int64_t{kv} * (c / h);
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> qkv(int64_t{b} * t * width), dout(int64_t{b} * t * c);
  for (float& x : qkv) x = normal(rng);
  for (float& x : dout) x = normal(rng);
  std::vector<float> out(dout.size()), lse(int64_t{b} * h * t), dqkv(qkv.size());
  using Clock = std::chrono::steady_clock;
  double forward_ms = 1e30, backward_ms = 1e30;  // best of the repeats
  for (int r = 0; r <= repeats; ++r) {           // the first call of each warms up
    const auto t0 = Clock::now();
    bigmac::sdk::cpu::FlashAttentionForward(out.data(), lse.data(), qkv.data(), b, t, c, h, kv);
    const auto t1 = Clock::now();
    bigmac::sdk::cpu::FlashAttentionBackward(dqkv.data(), dout.data(), qkv.data(), lse.data(), b, t,
                                             c, h, kv);
    const auto t2 = Clock::now();
    if (r == 0) continue;
    forward_ms = std::min(forward_ms, std::chrono::duration<double, std::milli>(t1 - t0).count());
    backward_ms = std::min(backward_ms, std::chrono::duration<double, std::milli>(t2 - t1).count());
  }
  double checksum = 0;
  for (float x : dqkv) checksum += x;
  const double flops = 4.0 * b * t * double(t) * c;
  std::printf(
      "attention b=%d t=%d c=%d h=%d kv=%d: forward %.3f ms (%.1f GFLOP/s), backward %.3f ms "
      "(%.1f GFLOP/s), dqkv checksum %.9e\n",
      b, t, c, h, kv, forward_ms, flops / forward_ms / 1e6, backward_ms,
      2 * flops / backward_ms / 1e6, checksum);
  return 0;
}
