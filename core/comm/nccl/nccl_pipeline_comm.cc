#include "core/comm/nccl/nccl_pipeline_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <list>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/mpi_pipeline_comm.h"
#include "core/comm/nccl/nccl_check.h"
#include "core/comm/progress.h"
#include "core/device/cuda/check.h"
#include "core/device/cuda/cuda_device.h"
#include "core/metrics/timeline.h"

namespace bigmac::comm {
namespace {

using memory::Tensor;

class NcclComm : public PipelineComm {
 public:
  NcclComm(const Topology& topology, int world_rank, const GroupComms& comms,
           device::Device* device, double deadline, double spin)
      : control_(MakeMpiPipelineComm(topology, world_rank, comms, deadline, spin)),
        topology_(topology),
        device_(device),
        context_(device::cuda::ContextOf(device)),
        deadline_(deadline) {
    const std::string where = "NCCL transport set-up, on " + context_.label;
    BIGMAC_CUDA_CHECK(cudaSetDevice(context_.ordinal), where);
    try {
      // The same order on every rank: the pipeline's links, then the data-parallel group.
      CreateLinks(comms.pp);
      dp_ = CreateGroupComm(comms.dp, "dp");
      if (dp_) dp_stream_ = NewStream(where);
    } catch (...) {
      Abort();
      for (cudaStream_t stream : streams_) cudaStreamDestroy(stream);
      throw;
    }
  }

  ~NcclComm() override {
    // Best effort, never throwing. A clean run has nothing in flight: the communicators are
    // finalized and destroyed. Otherwise (an error ended the run, a peer may be gone) they are
    // aborted, which also stops their kernels, before the sent tensors are freed.
    bool clean = !aborted_;
    for (const InFlight& f : in_flight_) {
      if (cudaEventQuery(f.done) != cudaSuccess) clean = false;
    }
    for (const Reduction& r : reductions_) {
      if (r.done_event && cudaEventQuery(r.done_event) != cudaSuccess) clean = false;
    }
    for (ncclComm_t comm : comms_) {
      if (clean && Finalize(comm)) {
        ncclCommDestroy(comm);
      } else {
        ncclCommAbort(comm);
      }
    }
    comms_.clear();
    for (const InFlight& f : in_flight_) cudaEventDestroy(f.done);
    in_flight_.clear();
    for (const Reduction& r : reductions_) {
      if (r.done_event) cudaEventDestroy(r.done_event);
    }
    for (cudaStream_t stream : streams_) cudaStreamDestroy(stream);
    cudaGetLastError();
  }

  int pp_rank() const override { return control_->pp_rank(); }
  int pp_size() const override { return control_->pp_size(); }
  int dp_rank() const override { return control_->dp_rank(); }
  int dp_size() const override { return control_->dp_size(); }
  int world_rank() const override { return control_->world_rank(); }

  void Send(Tensor tensor, int peer, int tag, const std::string& what) override {
    std::vector<Outgoing> sends;
    sends.push_back({std::move(tensor), peer, tag, what});
    Exchange(std::move(sends), {});
  }

  Tensor Receive(int peer, int tag, const std::vector<int64_t>& shape, memory::DType dtype,
                 device::Device* device, const std::string& what) override {
    std::vector<Tensor> received = Exchange({}, {{peer, tag, shape, dtype, device, what}});
    return std::move(received.front());
  }

  // Headers out over MPI; every payload enqueued on its link's stream before anything is waited
  // for (receives into tensors of the expected dtype and shape); then the headers in, in order.
  std::vector<Tensor> Exchange(std::vector<Outgoing> sends,
                               const std::vector<Incoming>& receives) override {
    Reap();
    const int me = pp_rank();
    std::string what;
    for (Outgoing& send : sends) {
      CheckDevice(send.tensor.device(), send.what);
      CountSent(send.tag, send.tensor.bytes());
      control_->SendHeader(send.tensor, send.peer, send.tag);
      Name(&what, send.what + " to pp rank " + std::to_string(send.peer));
    }
    std::vector<Tensor> received;
    for (const Incoming& in : receives) {
      CheckDevice(in.device, in.what);
      received.emplace_back(device_, in.shape, in.dtype);
      Name(&what, in.what + " from pp rank " + std::to_string(in.peer));
    }
    if (sends.empty() && receives.empty()) return received;
    const std::string where = what + ", on " + context_.label;
    // The sent tensors were written, and the received ones allocated, on the compute stream.
    cudaEvent_t ready = RecordOn(context_.stream, where);
    for (Outgoing& send : sends) {
      const std::string at =
          send.what + " to pp rank " + std::to_string(send.peer) + ", on " + context_.label;
      const Link& link = LinkFor(me, send.peer, send.what);
      BIGMAC_CUDA_CHECK(cudaStreamWaitEvent(link.stream, ready, 0), at);
      const device::Event span_start = MarkOn(link.stream);
      Enqueue(ncclSend(send.tensor.raw(), static_cast<size_t>(send.tensor.numel()),
                       nccl::TypeOf(send.tensor.dtype()), link.peer, link.comm, link.stream),
              "ncclSend", link.comm, at);
      AddSpan(send.what, span_start, link.stream);
      // The compute stream goes on; the tensor waits here for its event.
      in_flight_.push_back(
          {RecordOn(link.stream, at), std::move(send.tensor), send.what, PeerWorldRank(send.peer)});
    }
    std::vector<cudaEvent_t> arrived;
    for (size_t i = 0; i < receives.size(); ++i) {
      const Incoming& in = receives[i];
      const std::string at =
          in.what + " from pp rank " + std::to_string(in.peer) + ", on " + context_.label;
      const Link& link = LinkFor(in.peer, me, in.what);
      BIGMAC_CUDA_CHECK(cudaStreamWaitEvent(link.stream, ready, 0), at);
      const device::Event span_start = MarkOn(link.stream);
      Enqueue(ncclRecv(received[i].raw(), static_cast<size_t>(received[i].numel()),
                       nccl::TypeOf(in.dtype), link.peer, link.comm, link.stream),
              "ncclRecv", link.comm, at);
      AddSpan(in.what, span_start, link.stream);
      arrived.push_back(RecordOn(link.stream, at));
    }
    cudaEventDestroy(ready);  // released once it has fired
    for (const Incoming& in : receives) CheckArrival(in);
    // The compute stream uses what arrived only after it has arrived; the host waits for it
    // under the deadline (no wait on a peer without one).
    for (size_t i = 0; i < arrived.size(); ++i) {
      const Incoming& in = receives[i];
      const progress::WaitScope waiting({progress::WaitKind::kReceive,
                                         in.what,
                                         "pp",
                                         DescribeTensor(in.dtype, in.shape),
                                         in.tag,
                                         {PeerWorldRank(in.peer)}});
      BIGMAC_CUDA_CHECK(cudaStreamWaitEvent(context_.stream, arrived[i], 0), where);
      WaitDone(arrived[i], receives[i].what + " from pp rank " + std::to_string(receives[i].peer),
               where);
      cudaEventDestroy(arrived[i]);
    }
    return received;
  }

  void FinishSends() override {
    while (!in_flight_.empty()) {
      InFlight& f = in_flight_.front();
      const progress::WaitScope waiting(
          {progress::WaitKind::kSends, "delivery of " + f.what, "pp", "", -1, {f.world_peer}});
      WaitDone(f.done, "delivery of " + f.what, f.what + ", on " + context_.label);
      cudaEventDestroy(f.done);
      in_flight_.pop_front();
    }
    control_->FinishSends();
  }

  void AllReduceSumDp(Tensor* tensor) override {
    if (!reductions_.empty())
      throw std::logic_error("AllReduceSumDp while non-blocking reductions are in flight");
    StartAllReduceSumDp(tensor, "ReduceDp: all-reduce of gradients over the data-parallel group");
    WaitAllReduces();
  }

  // ncclAllReduce on the dp stream after the compute stream's work so far (the gradients were
  // written there); the compute stream goes on and waits for the sum only when it is taken
  // (TestAllReduce true, or WaitAllReduces), so later layers' backward overlaps with it.
  int StartAllReduceSumDp(Tensor* tensor, const std::string& what) override {
    const int handle = static_cast<int>(reductions_.size());
    reductions_.emplace_back();
    Reduction& r = reductions_.back();
    r.tensor = tensor;
    r.what = what;
    if (dp_size() == 1 || tensor->numel() == 0) {
      r.done = true;
      return handle;
    }
    const std::string where = what + ", on " + context_.label;
    CheckDevice(tensor->device(), what);
    if (dp_ == nullptr) throw TransportError(what + ": no NCCL communicator for the group");
    Reap();
    // bf16 is summed in f32, as over MPI.
    Tensor* target = tensor;
    if (tensor->dtype() == memory::DType::kBF16) {
      r.wide = Tensor(tensor->device(), tensor->shape(), memory::DType::kF32);
      r.wide.ConvertFrom(*tensor);
      target = &r.wide;
    } else if (tensor->dtype() != memory::DType::kF32 && tensor->dtype() != memory::DType::kF64) {
      throw TransportError(what + ": sums f32, f64 or bf16, got " +
                           DescribeTensor(tensor->dtype(), tensor->shape()));
    }
    cudaEvent_t ready = RecordOn(context_.stream, where);
    BIGMAC_CUDA_CHECK(cudaStreamWaitEvent(dp_stream_, ready, 0), where);
    cudaEventDestroy(ready);
    const device::Event span_start = MarkOn(dp_stream_);
    Enqueue(ncclAllReduce(target->raw(), target->raw(), static_cast<size_t>(target->numel()),
                          nccl::TypeOf(target->dtype()), ncclSum, dp_, dp_stream_),
            "ncclAllReduce", dp_, where);
    AddSpan(what, span_start, dp_stream_);
    r.done_event = RecordOn(dp_stream_, where);
    return handle;
  }

  bool TestAllReduce(int handle) override {
    if (handle < 0 || handle >= static_cast<int>(reductions_.size()))
      throw std::logic_error("TestAllReduce: no reduction " + std::to_string(handle) +
                             " is in flight");
    Reap();
    Reduction& r = reductions_[handle];
    if (r.done) return true;
    const cudaError_t status = cudaEventQuery(r.done_event);
    if (status == cudaErrorNotReady) return false;
    device::cuda::Check(status, "cudaEventQuery", r.what + ", on " + context_.label);
    Take(&r);
    return true;
  }

  void Progress() override {
    Reap();
    for (int i = 0; i < static_cast<int>(reductions_.size()); ++i) TestAllReduce(i);
  }

  void WaitAllReduces() override {
    for (size_t i = 0; i < reductions_.size(); ++i) {
      Reduction& r = reductions_[i];
      if (r.done) continue;
      const progress::WaitScope waiting({progress::WaitKind::kCollective, r.what, "dp"});
      WaitDone(r.done_event,
               r.what + " (reduction " + std::to_string(i + 1) + " of " +
                   std::to_string(reductions_.size()) + " started this step)",
               r.what + ", on " + context_.label);
      Take(&r);
    }
    reductions_.clear();
  }

  double AllReduceSumPp(double value) override { return control_->AllReduceSumPp(value); }
  double SumToRoot(double value) override { return control_->SumToRoot(value); }
  double MaxToRoot(double value) override { return control_->MaxToRoot(value); }
  std::vector<std::string> GatherToRoot(const std::string& text) override {
    return control_->GatherToRoot(text);
  }
  std::vector<std::vector<int>> AllGatherPp(const std::vector<int>& values) override {
    return control_->AllGatherPp(values);
  }
  bool AllOk(bool ok) override { return control_->AllOk(ok); }
  void set_device_spans(device::DeviceSpans* spans) override { spans_ = spans; }

 private:
  // One direction of a pipeline link: a communicator of two ranks (the sender is its rank 0) and
  // a stream on this rank. A direction's operations are the only ones on its communicator, so
  // they never wait behind another link's: NCCL's rendezvous sends then behave like MPI's
  // buffered ones, which the schedules are proven against.
  struct Link {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    int peer = 0;  // the other rank's rank in `comm`
  };
  // A send still running: its completion event and the tensor it reads.
  struct InFlight {
    cudaEvent_t done = nullptr;
    Tensor tensor;
    std::string what;
    int world_peer = -1;
  };

  // One non-blocking dp sum: its tensor, the f32 copy a bf16 tensor is summed in, and the event
  // that fires on the dp stream when the sum is done.
  struct Reduction {
    Tensor* tensor = nullptr;
    std::string what;
    Tensor wide;
    cudaEvent_t done_event = nullptr;
    bool done = false;
  };

  // A finished sum, handed to the compute stream: it waits for the dp stream's event before it
  // touches the tensor (a bf16 one is narrowed there from its f32 sum).
  void Take(Reduction* r) {
    const std::string where = r->what + ", on " + context_.label;
    BIGMAC_CUDA_CHECK(cudaStreamWaitEvent(context_.stream, r->done_event, 0), where);
    cudaEventDestroy(r->done_event);
    r->done_event = nullptr;
    if (r->wide.numel() > 0) {
      r->tensor->ConvertFrom(r->wide);
      r->wide = Tensor();
    }
    r->done = true;
  }

  // The trace's device track of the transport's streams: a timed event before an operation is
  // enqueued, and the span to the event after it (nothing while the trace is not recording).
  device::Event MarkOn(cudaStream_t stream) {
    if (spans_ == nullptr || !spans_->enabled()) return {};
    return spans_->Mark(device::Stream{stream});
  }
  void AddSpan(const std::string& what, device::Event start, cudaStream_t stream) {
    if (start.handle == nullptr) return;
    spans_->Add(what, "device_comm", metrics::Timeline::kDeviceCommTrack, start,
                spans_->Mark(device::Stream{stream}));
  }

  static void Name(std::string* what, const std::string& part) {
    *what += (what->empty() ? "" : " + ") + part;
  }

  void CheckDevice(const device::Device* device, const std::string& what) const {
    if (device != device_) {
      throw TransportError(what + ": the NCCL transport moves the memory of " + device_->name() +
                           " only, got a tensor on " + (device ? device->name() : "no device"));
    }
  }

  int PeerWorldRank(int pp_peer) const {
    Coords peer = topology_.CoordsOf(world_rank());
    peer.pp = pp_peer;
    return topology_.RankOf(peer);
  }

  const Link& LinkFor(int from, int to, const std::string& what) const {
    const auto it = links_.find({from, to});
    if (it == links_.end()) {
      throw TransportError(what + ": no NCCL link from pp rank " + std::to_string(from) +
                           " to pp rank " + std::to_string(to) +
                           " (the transport links pipeline neighbours, and the first and the "
                           "last stage)");
    }
    return it->second;
  }

  // The header of the message `in` received, next from its peer: NCCL matched the payload by
  // order, so it must be the one `in` names, with the dtype and shape it expects. On a mismatch
  // the link may hang on the payload's size: the communicators are aborted first.
  void CheckArrival(const Incoming& in) {
    const std::string from = in.what + " from pp rank " + std::to_string(in.peer);
    MessageHeader header;
    try {
      header = control_->ReceiveNextHeader(in.peer, in.what);
    } catch (const DeadlineError& error) {
      Abort();
      throw DeadlineError(std::string(error.what()) + "; the NCCL communicators of " +
                          context_.label + " were aborted");
    } catch (const TransportError&) {
      Abort();
      throw;
    }
    if (header.tag != in.tag) {
      Abort();
      throw TransportError(
          from + ": the peer's next message has tag " + std::to_string(header.tag) + " (" +
          DescribeTensor(header.dtype, header.shape) + "), not " + std::to_string(in.tag) +
          ": NCCL matches a pair's messages in sending order, so the receiver "
          "must take them in that order (the two ranks' schedules disagree)");
    }
    if (header.dtype != in.dtype || header.shape != in.shape) {
      Abort();
      throw TransportError(from + ": expected " + DescribeTensor(in.dtype, in.shape) + ", got " +
                           DescribeTensor(header.dtype, header.shape));
    }
  }

  cudaStream_t NewStream(const std::string& where) {
    cudaStream_t stream = nullptr;
    BIGMAC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), where);
    streams_.push_back(stream);
    return stream;
  }

  static cudaEvent_t RecordOn(cudaStream_t stream, const std::string& where) {
    cudaEvent_t event = nullptr;
    BIGMAC_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), where);
    BIGMAC_CUDA_CHECK(cudaEventRecord(event, stream), where);
    return event;
  }

  // An NCCL call on a non-blocking communicator: checked, and waited for (under the deadline)
  // until it is enqueued.
  void Enqueue(ncclResult_t status, const char* call, ncclComm_t comm, const std::string& where) {
    nccl::Check(status, call, where, comm, /*in_progress_ok=*/true);
    if (status == ncclInProgress) WaitReady(comm, call, std::string("enqueueing ") + call, where);
  }

  // Frees the tensors of sends that have run.
  void Reap() {
    for (auto it = in_flight_.begin(); it != in_flight_.end();) {
      const cudaError_t status = cudaEventQuery(it->done);
      if (status == cudaErrorNotReady) {
        ++it;
        continue;
      }
      device::cuda::Check(status, "cudaEventQuery", it->what + ", on " + context_.label);
      cudaEventDestroy(it->done);
      it = in_flight_.erase(it);
    }
  }

  // The pipeline's links of this rank: to and from each neighbour, and between the first and the
  // last stage (the wrap of interleaved schedules, the tied weight). Every rank of the pp group
  // takes part (the bootstrap communicator is duplicated collectively).
  void CreateLinks(MPI_Comm pp) {
    const int me = pp_rank();
    const int size = pp_size();
    if (pp == MPI_COMM_NULL || size < 2) return;
    std::vector<int> peers;
    for (int peer : {me - 1, me + 1, me == 0 ? size - 1 : -1, me == size - 1 ? 0 : -1}) {
      if (peer >= 0 && peer < size && peer != me &&
          std::find(peers.begin(), peers.end(), peer) == peers.end()) {
        peers.push_back(peer);
      }
    }
    std::sort(peers.begin(), peers.end());
    const std::string what = "the NCCL links of pp rank " + std::to_string(me) +
                             " (to and from pp "
                             "rank(s) " +
                             JoinRanks(peers) + ")";
    const std::string where = "creating " + what + ", on " + context_.label;
    // Unique ids: this rank makes those of the directions it sends on and gets its peers'.
    MPI_Comm bootstrap = MPI_COMM_NULL;
    MPI_Request request;
    MPI_Comm_idup(pp, &bootstrap, &request);
    WaitMpi(&request, 1, "the NCCL bootstrap communicator of the pp group (MPI_Comm_idup)");
    std::vector<ncclUniqueId> out(peers.size()), in(peers.size());
    std::vector<MPI_Request> requests(2 * peers.size());
    for (size_t i = 0; i < peers.size(); ++i) {
      BIGMAC_NCCL_CHECK(ncclGetUniqueId(&out[i]), where);
      MPI_Isend(&out[i], static_cast<int>(sizeof(ncclUniqueId)), MPI_BYTE, peers[i], 0, bootstrap,
                &requests[2 * i]);
      MPI_Irecv(&in[i], static_cast<int>(sizeof(ncclUniqueId)), MPI_BYTE, peers[i], 0, bootstrap,
                &requests[2 * i + 1]);
    }
    try {
      WaitMpi(requests.data(), static_cast<int>(requests.size()),
              "the unique ids of " + what + " (MPI)");
    } catch (...) {
      MPI_Comm_free(&bootstrap);
      throw;
    }
    MPI_Comm_free(&bootstrap);
    // Every direction's communicator of two, created together.
    const ncclConfig_t initial = NCCL_CONFIG_INITIALIZER;
    std::vector<ncclConfig_t> configs(2 * peers.size(), initial);
    BIGMAC_NCCL_CHECK(ncclGroupStart(), where);
    std::vector<Link*> created;
    try {
      for (size_t i = 0; i < peers.size(); ++i) {
        for (int direction = 0; direction < 2; ++direction) {
          const bool sending = direction == 0;
          Link& link = links_[sending ? std::pair{me, peers[i]} : std::pair{peers[i], me}];
          link.peer = sending ? 1 : 0;
          ncclConfig_t& config = configs[2 * i + direction];
          config.blocking = 0;  // creation and enqueues return at once; polled under the deadline
          nccl::Check(ncclCommInitRankConfig(&link.comm, 2, sending ? out[i] : in[i],
                                             sending ? 0 : 1, &config),
                      "ncclCommInitRankConfig", where, link.comm, true);
          comms_.push_back(link.comm);
          created.push_back(&link);
        }
      }
    } catch (...) {
      ncclGroupEnd();
      throw;
    }
    nccl::Check(ncclGroupEnd(), "ncclGroupEnd", where, nullptr, true);
    for (Link* link : created) {
      WaitReady(link->comm, "ncclCommInitRankConfig", what, where);
      link->stream = NewStream(where);
    }
  }

  // A communicator over a whole group (the data-parallel one), or null for a group of one.
  ncclComm_t CreateGroupComm(MPI_Comm group, const std::string& name) {
    if (group == MPI_COMM_NULL) return nullptr;
    int size = 0;
    int rank = 0;
    MPI_Comm_size(group, &size);
    MPI_Comm_rank(group, &rank);
    if (size < 2) return nullptr;
    const std::string what = "the NCCL communicator of the " + name + " group (" +
                             std::to_string(size) + " ranks; this is its rank " +
                             std::to_string(rank) + ")";
    const std::string where = "creating " + what + ", on " + context_.label;
    ncclUniqueId id{};
    if (rank == 0) BIGMAC_NCCL_CHECK(ncclGetUniqueId(&id), where);
    MPI_Request request;
    MPI_Ibcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, group, &request);
    WaitMpi(&request, 1, "the unique id of " + what + " from its rank 0 (MPI_Ibcast)");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    nccl::Check(ncclCommInitRankConfig(&comm, size, id, rank, &config), "ncclCommInitRankConfig",
                where, comm, true);
    comms_.push_back(comm);
    WaitReady(comm, "ncclCommInitRankConfig", what, where);
    return comm;
  }

  void WaitMpi(MPI_Request* requests, int count, const std::string& what) {
    control_->Wait(what, [&] {
      int done = 0;
      MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE);
      return done != 0;
    });
  }

  static std::string JoinRanks(const std::vector<int>& ranks) {
    std::string text;
    for (int rank : ranks) text += (text.empty() ? "" : ", ") + std::to_string(rank);
    return text;
  }

  // A non-blocking communicator's last call, until it is carried out.
  void WaitReady(ncclComm_t comm, const char* call, const std::string& what,
                 const std::string& where) {
    Guarded(what, [&] {
      ncclResult_t state = ncclSuccess;
      nccl::Check(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError", where, comm);
      if (state == ncclInProgress) return false;
      nccl::Check(state, call, where, comm);
      return true;
    });
  }

  // A completion event, watching the communicators for asynchronous errors meanwhile.
  void WaitDone(cudaEvent_t done, const std::string& what, const std::string& where) {
    Guarded(what, [&] {
      const cudaError_t status = cudaEventQuery(done);
      if (status == cudaSuccess) return true;
      if (status != cudaErrorNotReady) device::cuda::Check(status, "cudaEventQuery", where);
      for (ncclComm_t comm : comms_) {
        ncclResult_t state = ncclSuccess;
        nccl::Check(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError", where, comm);
        if (state != ncclInProgress) nccl::Check(state, "NCCL (asynchronous error)", where, comm);
      }
      return false;
    });
  }

  // The control transport's wait, with its deadline; past it (or on an NCCL error) the
  // communicators are aborted, since their operations cannot be cancelled otherwise.
  template <typename Ready>
  void Guarded(const std::string& what, Ready ready) {
    try {
      control_->Wait(what, ready);
    } catch (const DeadlineError& error) {
      Abort();
      throw DeadlineError(std::string(error.what()) + "; the NCCL communicators of " +
                          context_.label + " were aborted");
    } catch (const device::DeviceError&) {
      Abort();
      throw;
    }
  }

  void Abort() {
    for (ncclComm_t comm : comms_) ncclCommAbort(comm);
    comms_.clear();
    links_.clear();
    dp_ = nullptr;
    aborted_ = true;
  }

  // ncclCommFinalize, waiting (bounded) for the communicator to be quiescent; false if it is not.
  bool Finalize(ncclComm_t comm) const {
    const ncclResult_t status = ncclCommFinalize(comm);
    if (status != ncclSuccess && status != ncclInProgress) return false;
    const auto start = std::chrono::steady_clock::now();
    const double limit = std::min(deadline_, 30.0);
    while (true) {
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return false;
      if (state == ncclSuccess) return true;
      if (state != ncclInProgress) return false;
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > limit)
        return false;
      usleep(1000);
    }
  }

  std::unique_ptr<MpiPipelineComm> control_;  // headers, deadlines, small collectives
  Topology topology_;
  device::Device* device_;
  const device::cuda::CudaContext& context_;
  double deadline_;
  std::map<std::pair<int, int>, Link> links_;  // (sending, receiving) pp rank
  ncclComm_t dp_ = nullptr;                    // the data-parallel group (null with dp = 1)
  cudaStream_t dp_stream_ = nullptr;
  std::vector<ncclComm_t> comms_;      // every communicator created
  std::vector<cudaStream_t> streams_;  // every stream created
  bool aborted_ = false;
  std::list<InFlight> in_flight_;
  std::vector<Reduction> reductions_;     // started since the last WaitAllReduces
  device::DeviceSpans* spans_ = nullptr;  // the trainer's, while it runs
};

}  // namespace

std::unique_ptr<PipelineComm> MakeNcclPipelineComm(const Topology& topology, int world_rank,
                                                   const GroupComms& comms, device::Device* device,
                                                   double deadline_seconds, double spin_seconds) {
  return std::make_unique<NcclComm>(topology, world_rank, comms, device, deadline_seconds,
                                    spin_seconds);
}

std::unique_ptr<PipelineComm> MakePipelineComm(TransportKind kind, const Topology& topology,
                                               int world_rank, const GroupComms& comms,
                                               device::Device* device, double deadline_seconds,
                                               double spin_seconds, bool stage_host_tensors) {
  if (kind == TransportKind::kNccl) {
    return MakeNcclPipelineComm(topology, world_rank, comms, device, deadline_seconds,
                                spin_seconds);
  }
  return MakeMpiPipelineComm(topology, world_rank, comms, deadline_seconds, spin_seconds,
                             stage_host_tensors);
}

int NcclVersion() { return nccl::Version(); }

}  // namespace bigmac::comm
