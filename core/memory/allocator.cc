#include "core/memory/allocator.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/util/host_memory.h"

namespace bigmac::memory {
namespace {

constexpr int64_t kAlignment = 64;
constexpr double kMiB = 1024.0 * 1024.0;

}  // namespace

std::string FormatMiB(int64_t bytes) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.2f MiB", static_cast<double>(bytes) / kMiB);
  return text;
}

OutOfMemoryError::OutOfMemoryError(const std::string& device, int64_t requested, int64_t capacity,
                                   int64_t in_use)
    : std::runtime_error(device + ": out of memory: tried to allocate " + FormatMiB(requested) +
                         "; capacity " + FormatMiB(capacity) + ", " + FormatMiB(capacity - in_use) +
                         " free (" + FormatMiB(in_use) + " in use)"),
      requested_(requested) {}

SystemMemory SystemMemory::Host() {
  return {::bigmac::util::AllocateHost, [](void* pointer) { std::free(pointer); }};
}

DeviceAllocator::DeviceAllocator(std::string device, int64_t capacity_bytes, SystemMemory system)
    : device_(std::move(device)), capacity_(capacity_bytes), system_(std::move(system)) {
  if (capacity_bytes <= 0) throw std::invalid_argument(device_ + ": capacity must be > 0 bytes");
}

DeviceAllocator::~DeviceAllocator() {
  for (auto& [pointer, block] : live_) system_.free(pointer);
  ReleaseCacheLocked();
}

void DeviceAllocator::ReleaseCacheLocked() {
  for (auto& [rounded, blocks] : free_by_size_) {
    for (void* pointer : blocks) system_.free(pointer);
  }
  free_by_size_.clear();
  cached_ = 0;
}

void* DeviceAllocator::Allocate(int64_t bytes) {
  if (bytes <= 0)
    throw std::invalid_argument(device_ + ": allocation of " + std::to_string(bytes) + " bytes");
  std::lock_guard<std::mutex> lock(mutex_);
  if (bytes > capacity_ - current_) throw OutOfMemoryError(device_, bytes, capacity_, current_);
  const int64_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* pointer = nullptr;
  if (auto it = free_by_size_.find(rounded); it != free_by_size_.end() && !it->second.empty()) {
    pointer = it->second.back();
    it->second.pop_back();
    cached_ -= rounded;
    if (system_.reused) system_.reused(pointer, rounded);
  } else {
    // Live and cached memory together stay within the capacity: drop the cache if they would not.
    if (rounded > capacity_ - current_ - cached_) ReleaseCacheLocked();
    pointer = system_.allocate(rounded);
    // Cached blocks of other sizes may be what the system lacks (cudaMalloc fragments): return
    // them and try once more before giving up.
    if (!pointer && cached_ > 0) {
      ReleaseCacheLocked();
      pointer = system_.allocate(rounded);
    }
    // The system itself ran out before our capacity did: report it the same way.
    if (!pointer) throw OutOfMemoryError(device_ + " (system)", bytes, capacity_, current_);
    ++system_allocations_;
  }
  live_[pointer] = {bytes, rounded};
  current_ += bytes;
  if (current_ > peak_) peak_ = current_;
  return pointer;
}

void DeviceAllocator::Free(void* pointer) {
  if (!pointer) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(pointer);
  if (it == live_.end())
    throw std::logic_error(device_ + ": Free of memory this allocator did not allocate");
  current_ -= it->second.bytes;
  cached_ += it->second.rounded;
  free_by_size_[it->second.rounded].push_back(pointer);
  live_.erase(it);
}

int64_t DeviceAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_;
}

int64_t DeviceAllocator::system_allocations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return system_allocations_;
}

int64_t DeviceAllocator::current_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return current_;
}

int64_t DeviceAllocator::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_;
}

void DeviceAllocator::ResetPeak() {
  std::lock_guard<std::mutex> lock(mutex_);
  peak_ = current_;
}

int64_t CpuCapacity(int64_t limit_bytes, int ranks_on_node) {
  if (limit_bytes > 0) return limit_bytes;
  const int64_t physical = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  return physical / std::max(1, ranks_on_node);
}

bool ParseByteSize(const std::string& text, int64_t* bytes, std::string* error) {
  size_t at = 0;
  while (at < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[at])) || text[at] == '.'))
    ++at;
  const std::string number = text.substr(0, at);
  std::string unit = text.substr(at);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  char* end = nullptr;
  const double value = number.empty() ? 0 : std::strtod(number.c_str(), &end);
  static const std::pair<const char*, double> kUnits[] = {{"", 1},
                                                          {"B", 1},
                                                          {"KiB", 1024.0},
                                                          {"MiB", kMiB},
                                                          {"GiB", kMiB * 1024},
                                                          {"TiB", kMiB * kMiB},
                                                          {"KB", 1e3},
                                                          {"MB", 1e6},
                                                          {"GB", 1e9},
                                                          {"TB", 1e12}};
  for (const auto& [name, scale] : kUnits) {
    if (unit == name) {
      if (number.empty() || !end || *end != '\0' || value <= 0 || !std::isfinite(value * scale) ||
          value * scale >= 9.2e18) {
        break;
      }
      *bytes = static_cast<int64_t>(std::llround(value * scale));
      if (*bytes > 0) return true;
      break;
    }
  }
  *error = "'" + text + "' is not a positive size like 512MiB, 2GiB or 1048576 (bytes)";
  return false;
}

}  // namespace bigmac::memory
