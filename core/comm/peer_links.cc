#include "core/comm/peer_links.h"

#include "core/comm/pipeline_comm.h"

namespace bigmac::comm {

int ActivationTag(int stage, int microbatch) { return (stage % 32) * 256 + microbatch % 256; }
int GradientTag(int stage, int microbatch) { return (32 + stage % 32) * 256 + microbatch % 256; }

std::vector<memory::Tensor> PeerLinks::Exchange(std::vector<Outgoing> sends,
                                                const std::vector<Incoming>& receives) {
  for (Outgoing& send : sends) Send(std::move(send.tensor), send.peer, send.tag, send.what);
  std::vector<memory::Tensor> received;
  for (const Incoming& in : receives)
    received.push_back(Receive(in.peer, in.tag, in.shape, in.dtype, in.device, in.what));
  return received;
}

void LocalLinks::Send(memory::Tensor tensor, int, int tag, const std::string&) {
  CountSent(tag, tensor.bytes());
  queues_[tag].push_back(std::move(tensor));
}

memory::Tensor LocalLinks::Receive(int peer, int tag, const std::vector<int64_t>& shape,
                                   memory::DType dtype, device::Device*, const std::string& what) {
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

}  // namespace bigmac::comm
