#ifndef BIGMAC_CORE_COMM_STAGING_POOL_H_
#define BIGMAC_CORE_COMM_STAGING_POOL_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/device/device.h"

namespace bigmac::comm {

// Host buffers for staging, from the devices' AllocateHostStaging (pinned on CUDA, where a
// cudaHostAlloc costs far more than a message): a released buffer waits for the next message that
// fits, and at most kKeep wait (the largest are kept).
class StagingPool {
 public:
  struct Block {
    device::Device* device = nullptr;
    char* data = nullptr;
    int64_t capacity = 0;
  };
  // A block on loan; back to the pool when destroyed.
  class Buffer {
   public:
    Buffer() = default;
    Buffer(StagingPool* pool, Block block) : pool_(pool), block_(block) {}
    Buffer(Buffer&& other) noexcept : pool_(other.pool_), block_(other.block_) {
      other.pool_ = nullptr;
    }
    Buffer& operator=(Buffer&& other) noexcept {
      if (this != &other) {
        Return();
        pool_ = other.pool_;
        block_ = other.block_;
        other.pool_ = nullptr;
      }
      return *this;
    }
    ~Buffer() { Return(); }
    char* data() const { return block_.data; }

   private:
    void Return() {
      if (pool_) pool_->Release(block_);
      pool_ = nullptr;
    }
    StagingPool* pool_ = nullptr;
    Block block_;
  };

  StagingPool() = default;
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;
  ~StagingPool() {
    for (const Block& block : free_) block.device->FreeHostStaging(block.data);
  }

  Buffer Acquire(device::Device* device, int64_t bytes) {
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->device == device && it->capacity >= bytes &&
          (best == free_.end() || it->capacity < best->capacity)) {
        best = it;
      }
    }
    if (best != free_.end()) {
      const Block block = *best;
      free_.erase(best);
      return Buffer(this, block);
    }
    constexpr int64_t kGrain = int64_t{64} << 10;
    const int64_t capacity = std::max<int64_t>(kGrain, (bytes + kGrain - 1) / kGrain * kGrain);
    Block block{device, static_cast<char*>(device->AllocateHostStaging(capacity)), capacity};
    ++buffers_;
    bytes_ += capacity;
    return Buffer(this, block);
  }

  int64_t buffers() const { return buffers_; }
  int64_t bytes() const { return bytes_; }

 private:
  static constexpr size_t kKeep = 8;
  void Release(const Block& block) {
    free_.push_back(block);
    if (free_.size() <= kKeep) return;
    auto smallest =
        std::min_element(free_.begin(), free_.end(),
                         [](const Block& a, const Block& b) { return a.capacity < b.capacity; });
    smallest->device->FreeHostStaging(smallest->data);
    free_.erase(smallest);
  }

  std::vector<Block> free_;
  int64_t buffers_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace bigmac::comm

#endif  // BIGMAC_CORE_COMM_STAGING_POOL_H_
