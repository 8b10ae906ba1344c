// The CPU device's reductions: the gradient norm's per-tensor sums of squares, shared out to the
// OpenMP threads (bench/NOTES.md, lever 24), give each tensor the bits of its sum on one thread.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

#include "core/device/device.h"

namespace bigmac::device {
namespace {

using memory::DType;

TEST(CpuDevice, SumSquaresEachGivesEachRegionItsOwnSumAtAnyThreadCount) {
  std::unique_ptr<Device> cpu = MakeCpuDevice(0, int64_t{1} << 30);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Sizes out of order (the device sorts them, largest first), odd ones, one past a lane width.
  const int64_t float_sizes[] = {1, 1000, 3, (int64_t{1} << 20) + 3, 9, 65536, 512, 8};
  std::vector<std::vector<float>> floats;
  for (int64_t n : float_sizes) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    floats.push_back(std::move(v));
  }
  std::vector<double> doubles(4097);
  for (double& x : doubles) x = normal(rng);
  std::vector<Device::Region> regions;
  for (const auto& v : floats)
    regions.push_back({v.data(), DType::kF32, static_cast<int64_t>(v.size())});
  regions.push_back({doubles.data(), DType::kF64, static_cast<int64_t>(doubles.size())});
  std::vector<double> alone;
  for (const Device::Region& r : regions) alone.push_back(cpu->SumSquares(r.data, r.dtype, r.n));

  const int threads_before = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    const std::vector<double> each = cpu->SumSquaresEach(regions);
    ASSERT_EQ(each.size(), regions.size());
    for (size_t i = 0; i < regions.size(); ++i) {
      EXPECT_EQ(std::memcmp(&each[i], &alone[i], sizeof(double)), 0)
          << "region " << i << " (" << regions[i].n << " values) at " << threads
          << " threads: " << each[i] << " against " << alone[i];
    }
  }
  omp_set_num_threads(threads_before);
}

TEST(CpuDevice, SumSquaresEachOfAnUnsupportedDtypeThrowsOutsideTheThreads) {
  std::unique_ptr<Device> cpu = MakeCpuDevice(0, int64_t{1} << 30);
  std::vector<float> ok(100, 1.0f);
  std::vector<uint16_t> bf16(100, 0);
  const std::vector<Device::Region> regions = {{ok.data(), DType::kF32, 100},
                                               {bf16.data(), DType::kBF16, 100}};
  const int threads_before = omp_get_max_threads();
  omp_set_num_threads(2);
  EXPECT_THROW(cpu->SumSquaresEach(regions), std::logic_error);
  omp_set_num_threads(threads_before);
}

}  // namespace
}  // namespace bigmac::device
