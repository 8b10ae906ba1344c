#include "core/comm/pipeline_comm.h"

#include <stdexcept>

namespace bigmac::comm {

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
