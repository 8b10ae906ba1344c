#ifndef BIGMAC_CORE_COMM_PIPELINE_COMM_H_
#define BIGMAC_CORE_COMM_PIPELINE_COMM_H_

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/memory/tensor.h"

namespace bigmac::comm {

// A receive that did not get what it expected (shape, dtype); names the message and the peer.
class TransportError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A wait that ran past its deadline; names the action, the message and the peer.
class DeadlineError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Message tags: activations and gradients by (stage, micro-batch), and the tied weight's exchange.
// Tags stay below 32768 (MPI guarantees no more); equal tags between one pair of ranks are matched
// in order, which the schedules preserve.
int ActivationTag(int stage, int microbatch);
int GradientTag(int stage, int microbatch);
inline constexpr int kTiedGradientTag = 16384;
inline constexpr int kTiedWeightTag = 16385;

// What the executor needs from the machines: point-to-point tensors within one pipeline (peers are
// pp ranks), reductions over the data-parallel group and the pipeline, and a little gathering for
// logs. Implementations: MPI over host memory (MakeMpiPipelineComm) and a single-process one
// (MakeLocalPipelineComm) for one rank without MPI.
class PipelineComm {
 public:
  virtual ~PipelineComm() = default;
  virtual int pp_rank() const = 0;
  virtual int pp_size() const = 0;
  virtual int dp_rank() const = 0;
  virtual int dp_size() const = 0;
  virtual int world_rank() const = 0;

  // Non-blocking: the tensor is copied into a buffer that lives until delivery.
  virtual void Send(const memory::Tensor& tensor, int peer, int tag, const std::string& what) = 0;
  // Waits up to the deadline for the message, then checks its dtype and shape against the
  // expected ones. Throws DeadlineError or TransportError.
  virtual memory::Tensor Receive(int peer, int tag, const std::vector<int64_t>& shape,
                                 memory::DType dtype, memory::DeviceAllocator* allocator,
                                 const std::string& what) = 0;
  // Waits (with the deadline) until every send has been delivered.
  virtual void FinishSends() = 0;

  virtual void AllReduceSumDp(float* data, int64_t count) = 0;
  virtual double AllReduceSumPp(double value) = 0;
  virtual double SumToRoot(double value) = 0;  // over all ranks; the result is valid on rank 0
  virtual double MaxToRoot(double value) = 0;
  virtual std::vector<std::string> GatherToRoot(const std::string& text) = 0;  // rank 0 gets all
  virtual std::vector<std::vector<int>> AllGatherPp(const std::vector<int>& values) = 0;
  // True on every rank iff every rank passed true (a barrier that also agrees on success).
  virtual bool AllOk(bool ok) = 0;
};

// One process, one rank: sends to oneself are queued, reductions are identities.
std::unique_ptr<PipelineComm> MakeLocalPipelineComm();

}  // namespace bigmac::comm

#endif  // BIGMAC_CORE_COMM_PIPELINE_COMM_H_
