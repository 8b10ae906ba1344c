#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "core/device/device.h"
#include "core/memory/allocator.h"
#include "core/memory/tensor.h"

namespace bigmac::memory {
namespace {

constexpr int64_t kMiB = 1 << 20;

TEST(Allocator, TracksCurrentAndPeak) {
  DeviceAllocator allocator("cpu:0", 8 * kMiB);
  void* a = allocator.Allocate(3 * kMiB);
  void* b = allocator.Allocate(2 * kMiB);
  EXPECT_EQ(allocator.current_bytes(), 5 * kMiB);
  allocator.Free(a);
  EXPECT_EQ(allocator.current_bytes(), 2 * kMiB);
  EXPECT_EQ(allocator.peak_bytes(), 5 * kMiB);
  allocator.ResetPeak();
  EXPECT_EQ(allocator.peak_bytes(), 2 * kMiB);
  allocator.Free(b);
  EXPECT_EQ(allocator.current_bytes(), 0);
}

TEST(Allocator, FreedBlocksAreReusedWithoutSystemAllocations) {
  DeviceAllocator allocator("cpu:0", 64 * kMiB);
  void* a = allocator.Allocate(3 * kMiB);
  void* b = allocator.Allocate(1000);
  EXPECT_EQ(allocator.system_allocations(), 2);
  allocator.Free(a);
  allocator.Free(b);
  EXPECT_EQ(allocator.current_bytes(), 0);
  EXPECT_EQ(allocator.cached_bytes(), 3 * kMiB + 1024);  // 1000 rounds up to the 64-byte class
  // The same sizes again (a second training step): served from the cache.
  EXPECT_EQ(allocator.Allocate(3 * kMiB), a);
  EXPECT_EQ(allocator.Allocate(1000), b);
  // Live blocks are never handed out twice: two more of b's size class come from the system.
  void* c = allocator.Allocate(990);
  void* d = allocator.Allocate(990);
  EXPECT_NE(c, d);
  EXPECT_NE(c, b);
  EXPECT_EQ(allocator.system_allocations(), 4);
  EXPECT_EQ(allocator.cached_bytes(), 0);
  EXPECT_EQ(allocator.peak_bytes(), 3 * kMiB + 1000 + 2 * 990);
}

TEST(Allocator, TheReusedHookSeesCachedBlocksOnly) {
  std::vector<std::pair<void*, int64_t>> reused;
  memory::SystemMemory system = memory::SystemMemory::Host();
  system.reused = [&](void* pointer, int64_t bytes) { reused.emplace_back(pointer, bytes); };
  DeviceAllocator allocator("cpu:0", 64 * kMiB, system);
  void* a = allocator.Allocate(1000);
  EXPECT_TRUE(reused.empty()) << "memory from the system is not a reused block";
  allocator.Free(a);
  EXPECT_EQ(allocator.Allocate(1000), a);
  ASSERT_EQ(reused.size(), 1u);
  EXPECT_EQ(reused[0].first, a);
  EXPECT_EQ(reused[0].second, 1024);  // the whole size class
  allocator.Free(a);
}

TEST(Allocator, TheCacheGivesWayToAnAllocationThatFitsTheCapacity) {
  DeviceAllocator allocator("cpu:0", 10 * kMiB);
  allocator.Free(allocator.Allocate(6 * kMiB));
  EXPECT_EQ(allocator.cached_bytes(), 6 * kMiB);
  // 7 MiB fits the capacity only without the cached 6 MiB: the cache is released, no OOM.
  void* b = allocator.Allocate(7 * kMiB);
  EXPECT_EQ(allocator.cached_bytes(), 0);
  EXPECT_EQ(allocator.current_bytes(), 7 * kMiB);
  // Live memory still bounds it: 4 MiB more does not fit.
  EXPECT_THROW(allocator.Allocate(4 * kMiB), OutOfMemoryError);
  allocator.Free(b);
}

TEST(Allocator, MemoryIsAlignedAndUsable) {
  DeviceAllocator allocator("cpu:0", kMiB);
  auto* floats = static_cast<float*>(allocator.Allocate(1000 * sizeof(float)));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(floats) % 64, 0u);
  for (int i = 0; i < 1000; ++i) floats[i] = static_cast<float>(i) * 0.5f;
  EXPECT_EQ(floats[999], 499.5f);
  allocator.Free(floats);
}

TEST(Allocator, OverCapacityIsACudaStyleOutOfMemoryError) {
  DeviceAllocator allocator("cpu:3", 10 * kMiB);
  void* a = allocator.Allocate(6 * kMiB);
  try {
    allocator.Allocate(5 * kMiB);
    FAIL() << "allocated past the capacity";
  } catch (const OutOfMemoryError& error) {
    EXPECT_EQ(std::string(error.what()),
              "cpu:3: out of memory: tried to allocate 5.00 MiB; capacity 10.00 MiB, 4.00 MiB free "
              "(6.00 MiB in use)");
    EXPECT_EQ(error.requested(), 5 * kMiB);
  }
  // The failed request left the books unchanged, and what fits still fits.
  EXPECT_EQ(allocator.current_bytes(), 6 * kMiB);
  void* b = allocator.Allocate(4 * kMiB);
  EXPECT_EQ(allocator.current_bytes(), 10 * kMiB);
  allocator.Free(a);
  allocator.Free(b);
}

TEST(Allocator, RejectsForeignPointersAndBadSizes) {
  DeviceAllocator allocator("cpu:0", kMiB);
  int on_stack = 0;
  EXPECT_THROW(allocator.Free(&on_stack), std::logic_error);
  EXPECT_THROW(allocator.Allocate(0), std::invalid_argument);
  EXPECT_THROW(DeviceAllocator("cpu:0", 0), std::invalid_argument);
}

TEST(Allocator, ThreadSafeAccounting) {
  DeviceAllocator allocator("cpu:0", 64 * kMiB);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&allocator] {
      for (int i = 0; i < 500; ++i) allocator.Free(allocator.Allocate(1000 + i));
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(allocator.current_bytes(), 0);
  EXPECT_GE(allocator.peak_bytes(), 1000);
}

// A tensor is zeroed unless made ForOverwrite, which skips the pass: a freed block comes back
// from the cache with its old bytes. Clone copies every byte either way.
TEST(Tensor, ForOverwriteSkipsTheZeroing) {
  std::unique_ptr<device::Device> cpu = device::MakeCpuDevice(0, 64 * kMiB);
  {
    Tensor used(cpu.get(), {1024}, DType::kF32);
    for (int i = 0; i < 1024; ++i) used.data<float>()[i] = 7.0f;
  }
  Tensor again = Tensor::ForOverwrite(cpu.get(), {1024}, DType::kF32);
  EXPECT_EQ(again.data<float>()[5], 7.0f);  // the cached block, as it was left
  EXPECT_EQ(again.ShapeString(), "f32[1024]");
  again.data<float>()[5] = 3.0f;
  const Tensor copy = again.Clone();
  EXPECT_EQ(copy.data<float>()[5], 3.0f);
  EXPECT_EQ(copy.data<float>()[6], 7.0f);
  again = Tensor();  // back to the cache, dirty
  const Tensor zeroed(cpu.get(), {1024}, DType::kF32);
  EXPECT_EQ(zeroed.data<float>()[6], 0.0f);  // the same block, zeroed
}

TEST(ByteSize, ParsesUnits) {
  int64_t bytes = 0;
  std::string error;
  ASSERT_TRUE(ParseByteSize("512MiB", &bytes, &error));
  EXPECT_EQ(bytes, 512 * kMiB);
  ASSERT_TRUE(ParseByteSize("1.5 GiB", &bytes, &error));
  EXPECT_EQ(bytes, 1536 * kMiB);
  ASSERT_TRUE(ParseByteSize("1048576", &bytes, &error));
  EXPECT_EQ(bytes, kMiB);
  ASSERT_TRUE(ParseByteSize("2GB", &bytes, &error));
  EXPECT_EQ(bytes, 2000000000);
  for (const char* bad : {"", "MiB", "-1MiB", "0", "12 parsecs", "1.2.3GiB", "1e99GiB"}) {
    EXPECT_FALSE(ParseByteSize(bad, &bytes, &error)) << bad;
    EXPECT_NE(error.find("is not a positive size"), std::string::npos);
  }
}

}  // namespace
}  // namespace bigmac::memory
