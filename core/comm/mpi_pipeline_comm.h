#ifndef BIGMAC_CORE_COMM_MPI_PIPELINE_COMM_H_
#define BIGMAC_CORE_COMM_MPI_PIPELINE_COMM_H_

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/mpi_world.h"
#include "core/comm/pipeline_comm.h"
#include "core/comm/staging_pool.h"

namespace bigmac::comm {

// The transport over MPI and host memory (docs/transport.md), in three parts that share one
// MpiEngine: the pipeline's MpiLinks, and an MpiGroup per group. Sends are MPI_Isend of a small
// header (dtype, shape) and the data; receives probe with a deadline, then check the header.
// Device tensors are staged through host buffers from their device (Device::AllocateHostStaging:
// pinned on CUDA), reused from message to message; `stage_host_tensors` stages host tensors the
// same way (the CPU tests of the staged path). MPI progresses only inside its calls, so every
// wait and every Progress moves all sends and collectives in flight along. The communicators and
// the devices must outlive the transport. Call from the thread that initialised MPI.
//
// It also serves the NCCL transport (core/comm/nccl), which moves only the payloads itself: the
// headers with their checks and tag matching, the waits with the deadline, and the host helpers
// stay here. `max_message_bytes` (0: 1 GiB) is the largest MPI message a payload is cut into; the
// fault plan's smaller one lets tests exercise the split without 2 GiB tensors.
std::unique_ptr<PipelineComm> MakeMpiPipelineComm(const Topology& topology, int world_rank,
                                                  const GroupComms& comms, double deadline_seconds,
                                                  double spin_seconds = 200e-6,
                                                  bool stage_host_tensors = false,
                                                  int64_t max_message_bytes = 0);

constexpr int kMessageHeaderWords = 8;  // magic, dtype, ndim, 4 dims, numel

// What the parts of one MPI transport share: the waits with their deadline, the sends in flight
// (every wait frees those delivered) and the staging buffers. A wait polls (yielding the core)
// for `spin_seconds` before it starts to sleep: long when every rank has a core of its own (a
// message is seen within microseconds), short when ranks share cores. `deadline_seconds` bounds
// every wait. Shared by the parts (std::shared_ptr); outlives them.
class MpiEngine {
 public:
  // For rank `world_rank` of `topology` (deadline messages begin "pp 1, dp 0").
  MpiEngine(const Topology& topology, int world_rank, double deadline_seconds, double spin_seconds,
            bool stage_host_tensors);
  MpiEngine(const MpiEngine&) = delete;
  MpiEngine& operator=(const MpiEngine&) = delete;
  ~MpiEngine();

  // One send in flight: its header, the tensor it owns (or its host staging copy) and the
  // requests of the header and the data messages.
  struct Send {
    std::array<int64_t, kMessageHeaderWords> header{};
    memory::Tensor tensor;
    StagingPool::Buffer staging;
    std::vector<MPI_Request> requests;
    int world_peer = -1;
    std::string name;  // for the trace: a span from `posted` to the observed delivery (if named)
    std::chrono::steady_clock::time_point posted;
  };
  // A new send, in flight until its requests complete.
  Send& AddSend();
  size_t sends_in_flight() const { return sends_.size(); }
  // The world ranks of the peers whose sends are still in flight.
  std::vector<int> PendingPeers() const;
  // Frees the buffers of delivered sends; a named one goes to the delivery sink.
  void Reap();
  // Where the spans of named sends go when they are seen delivered (null: nowhere). One sink per
  // engine (the links'); its owner clears it before it goes.
  void set_delivery_sink(std::function<void(MessageSpan)> sink) {
    delivery_sink_ = std::move(sink);
  }

  // Polls `ready` until it returns true or the deadline passes (DeadlineError naming `what`),
  // reaping sends in between. For the first spin seconds it yields between polls (a message due
  // now is seen within microseconds, and a rank sharing the core still gets it); then it sleeps,
  // backing off to 200 us, so a long wait leaves the CPU to the ranks it waits for. (A fixed
  // back-off to 1 ms cost up to 1 ms per receive: bench/NOTES.md.)
  void Wait(const std::string& what, const std::function<bool()>& ready);
  // Waits for a non-blocking MPI operation, with the deadline.
  void Complete(MPI_Request* request, const std::string& what);

  // Device memory always goes through host buffers; host memory when the tests ask for it.
  bool Staged(const device::Device* device) const;
  StagingPool& staging() { return staging_; }

 private:
  std::string who_;
  double deadline_;
  double spin_;
  bool stage_host_;
  StagingPool staging_;  // before sends_, whose buffers return to it
  std::list<Send> sends_;
  std::function<void(MessageSpan)> delivery_sink_;
};

// A message's header as the MPI links send it ahead of the data: the tag it came with, the dtype
// and the shape.
struct MessageHeader {
  int tag = 0;
  memory::DType dtype = memory::DType::kF32;
  std::vector<int64_t> shape;
  int64_t numel = 0;
};

// The pipeline's links over the pp communicator. A payload goes out after its header as messages
// of at most `max_message_bytes` (MPI counts are ints; 0: 1 GiB), same tag, matched in order.
//
// An expected receive (Expect) starts early: Progress, which the compute loops call, takes its
// header once it has arrived, checks it and posts the data's receives, so a rendezvous transfer
// moves while this rank computes instead of waiting for its Receive. A header that does not match
// is kept for the Receive, which reports it as it would have.
class MpiLinks : public PeerLinks {
 public:
  MpiLinks(std::shared_ptr<MpiEngine> engine, MPI_Comm pp, const Topology& topology, int world_rank,
           int64_t max_message_bytes = 0);
  ~MpiLinks() override;
  void Send(memory::Tensor tensor, int peer, int tag, const std::string& what) override;
  memory::Tensor Receive(int peer, int tag, const std::vector<int64_t>& shape, memory::DType dtype,
                         device::Device* device, const std::string& what) override;
  void Expect(const Incoming& receive) override;
  void FinishSends() override;
  void Progress() override;
  size_t expected_receives() const override { return expected_.size(); }
  size_t ForgetExpected() override;

  // Posts the header of `tensor` alone (non-blocking; no data follows over MPI).
  void SendHeader(const memory::Tensor& tensor, int peer, int tag);
  // The next header pp rank `peer` sent, whatever its tag (MPI keeps one sender's messages to one
  // receiver in order: the order an NCCL receiver must follow). Waits up to the deadline: throws
  // DeadlineError naming `what`, or TransportError for a message that is not a header.
  MessageHeader ReceiveNextHeader(int peer, const std::string& what);
  // The staging buffers taken from the devices so far (they are reused), and their bytes.
  int64_t staging_buffers() const { return engine_->staging().buffers(); }
  int64_t staging_bytes() const { return engine_->staging().bytes(); }
  int PeerWorldRank(int pp_peer) const;

 private:
  // One receive on its way: its header once taken, then its data's requests. States, in order:
  // announced (header_bytes < 0), header taken (a header, or a message that is none), data posted,
  // arrived.
  struct Pending {
    Incoming in;
    std::array<int64_t, kMessageHeaderWords> header{};
    int header_bytes = -1;   // the bytes of the message taken as the header; -1: none taken yet
    std::vector<char> junk;  // a message taken in place of the header, when it is none
    memory::Tensor tensor;   // the destination (unless staged: then the staging buffer)
    StagingPool::Buffer staging;
    bool data_posted = false;
    std::vector<MPI_Request> requests;  // the data's
    bool arrived = false;
    std::chrono::steady_clock::time_point posted;
    std::chrono::steady_clock::time_point arrival;
    bool arrived_in_compute = false;
  };
  MpiEngine::Send& PostHeader(const memory::Tensor& tensor, int peer, int tag);
  // Takes the next message of `p->in`'s (peer, tag) if one has arrived, without waiting (a matched
  // probe); returns whether one was taken.
  bool TryTakeHeader(Pending* p);
  // Takes it, waiting up to the deadline, unless taken already; a message that is no header is a
  // TransportError.
  void WaitForHeader(Pending* p, const std::string& from);
  // Whether the taken header is what `p.in` expects.
  bool HeaderMatches(const Pending& p) const;
  [[noreturn]] void ThrowMismatch(const Pending& p, const std::string& from) const;
  // Allocates the destination and posts the data's receives.
  void PostData(Pending* p);
  // Tests the data's receives without blocking; notes the arrival.
  bool TestArrived(Pending* p);
  // Waits (with the deadline) until a message from pp rank `peer` with `tag` (or MPI_ANY_TAG)
  // can be received.
  MPI_Status Probe(int peer, int tag, const std::string& from);

  std::shared_ptr<MpiEngine> engine_;
  MPI_Comm pp_;
  Topology topology_;
  Coords coords_;
  int64_t max_message_bytes_;
  std::list<Pending> expected_;   // announced, in order, then any unannounced one being received
  std::list<Pending> abandoned_;  // forgotten with their data posted: theirs until they arrive
};

// A group over an MPI communicator. With `ordered_sums` (the dp group), a sum is a reduce-scatter
// followed by an all-gather, and a reduce-scatter is an all-to-all of the shards followed by a
// local sum in rank order, ((g0 + g1) + g2) + g3: the sums do not depend on MPI's choice of
// algorithm (which changes with the message size), and the all-reduce and ZeRO-1's reduce-scatter
// give bitwise the same sums. Without, an all-reduce is MPI_Iallreduce (the tp group's). Tensor
// collectives run on host memory (device tensors and bf16 are staged, bf16 widened to f32);
// they progress whenever the engine waits or Progress is called. `comm` outlives the group.
class MpiGroup : public Group {
 public:
  MpiGroup(std::shared_ptr<MpiEngine> engine, MPI_Comm comm, std::string name, bool ordered_sums);
  ~MpiGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  int StartAllReduce(memory::Tensor* tensor, ReduceOp op, const std::string& what) override;
  int StartReduceScatter(memory::Tensor* tensor, const std::string& what) override;
  int StartAllGather(memory::Tensor* tensor, const std::string& what) override;
  bool Test(int handle) override;
  void WaitAll() override;
  void Progress() override;
  std::vector<memory::Tensor> AllGather(const memory::Tensor& tensor,
                                        const std::string& what) override;
  bool AllOk(bool ok) override;
  std::vector<std::string> GatherToRoot(const std::string& text) override;
  std::vector<std::vector<int>> AllGatherInts(const std::vector<int>& values,
                                              const std::string& what) override;

 protected:
  double ReduceValue(double value, ReduceOp op, bool to_root, const std::string& what) override;
  MpiEngine& engine() const { return *engine_; }
  MPI_Comm comm() const { return comm_; }

 private:
  struct Collective;
  int Start(int kind, memory::Tensor* tensor, ReduceOp op, const std::string& what);
  void StartGather(Collective* c, MPI_Comm comm);
  void StartSecondHalves();
  template <typename T>
  void CombineShard(Collective* c);
  bool Advance(Collective* c);

  std::shared_ptr<MpiEngine> engine_;
  MPI_Comm comm_;
  std::string name_;
  bool ordered_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<std::unique_ptr<Collective>> started_;  // since the last WaitAll
  size_t next_gather_ = 0;  // the first all-reduce whose second half may not be started
  // The ordered all-reduces' second halves start when their first halves complete, which may be in
  // a different order than other collectives on `comm`: they get a communicator of their own.
  MPI_Comm gather_comm_ = MPI_COMM_NULL;
};

}  // namespace bigmac::comm

#endif  // BIGMAC_CORE_COMM_MPI_PIPELINE_COMM_H_
