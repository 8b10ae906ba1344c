#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "core/memory/allocator.h"

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
