#ifndef BIGMAC_CORE_COMM_GROUP_H_
#define BIGMAC_CORE_COMM_GROUP_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/device/device_spans.h"
#include "core/memory/tensor.h"

namespace bigmac::comm {

enum class ReduceOp { kSum, kMax };

// The shard of a reduce-scatter or all-gather that rank `rank` of `size` holds: elements
// [begin, end) of a tensor of `numel` elements, numel a multiple of size.
struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;
};
ShardRange DpShardOf(int64_t numel, int size, int rank);

// One set of ranks and its collectives (the model: torch's ProcessGroup, Megatron's
// process_groups_config): the world, the pipeline (pp), the data-parallel replicas (dp) and the
// tensor-parallel ranks of one stage (tp) are each a Group, handed out by the transport
// (PipelineComm). Implementations: MpiGroup (core/comm/mpi_pipeline_comm.h), the NCCL group
// (core/comm/nccl) and LocalGroup (one rank). Every call is collective: every rank of the group
// makes the same calls, with the same counts and dtypes, in the same order. Call from the thread
// that initialised MPI. The transport owns its groups.
class Group {
 public:
  Group() = default;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  virtual ~Group() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "world", "pp", "dp", "tp": how hang reports and deadline messages name the group.
  virtual const std::string& name() const = 0;

  // Non-blocking collectives on tensors, in place. Each returns a handle (0, 1, ... in start order
  // since the last WaitAll); the tensor must stay alive and must not be read or written until
  // Test says the collective is done or WaitAll returns. A result does not depend on when it is
  // waited for, so an overlapped and a serial step give bitwise the same sums. `what` names the
  // collective in a deadline message.
  //   StartAllReduce: f32, f64 or bf16 (bf16 is reduced in f32).
  //   StartReduceScatter: the sum into this rank's shard (DpShardOf; numel a multiple of
  //     size()); the other elements are left unspecified.
  //   StartAllGather: this rank's shard to every rank, so that every rank holds the whole tensor.
  // (The in-place shapes are NCCL's: ncclReduceScatter and ncclAllGather with the shard at
  // rank * numel / size.) The defaults of the last two go through StartAllReduce: correct, with
  // twice the traffic.
  virtual int StartAllReduce(memory::Tensor* tensor, ReduceOp op, const std::string& what) = 0;
  virtual int StartReduceScatter(memory::Tensor* tensor, const std::string& what);
  virtual int StartAllGather(memory::Tensor* tensor, const std::string& what);
  // Lets the transport progress (never blocks) and says whether collective `handle` is complete.
  virtual bool Test(int handle) = 0;
  // Waits, with the deadline, until every started collective is complete, then forgets them
  // (DeadlineError names the first one still pending).
  virtual void WaitAll() = 0;
  // Moves collectives in flight along without blocking (MPI progresses only inside its calls).
  virtual void Progress() {}
  // Where a group with streams of its own (NCCL) times its operations for the trace's device
  // track (null: nowhere). `spans` outlives the group's use of it.
  virtual void set_device_spans(device::DeviceSpans* /*spans*/) {}

  // Blocking: StartAllReduce and WaitAll, with nothing else in flight (a logic_error otherwise).
  // Counted in blocking_bytes() and blocking_seconds() (the tp layers' volume and time, waiting
  // for the group included).
  void AllReduce(memory::Tensor* tensor, ReduceOp op, const std::string& what);
  int64_t blocking_bytes() const { return blocking_bytes_; }
  double blocking_seconds() const { return blocking_seconds_; }
  // Every rank's `tensor` (equal dtypes and shapes on every rank), in rank order (blocking).
  virtual std::vector<memory::Tensor> AllGather(const memory::Tensor& tensor,
                                                const std::string& what) = 0;

  // Host helpers. `what` names the wait in deadline messages and the hang report. The ToRoot
  // results are valid on rank 0 only.
  double Sum(double value, const std::string& what) {
    return ReduceValue(value, ReduceOp::kSum, false, what);
  }
  double Max(double value, const std::string& what) {
    return ReduceValue(value, ReduceOp::kMax, false, what);
  }
  double SumToRoot(double value, const std::string& what) {
    return ReduceValue(value, ReduceOp::kSum, true, what);
  }
  double MaxToRoot(double value, const std::string& what) {
    return ReduceValue(value, ReduceOp::kMax, true, what);
  }
  // True on every rank iff every rank passed true (a barrier that also agrees on success).
  virtual bool AllOk(bool ok) = 0;
  // Every rank's `text` on rank 0 (the others get an empty vector).
  virtual std::vector<std::string> GatherToRoot(const std::string& text) = 0;
  // Every rank's `values` on every rank, in rank order.
  virtual std::vector<std::vector<int>> AllGatherInts(const std::vector<int>& values,
                                                      const std::string& what) = 0;

 protected:
  // `value` reduced over the group, on every rank or (`to_root`) on rank 0 only.
  virtual double ReduceValue(double value, ReduceOp op, bool to_root, const std::string& what) = 0;

 private:
  int64_t blocking_bytes_ = 0;
  double blocking_seconds_ = 0;
};

// A group of one rank (rank 0): every collective is an identity. Tests derive from it to stand in
// for a larger group (overriding size() and the tensor collectives).
class LocalGroup : public Group {
 public:
  explicit LocalGroup(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  int StartAllReduce(memory::Tensor* tensor, ReduceOp op, const std::string& what) override;
  bool Test(int handle) override;
  void WaitAll() override { started_ = 0; }
  std::vector<memory::Tensor> AllGather(const memory::Tensor& tensor,
                                        const std::string& what) override;
  bool AllOk(bool ok) override { return ok; }
  std::vector<std::string> GatherToRoot(const std::string& text) override { return {text}; }
  std::vector<std::vector<int>> AllGatherInts(const std::vector<int>& values,
                                              const std::string&) override {
    return {values};
  }

 protected:
  double ReduceValue(double value, ReduceOp, bool, const std::string&) override { return value; }

 private:
  std::string name_;
  int started_ = 0;
};

}  // namespace bigmac::comm

#endif  // BIGMAC_CORE_COMM_GROUP_H_
