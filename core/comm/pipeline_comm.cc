#include "core/comm/pipeline_comm.h"

#include <stdexcept>

namespace bigmac::comm {

std::string DescribeTensor(memory::DType dtype, const std::vector<int64_t>& shape) {
  std::string text = memory::DTypeName(dtype) + "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

int ActivationTag(int stage, int microbatch) { return (stage % 32) * 256 + microbatch % 256; }
int GradientTag(int stage, int microbatch) { return (32 + stage % 32) * 256 + microbatch % 256; }

std::vector<memory::Tensor> PipelineComm::Exchange(std::vector<Outgoing> sends,
                                                   const std::vector<Incoming>& receives) {
  for (Outgoing& send : sends) Send(std::move(send.tensor), send.peer, send.tag, send.what);
  std::vector<memory::Tensor> received;
  for (const Incoming& in : receives)
    received.push_back(Receive(in.peer, in.tag, in.shape, in.dtype, in.device, in.what));
  return received;
}

int PipelineComm::StartAllReduceSumDp(memory::Tensor* tensor, const std::string&) {
  AllReduceSumDp(tensor);
  return default_reductions_++;
}

ShardRange DpShardOf(int64_t numel, int dp_size, int dp_rank) {
  if (dp_size < 1 || numel % dp_size != 0)
    throw std::logic_error("a dp shard of " + std::to_string(numel) + " elements over " +
                           std::to_string(dp_size) + " ranks: not a multiple");
  const int64_t shard = numel / dp_size;
  return {dp_rank * shard, (dp_rank + 1) * shard};
}

int PipelineComm::StartReduceScatterSumDp(memory::Tensor* tensor, const std::string& what) {
  DpShardOf(tensor->numel(), dp_size(), dp_rank());  // checks the shape
  return StartAllReduceSumDp(tensor, what);          // every shard holds the sum
}

int PipelineComm::StartAllGatherDp(memory::Tensor* tensor, const std::string& what) {
  // The other ranks' shards are zeroed and the group sums: x + 0 + ... + 0 is x, exactly.
  const ShardRange own = DpShardOf(tensor->numel(), dp_size(), dp_rank());
  const int64_t element = memory::DTypeSize(tensor->dtype());
  char* data = static_cast<char*>(tensor->raw());
  tensor->device()->Memset(data, own.begin * element);
  tensor->device()->Memset(data + own.end * element, (tensor->numel() - own.end) * element);
  return StartAllReduceSumDp(tensor, what);
}

bool PipelineComm::TestAllReduce(int handle) {
  if (handle < 0 || handle >= default_reductions_)
    throw std::logic_error("TestAllReduce: no reduction " + std::to_string(handle) +
                           " was started");
  return true;
}

void PipelineComm::WaitAllReduces() { default_reductions_ = 0; }

void PipelineComm::AllReduceTp(memory::Tensor*, ReduceOp, const std::string& what) {
  if (tp_size() > 1) throw std::logic_error(what + ": this transport has no tp all-reduce");
}

std::vector<memory::Tensor> PipelineComm::AllGatherTp(const memory::Tensor& tensor) {
  if (tp_size() > 1) throw std::logic_error("this transport has no tp all-gather");
  std::vector<memory::Tensor> all;
  all.push_back(tensor.Clone());
  return all;
}

void LocalPipelineComm::Send(memory::Tensor tensor, int, int tag, const std::string&) {
  CountSent(tag, tensor.bytes());
  queues_[tag].push_back(std::move(tensor));
}

memory::Tensor LocalPipelineComm::Receive(int peer, int tag, const std::vector<int64_t>& shape,
                                          memory::DType dtype, device::Device*,
                                          const std::string& what) {
  auto it = queues_.find(tag);
  if (it == queues_.end() || it->second.empty()) {
    throw DeadlineError(what + " from rank " + std::to_string(peer) +
                        ": nothing was sent, so this would wait forever");
  }
  memory::Tensor tensor = std::move(it->second.front());
  it->second.pop_front();
  if (tensor.shape() != shape || tensor.dtype() != dtype) {
    throw TransportError(what + ": shape or dtype mismatch (" + tensor.ShapeString() + ")");
  }
  return tensor;
}

std::unique_ptr<PipelineComm> MakeLocalPipelineComm() {
  return std::make_unique<LocalPipelineComm>();
}

}  // namespace bigmac::comm
