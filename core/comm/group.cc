#include "core/comm/group.h"

#include <chrono>
#include <stdexcept>

namespace bigmac::comm {

ShardRange DpShardOf(int64_t numel, int size, int rank) {
  if (size < 1 || numel % size != 0)
    throw std::logic_error("a dp shard of " + std::to_string(numel) + " elements over " +
                           std::to_string(size) + " ranks: not a multiple");
  const int64_t shard = numel / size;
  return {rank * shard, (rank + 1) * shard};
}

int Group::StartReduceScatter(memory::Tensor* tensor, const std::string& what) {
  DpShardOf(tensor->numel(), size(), rank());           // checks the shape
  return StartAllReduce(tensor, ReduceOp::kSum, what);  // every shard holds the sum
}

int Group::StartAllGather(memory::Tensor* tensor, const std::string& what) {
  // The other ranks' shards are zeroed and the group sums: x + 0 + ... + 0 is x, exactly.
  const ShardRange own = DpShardOf(tensor->numel(), size(), rank());
  const int64_t element = memory::DTypeSize(tensor->dtype());
  char* data = static_cast<char*>(tensor->raw());
  tensor->device()->Memset(data, own.begin * element);
  tensor->device()->Memset(data + own.end * element, (tensor->numel() - own.end) * element);
  return StartAllReduce(tensor, ReduceOp::kSum, what);
}

void Group::AllReduce(memory::Tensor* tensor, ReduceOp op, const std::string& what) {
  const auto start = std::chrono::steady_clock::now();
  if (StartAllReduce(tensor, op, what) != 0) {
    throw std::logic_error(what +
                           ": a blocking all-reduce while non-blocking collectives are in "
                           "flight on the " +
                           name() + " group");
  }
  WaitAll();
  blocking_bytes_ += tensor->bytes();
  blocking_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int LocalGroup::StartAllReduce(memory::Tensor*, ReduceOp, const std::string&) { return started_++; }

bool LocalGroup::Test(int handle) {
  if (handle < 0 || handle >= started_)
    throw std::logic_error("Test: no collective " + std::to_string(handle) + " was started");
  return true;
}

std::vector<memory::Tensor> LocalGroup::AllGather(const memory::Tensor& tensor,
                                                  const std::string&) {
  std::vector<memory::Tensor> all;
  all.push_back(tensor.Clone());
  return all;
}

}  // namespace bigmac::comm
