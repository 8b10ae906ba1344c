#ifndef BIGMAC_CORE_COMM_PIPELINE_COMM_H_
#define BIGMAC_CORE_COMM_PIPELINE_COMM_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/device/device.h"
#include "core/device/device_spans.h"
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

// "bf16[4, 64, 128]": a tensor's dtype and shape, as transport errors print them.
std::string DescribeTensor(memory::DType dtype, const std::vector<int64_t>& shape);

// Message tags: activations and gradients by (stage, micro-batch), and the tied weight's exchange.
// Tags stay below 32768 (MPI guarantees no more); equal tags between one pair of ranks are matched
// in order, which the schedules preserve.
int ActivationTag(int stage, int microbatch);
int GradientTag(int stage, int microbatch);
inline constexpr int kTiedGradientTag = 16384;
inline constexpr int kTiedWeightTag = 16385;

// A tensor to send; the transport owns it until it is delivered.
struct Outgoing {
  memory::Tensor tensor;
  int peer = 0;
  int tag = 0;
  std::string what;
};

// A tensor to receive: where from, what it must be (checked), and the device it goes to.
struct Incoming {
  int peer = 0;
  int tag = 0;
  std::vector<int64_t> shape;
  memory::DType dtype = memory::DType::kF32;
  device::Device* device = nullptr;
  std::string what;
};

// The shard of a data-parallel reduce-scatter or all-gather that rank `dp_rank` of `dp_size`
// holds: elements [begin, end) of a tensor of `numel` elements, numel a multiple of dp_size.
struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;
};
ShardRange DpShardOf(int64_t numel, int dp_size, int dp_rank);

// What the executor needs from the machines: point-to-point tensors within one pipeline (peers are
// pp ranks), reductions over the data-parallel group and the pipeline, and a little gathering for
// logs. Implementations: MPI (MakeMpiPipelineComm; device memory is staged through pinned host
// buffers), NCCL (core/comm/nccl: device memory over NCCL, headers over MPI; docs/transport.md) and
// a single-process one (MakeLocalPipelineComm) for one rank without MPI. Tensors of any dtype
// travel; the receiver states the dtype it expects. The devices outlive the transport.
class PipelineComm {
 public:
  PipelineComm() = default;
  PipelineComm(const PipelineComm&) = delete;
  PipelineComm& operator=(const PipelineComm&) = delete;
  virtual ~PipelineComm() = default;
  virtual int pp_rank() const = 0;
  virtual int pp_size() const = 0;
  virtual int dp_rank() const = 0;
  virtual int dp_size() const = 0;
  virtual int world_rank() const = 0;

  // Non-blocking: the transport keeps `tensor` (no copy on the CPU) until it is delivered.
  virtual void Send(memory::Tensor tensor, int peer, int tag, const std::string& what) = 0;
  // Waits up to the deadline for the message, then checks its dtype and shape against the
  // expected ones. Throws DeadlineError or TransportError.
  virtual memory::Tensor Receive(int peer, int tag, const std::vector<int64_t>& shape,
                                 memory::DType dtype, device::Device* device,
                                 const std::string& what) = 0;
  // One batched exchange with neighbours: every send and every receive is posted before any is
  // waited for (NCCL's ncclGroupStart/End; an ncclSend blocks until its peer posts the receive,
  // so sends and receives issued one by one can deadlock). Returns the received tensors in the
  // order of `receives`. The default posts the sends, then waits for each receive, which is
  // the same thing for a transport whose sends never block.
  virtual std::vector<memory::Tensor> Exchange(std::vector<Outgoing> sends,
                                               const std::vector<Incoming>& receives);
  // Waits (with the deadline) until every send has been delivered.
  virtual void FinishSends() = 0;

  // Payload bytes of activations and gradients sent to pipeline neighbours so far (tags below
  // kTiedGradientTag), the traffic bf16 halves.
  int64_t activation_bytes_sent() const { return activation_bytes_sent_; }

  // Sums `tensor` (f32, f64 or bf16, summed in f32) over the data-parallel group, in place.
  virtual void AllReduceSumDp(memory::Tensor* tensor) = 0;

  // The same sum, non-blocking, so that gradient buckets are reduced while the backward still
  // computes (the executor's overlap, docs/pipeline.md). StartAllReduceSumDp begins summing
  // `tensor` in place over the data-parallel group and returns at once with a handle (0, 1, ...
  // in start order since the last WaitAllReduces); `tensor` must stay alive and must not be read
  // or written until TestAllReduce says it is done or WaitAllReduces returns. Every rank of the
  // group starts the same reductions (same counts, dtypes) in the same order, and a reduction's
  // result does not depend on when it is waited for, so the overlapped and the serial step give
  // bitwise the same sums. `what` names the reduction in a deadline message.
  // TestAllReduce lets the transport progress (it never blocks) and says whether reduction
  // `handle` is complete, its result in `tensor`. WaitAllReduces waits, with the deadline, until
  // every started reduction is complete, then forgets them (DeadlineError names the first one
  // still pending). The defaults reduce at once through AllReduceSumDp: correct, not overlapped.
  virtual int StartAllReduceSumDp(memory::Tensor* tensor, const std::string& what);
  // ZeRO-1's two halves of that sum (docs/zero.md), non-blocking, in place, on a tensor whose
  // numel is a multiple of dp_size(), cut into dp_size() equal contiguous shards (DpShardOf).
  // StartReduceScatterSumDp sums over the group into this rank's shard; the other elements are
  // left unspecified. StartAllGatherDp sends this rank's shard to every rank and receives theirs,
  // so that afterwards every rank holds the whole tensor. Their handles come from the same list
  // as StartAllReduceSumDp's (TestAllReduce, WaitAllReduces), with the same rules: every rank
  // starts the same collectives in the same order. (The in-place shapes are NCCL's:
  // ncclReduceScatter and ncclAllGather with the shard at rank * numel / dp.) The defaults go
  // through AllReduceSumDp: correct, not overlapped.
  virtual int StartReduceScatterSumDp(memory::Tensor* tensor, const std::string& what);
  virtual int StartAllGatherDp(memory::Tensor* tensor, const std::string& what);
  virtual bool TestAllReduce(int handle);
  virtual void WaitAllReduces();
  // Moves messages in flight along without blocking (MPI needs calls into it to progress a
  // rendezvous send or a collective); the executor calls it between actions. Default: nothing.
  virtual void Progress() {}
  // Where a transport with streams of its own (NCCL) times its operations on them, for the
  // trace's device track (null: nowhere). `spans` outlives the transport's use of it.
  virtual void set_device_spans(device::DeviceSpans* /*spans*/) {}
  virtual double AllReduceSumPp(double value) = 0;
  virtual double SumToRoot(double value) = 0;  // over all ranks; the result is valid on rank 0
  virtual double MaxToRoot(double value) = 0;
  virtual std::vector<std::string> GatherToRoot(const std::string& text) = 0;  // rank 0 gets all
  virtual std::vector<std::vector<int>> AllGatherPp(const std::vector<int>& values) = 0;
  // True on every rank iff every rank passed true (a barrier that also agrees on success).
  virtual bool AllOk(bool ok) = 0;

  // Tensor parallelism (docs/tensor_parallel.md): the tp group is the ranks of one pipeline
  // stage and one replica that split each layer's matrices (Megatron's layout). The defaults are
  // a group of one (every reduction an identity).
  virtual int tp_rank() const { return 0; }
  virtual int tp_size() const { return 1; }
  enum class ReduceOp { kSum, kMax };
  // Blocking, with the deadline: reduces `tensor` (f32 or f64) in place over the tp group, and
  // every rank of the group gets the same bits. The one call the tensor-parallel layers make
  // (the f/g operators, the vocab-parallel cross-entropy); an NCCL transport implements it as
  // one ncclAllReduce on the compute stream. `what` names it in a deadline message.
  virtual void AllReduceTp(memory::Tensor* tensor, ReduceOp op, const std::string& what);
  virtual double AllReduceSumTp(double value) { return value; }
  // Every tp rank's `tensor` (equal dtypes and shapes on every rank), in tp rank order.
  virtual std::vector<memory::Tensor> AllGatherTp(const memory::Tensor& tensor);
  // Payload bytes this rank has put into tp all-reduces so far (the planning model's volume),
  // and the seconds it spent in them (waiting for the group included).
  int64_t tp_bytes_reduced() const { return tp_bytes_reduced_; }
  double tp_seconds() const { return tp_seconds_; }

 protected:
  // Implementations call this for every Send.
  void CountSent(int tag, int64_t bytes) {
    if (tag < kTiedGradientTag) activation_bytes_sent_ += bytes;
  }
  // Implementations call this for every AllReduceTp.
  void CountTpReduced(int64_t bytes, double seconds) {
    tp_bytes_reduced_ += bytes;
    tp_seconds_ += seconds;
  }

 private:
  int64_t activation_bytes_sent_ = 0;
  int64_t tp_bytes_reduced_ = 0;
  double tp_seconds_ = 0;
  int default_reductions_ = 0;  // started through the default StartAllReduceSumDp
};

// One process, one rank: sends to oneself are queued, reductions are identities. Tests derive
// from it to stand in for a larger group (overriding the sizes and the reductions).
class LocalPipelineComm : public PipelineComm {
 public:
  int pp_rank() const override { return 0; }
  int pp_size() const override { return 1; }
  int dp_rank() const override { return 0; }
  int dp_size() const override { return 1; }
  int world_rank() const override { return 0; }
  void Send(memory::Tensor tensor, int peer, int tag, const std::string& what) override;
  memory::Tensor Receive(int peer, int tag, const std::vector<int64_t>& shape, memory::DType dtype,
                         device::Device* device, const std::string& what) override;
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

std::unique_ptr<PipelineComm> MakeLocalPipelineComm();

}  // namespace bigmac::comm

#endif  // BIGMAC_CORE_COMM_PIPELINE_COMM_H_
