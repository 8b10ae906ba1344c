#include "core/comm/pipeline_comm.h"

#include <deque>
#include <map>

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

namespace {

class LocalPipelineComm : public PipelineComm {
 public:
  int pp_rank() const override { return 0; }
  int pp_size() const override { return 1; }
  int dp_rank() const override { return 0; }
  int dp_size() const override { return 1; }
  int world_rank() const override { return 0; }

  void Send(memory::Tensor tensor, int, int tag, const std::string&) override {
    CountSent(tag, tensor.bytes());
    queues_[tag].push_back(std::move(tensor));
  }
  memory::Tensor Receive(int peer, int tag, const std::vector<int64_t>& shape, memory::DType dtype,
                         device::Device*, const std::string& what) override {
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
  void FinishSends() override {}
  void AllReduceSumDp(memory::Tensor*) override {}
  double AllReduceSumPp(double value) override { return value; }
  double SumToRoot(double value) override { return value; }
  double MaxToRoot(double value) override { return value; }
  std::vector<std::string> GatherToRoot(const std::string& text) override { return {text}; }
  std::vector<std::vector<int>> AllGatherPp(const std::vector<int>& values) override {
    return {values};
  }
  bool AllOk(bool ok) override { return ok; }

 private:
  std::map<int, std::deque<memory::Tensor>> queues_;
};

}  // namespace

std::unique_ptr<PipelineComm> MakeLocalPipelineComm() {
  return std::make_unique<LocalPipelineComm>();
}

}  // namespace bigmac::comm
