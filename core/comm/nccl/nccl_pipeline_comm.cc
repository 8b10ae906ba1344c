#include "core/comm/nccl/nccl_pipeline_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
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

std::string JoinRanks(const std::vector<int>& ranks) {
  std::string text;
  for (int rank : ranks) text += (text.empty() ? "" : ", ") + std::to_string(rank);
  return text;
}

// What the NCCL parts of one transport share: the rank's device and its context, every
// communicator and stream created (to abort them all at once, and to tear them down after the
// parts), the MPI engine whose waits carry the deadline, and the trace's spans. Outlives the
// parts (std::shared_ptr); the device outlives it.
class NcclShared {
 public:
  NcclShared(std::shared_ptr<MpiEngine> engine, device::Device* device, double deadline)
      : engine_(std::move(engine)),
        device_(device),
        context_(device::cuda::ContextOf(device)),
        deadline_(deadline) {}
  NcclShared(const NcclShared&) = delete;
  NcclShared& operator=(const NcclShared&) = delete;

  ~NcclShared() {
    // Best effort, never throwing. A clean run has nothing in flight (the parts abort on their
    // way out otherwise): the communicators are finalized and destroyed; one that does not
    // finalize is aborted.
    for (ncclComm_t comm : comms_) {
      if (!aborted_ && Finalize(comm)) {
        ncclCommDestroy(comm);
      } else {
        ncclCommAbort(comm);
      }
    }
    for (cudaStream_t stream : streams_) cudaStreamDestroy(stream);
    cudaGetLastError();
  }

  device::Device* device() const { return device_; }
  const device::cuda::CudaContext& context() const { return context_; }
  MpiEngine& engine() const { return *engine_; }
  const std::shared_ptr<MpiEngine>& engine_ptr() const { return engine_; }
  bool aborted() const { return aborted_; }
  void set_spans(device::DeviceSpans* spans) { spans_ = spans; }
  // The links free the tensors of finished sends at every call of the transport, the groups'
  // included (null while there are no links).
  void set_reap_sends(std::function<void()> reap) { reap_sends_ = std::move(reap); }
  void ReapSends() {
    if (reap_sends_) reap_sends_();
  }

  // Every communicator is aborted (their operations cannot be cancelled otherwise), which also
  // stops their kernels; later calls throw TransportError.
  void Abort() {
    for (ncclComm_t comm : comms_) ncclCommAbort(comm);
    comms_.clear();
    aborted_ = true;
  }
  void CheckNotAborted(const std::string& what) const {
    if (aborted_)
      throw TransportError(what + ": the NCCL communicators of " + context_.label +
                           " were aborted");
  }

  void CheckDevice(const device::Device* device, const std::string& what) const {
    if (device != device_) {
      throw TransportError(what + ": the NCCL transport moves the memory of " + device_->name() +
                           " only, got a tensor on " + (device ? device->name() : "no device"));
    }
  }

  cudaStream_t NewStream(const std::string& where) {
    cudaStream_t stream = nullptr;
    BIGMAC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), where);
    streams_.push_back(stream);
    return stream;
  }
  void Adopt(ncclComm_t comm) { comms_.push_back(comm); }

  static cudaEvent_t RecordOn(cudaStream_t stream, const std::string& where) {
    cudaEvent_t event = nullptr;
    BIGMAC_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), where);
    BIGMAC_CUDA_CHECK(cudaEventRecord(event, stream), where);
    return event;
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

  // An NCCL call on a non-blocking communicator: checked, and waited for (under the deadline)
  // until it is enqueued.
  void Enqueue(ncclResult_t status, const char* call, ncclComm_t comm, const std::string& where) {
    nccl::Check(status, call, where, comm, /*in_progress_ok=*/true);
    if (status == ncclInProgress) WaitReady(comm, call, std::string("enqueueing ") + call, where);
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

  // MPI requests (the set-up's unique ids), under the deadline.
  void WaitMpi(MPI_Request* requests, int count, const std::string& what) {
    engine_->Wait(what, [&] {
      int done = 0;
      MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE);
      return done != 0;
    });
  }

  // The MPI engine's wait, with its deadline; past it (or on an NCCL error) the communicators are
  // aborted, since their operations cannot be cancelled otherwise.
  void Guarded(const std::string& what, const std::function<bool()>& ready) {
    try {
      engine_->Wait(what, ready);
    } catch (const DeadlineError& error) {
      Abort();
      throw DeadlineError(std::string(error.what()) + "; the NCCL communicators of " +
                          context_.label + " were aborted");
    } catch (const device::DeviceError&) {
      Abort();
      throw;
    }
  }

 private:
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

  std::shared_ptr<MpiEngine> engine_;
  device::Device* device_;
  const device::cuda::CudaContext& context_;
  double deadline_;
  std::vector<ncclComm_t> comms_;      // every communicator created
  std::vector<cudaStream_t> streams_;  // every stream created
  bool aborted_ = false;
  device::DeviceSpans* spans_ = nullptr;  // the trainer's, while it runs
  std::function<void()> reap_sends_;
};

// The pipeline's links over NCCL: payloads on a communicator and stream per direction, headers
// over the MPI links (`control`).
class NcclLinks : public PeerLinks {
 public:
  NcclLinks(std::shared_ptr<NcclShared> shared, std::unique_ptr<MpiLinks> control, MPI_Comm pp,
            const Topology& topology, int world_rank)
      : shared_(std::move(shared)),
        control_(std::move(control)),
        coords_(topology.CoordsOf(world_rank)),
        pp_size_(topology.pp_size()) {
    CreateLinks(pp);
    shared_->set_reap_sends([this] { Reap(); });
  }

  ~NcclLinks() override {
    shared_->set_reap_sends(nullptr);
    // Sends still running (an error ended the run, a peer may be gone): the communicators are
    // aborted, which stops their kernels, before the sent tensors are freed.
    for (const InFlight& f : in_flight_) {
      if (cudaEventQuery(f.done) != cudaSuccess) shared_->Abort();
    }
    for (const InFlight& f : in_flight_) cudaEventDestroy(f.done);
    cudaGetLastError();
  }

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
    const int me = coords_.pp;
    const device::cuda::CudaContext& context = shared_->context();
    std::string what;
    for (Outgoing& send : sends) {
      shared_->CheckDevice(send.tensor.device(), send.what);
      CountSent(send.tag, send.tensor.bytes());
      control_->SendHeader(send.tensor, send.peer, send.tag);
      Name(&what, send.what + " to pp rank " + std::to_string(send.peer));
    }
    std::vector<Tensor> received;
    for (const Incoming& in : receives) {
      shared_->CheckDevice(in.device, in.what);
      received.emplace_back(shared_->device(), in.shape, in.dtype);
      Name(&what, in.what + " from pp rank " + std::to_string(in.peer));
    }
    if (sends.empty() && receives.empty()) return received;
    const std::string where = what + ", on " + context.label;
    // The sent tensors were written, and the received ones allocated, on the compute stream.
    cudaEvent_t ready = NcclShared::RecordOn(context.stream, where);
    for (Outgoing& send : sends) {
      const std::string at =
          send.what + " to pp rank " + std::to_string(send.peer) + ", on " + context.label;
      const Link& link = LinkFor(me, send.peer, send.what);
      BIGMAC_CUDA_CHECK(cudaStreamWaitEvent(link.stream, ready, 0), at);
      const device::Event span_start = shared_->MarkOn(link.stream);
      shared_->Enqueue(
          ncclSend(send.tensor.raw(), static_cast<size_t>(send.tensor.numel()),
                   nccl::TypeOf(send.tensor.dtype()), link.peer, link.comm, link.stream),
          "ncclSend", link.comm, at);
      shared_->AddSpan(send.what, span_start, link.stream);
      // The compute stream goes on; the tensor waits here for its event.
      in_flight_.push_back({NcclShared::RecordOn(link.stream, at), std::move(send.tensor),
                            send.what, control_->PeerWorldRank(send.peer)});
    }
    std::vector<cudaEvent_t> arrived;
    for (size_t i = 0; i < receives.size(); ++i) {
      const Incoming& in = receives[i];
      const std::string at =
          in.what + " from pp rank " + std::to_string(in.peer) + ", on " + context.label;
      const Link& link = LinkFor(in.peer, me, in.what);
      BIGMAC_CUDA_CHECK(cudaStreamWaitEvent(link.stream, ready, 0), at);
      const device::Event span_start = shared_->MarkOn(link.stream);
      shared_->Enqueue(ncclRecv(received[i].raw(), static_cast<size_t>(received[i].numel()),
                                nccl::TypeOf(in.dtype), link.peer, link.comm, link.stream),
                       "ncclRecv", link.comm, at);
      shared_->AddSpan(in.what, span_start, link.stream);
      arrived.push_back(NcclShared::RecordOn(link.stream, at));
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
                                         {control_->PeerWorldRank(in.peer)}});
      BIGMAC_CUDA_CHECK(cudaStreamWaitEvent(context.stream, arrived[i], 0), where);
      shared_->WaitDone(arrived[i],
                        receives[i].what + " from pp rank " + std::to_string(receives[i].peer),
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
      shared_->WaitDone(f.done, "delivery of " + f.what,
                        f.what + ", on " + shared_->context().label);
      cudaEventDestroy(f.done);
      in_flight_.pop_front();
    }
    control_->FinishSends();
  }

  void Progress() override {
    Reap();
    control_->Progress();
  }
  void set_device_spans(device::DeviceSpans* spans) override { shared_->set_spans(spans); }

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

  static void Name(std::string* what, const std::string& part) {
    *what += (what->empty() ? "" : " + ") + part;
  }

  const Link& LinkFor(int from, int to, const std::string& what) const {
    shared_->CheckNotAborted(what);
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
      shared_->Abort();
      throw DeadlineError(std::string(error.what()) + "; the NCCL communicators of " +
                          shared_->context().label + " were aborted");
    } catch (const TransportError&) {
      shared_->Abort();
      throw;
    }
    if (header.tag != in.tag) {
      shared_->Abort();
      throw TransportError(
          from + ": the peer's next message has tag " + std::to_string(header.tag) + " (" +
          DescribeTensor(header.dtype, header.shape) + "), not " + std::to_string(in.tag) +
          ": NCCL matches a pair's messages in sending order, so the receiver "
          "must take them in that order (the two ranks' schedules disagree)");
    }
    if (header.dtype != in.dtype || header.shape != in.shape) {
      shared_->Abort();
      throw TransportError(from + ": expected " + DescribeTensor(in.dtype, in.shape) + ", got " +
                           DescribeTensor(header.dtype, header.shape));
    }
  }

  // Frees the tensors of sends that have run.
  void Reap() {
    for (auto it = in_flight_.begin(); it != in_flight_.end();) {
      const cudaError_t status = cudaEventQuery(it->done);
      if (status == cudaErrorNotReady) {
        ++it;
        continue;
      }
      device::cuda::Check(status, "cudaEventQuery", it->what + ", on " + shared_->context().label);
      cudaEventDestroy(it->done);
      it = in_flight_.erase(it);
    }
  }

  // The pipeline's links of this rank: to and from each neighbour, and between the first and the
  // last stage (the wrap of interleaved schedules, the tied weight). Every rank of the pp group
  // takes part (the bootstrap communicator is duplicated collectively).
  void CreateLinks(MPI_Comm pp) {
    const int me = coords_.pp;
    const int size = pp_size_;
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
    const std::string where = "creating " + what + ", on " + shared_->context().label;
    // Unique ids: this rank makes those of the directions it sends on and gets its peers'.
    MPI_Comm bootstrap = MPI_COMM_NULL;
    MPI_Request request;
    MPI_Comm_idup(pp, &bootstrap, &request);
    shared_->WaitMpi(&request, 1,
                     "the NCCL bootstrap communicator of the pp group (MPI_Comm_idup)");
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
      shared_->WaitMpi(requests.data(), static_cast<int>(requests.size()),
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
          shared_->Adopt(link.comm);
          created.push_back(&link);
        }
      }
    } catch (...) {
      ncclGroupEnd();
      throw;
    }
    nccl::Check(ncclGroupEnd(), "ncclGroupEnd", where, nullptr, true);
    for (Link* link : created) {
      shared_->WaitReady(link->comm, "ncclCommInitRankConfig", what, where);
      link->stream = shared_->NewStream(where);
    }
  }

  std::shared_ptr<NcclShared> shared_;
  std::unique_ptr<MpiLinks> control_;  // headers and their waits
  Coords coords_;
  int pp_size_;
  std::map<std::pair<int, int>, Link> links_;  // (sending, receiving) pp rank
  std::list<InFlight> in_flight_;
};

// A group whose tensor collectives run on NCCL: one communicator and stream for the group; the
// host helpers are the MPI group's (the control plane) over the same ranks.
//
// An all-reduce is ncclAllReduce in place on the group's stream after the compute stream's work
// so far (the tensor was written there); the compute stream goes on and waits for the result only
// when it is taken (Test true, or WaitAll), so later layers' backward overlaps with it. bf16 is
// reduced in f32, as over MPI.
class NcclGroup : public MpiGroup {
 public:
  NcclGroup(std::shared_ptr<NcclShared> shared, MPI_Comm comm, std::string name)
      : MpiGroup(shared->engine_ptr(), comm, name, /*ordered_sums=*/false),
        shared_(std::move(shared)) {
    nccl_comm_ = CreateGroupComm(comm, name);
    if (nccl_comm_)
      stream_ = shared_->NewStream("NCCL transport set-up, on " + shared_->context().label);
  }

  ~NcclGroup() override {
    for (const Reduction& r : started_) {
      if (r.done_event && cudaEventQuery(r.done_event) != cudaSuccess) shared_->Abort();
    }
    for (const Reduction& r : started_) {
      if (r.done_event) cudaEventDestroy(r.done_event);
    }
    cudaGetLastError();
  }

  int StartAllReduce(Tensor* tensor, ReduceOp op, const std::string& what) override {
    const int handle = static_cast<int>(started_.size());
    started_.emplace_back();
    Reduction& r = started_.back();
    r.tensor = tensor;
    r.what = what;
    if (size() == 1 || tensor->numel() == 0) {
      r.done = true;
      return handle;
    }
    const device::cuda::CudaContext& context = shared_->context();
    const std::string where = what + ", on " + context.label;
    shared_->CheckDevice(tensor->device(), what);
    shared_->CheckNotAborted(what);
    if (nccl_comm_ == nullptr) throw TransportError(what + ": no NCCL communicator for the group");
    shared_->ReapSends();
    // bf16 is reduced in f32, as over MPI.
    Tensor* target = tensor;
    if (tensor->dtype() == memory::DType::kBF16) {
      r.wide = Tensor(tensor->device(), tensor->shape(), memory::DType::kF32);
      r.wide.ConvertFrom(*tensor);
      target = &r.wide;
    } else if (tensor->dtype() != memory::DType::kF32 && tensor->dtype() != memory::DType::kF64) {
      throw TransportError(what + ": reduces f32, f64 or bf16, got " +
                           DescribeTensor(tensor->dtype(), tensor->shape()));
    }
    cudaEvent_t ready = NcclShared::RecordOn(context.stream, where);
    BIGMAC_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0), where);
    cudaEventDestroy(ready);
    const device::Event span_start = shared_->MarkOn(stream_);
    shared_->Enqueue(
        ncclAllReduce(target->raw(), target->raw(), static_cast<size_t>(target->numel()),
                      nccl::TypeOf(target->dtype()), op == ReduceOp::kSum ? ncclSum : ncclMax,
                      nccl_comm_, stream_),
        "ncclAllReduce", nccl_comm_, where);
    shared_->AddSpan(what, span_start, stream_);
    r.done_event = NcclShared::RecordOn(stream_, where);
    return handle;
  }

  // Through StartAllReduce (Group's defaults), as before NCCL's own collectives are wired.
  int StartReduceScatter(Tensor* tensor, const std::string& what) override {
    return Group::StartReduceScatter(tensor, what);
  }
  int StartAllGather(Tensor* tensor, const std::string& what) override {
    return Group::StartAllGather(tensor, what);
  }

  bool Test(int handle) override {
    if (handle < 0 || handle >= static_cast<int>(started_.size()))
      throw std::logic_error("Test: no collective " + std::to_string(handle) +
                             " is in flight on the " + name() + " group");
    shared_->ReapSends();
    Reduction& r = started_[handle];
    if (r.done) return true;
    const cudaError_t status = cudaEventQuery(r.done_event);
    if (status == cudaErrorNotReady) return false;
    device::cuda::Check(status, "cudaEventQuery", r.what + ", on " + shared_->context().label);
    Take(&r);
    return true;
  }

  void Progress() override {
    for (int i = 0; i < static_cast<int>(started_.size()); ++i) Test(i);
  }

  void WaitAll() override {
    for (size_t i = 0; i < started_.size(); ++i) {
      Reduction& r = started_[i];
      if (r.done) continue;
      const progress::WaitScope waiting({progress::WaitKind::kCollective, r.what, name()});
      shared_->WaitDone(r.done_event,
                        r.what + " (reduction " + std::to_string(i + 1) + " of " +
                            std::to_string(started_.size()) + " started this step)",
                        r.what + ", on " + shared_->context().label);
      Take(&r);
    }
    started_.clear();
  }

  void set_device_spans(device::DeviceSpans* spans) override { shared_->set_spans(spans); }

 private:
  // One non-blocking reduction: its tensor, the f32 copy a bf16 tensor is reduced in, and the
  // event that fires on the group's stream when it is done.
  struct Reduction {
    Tensor* tensor = nullptr;
    std::string what;
    Tensor wide;
    cudaEvent_t done_event = nullptr;
    bool done = false;
  };

  // A finished reduction, handed to the compute stream: it waits for the group stream's event
  // before it touches the tensor (a bf16 one is narrowed there from its f32 result).
  void Take(Reduction* r) {
    const std::string where = r->what + ", on " + shared_->context().label;
    BIGMAC_CUDA_CHECK(cudaStreamWaitEvent(shared_->context().stream, r->done_event, 0), where);
    cudaEventDestroy(r->done_event);
    r->done_event = nullptr;
    if (r->wide.numel() > 0) {
      r->tensor->ConvertFrom(r->wide);
      r->wide = Tensor();
    }
    r->done = true;
  }

  // A communicator over the whole group, or null for a group of one.
  ncclComm_t CreateGroupComm(MPI_Comm group, const std::string& name) {
    if (group == MPI_COMM_NULL || size() < 2) return nullptr;
    const std::string what = "the NCCL communicator of the " + name + " group (" +
                             std::to_string(size()) + " ranks; this is its rank " +
                             std::to_string(rank()) + ")";
    const std::string where = "creating " + what + ", on " + shared_->context().label;
    ncclUniqueId id{};
    if (rank() == 0) BIGMAC_NCCL_CHECK(ncclGetUniqueId(&id), where);
    MPI_Request request;
    MPI_Ibcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, group, &request);
    shared_->WaitMpi(&request, 1, "the unique id of " + what + " from its rank 0 (MPI_Ibcast)");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    nccl::Check(ncclCommInitRankConfig(&comm, size(), id, rank(), &config),
                "ncclCommInitRankConfig", where, comm, true);
    shared_->Adopt(comm);
    shared_->WaitReady(comm, "ncclCommInitRankConfig", what, where);
    return comm;
  }

  std::shared_ptr<NcclShared> shared_;
  ncclComm_t nccl_comm_ = nullptr;  // null for a group of one
  cudaStream_t stream_ = nullptr;
  std::vector<Reduction> started_;  // since the last WaitAll
};

}  // namespace

std::unique_ptr<PipelineComm> MakeNcclPipelineComm(const Topology& topology, int world_rank,
                                                   const GroupComms& comms, device::Device* device,
                                                   double deadline_seconds, double spin_seconds) {
  auto engine = std::make_shared<MpiEngine>(topology, world_rank, deadline_seconds, spin_seconds,
                                            /*stage_host_tensors=*/false);
  auto shared = std::make_shared<NcclShared>(engine, device, deadline_seconds);
  const device::cuda::CudaContext& context = shared->context();
  BIGMAC_CUDA_CHECK(cudaSetDevice(context.ordinal), "NCCL transport set-up, on " + context.label);
  PipelineComm::Parts parts;
  parts.shared = shared;
  try {
    // The same order on every rank: the pipeline's links, then the data-parallel group, then the
    // tensor-parallel one.
    parts.links = std::make_unique<NcclLinks>(
        shared, std::make_unique<MpiLinks>(engine, comms.pp, topology, world_rank), comms.pp,
        topology, world_rank);
    parts.world = std::make_unique<MpiGroup>(engine, MPI_COMM_WORLD, "world", false);
    parts.pp = std::make_unique<MpiGroup>(engine, comms.pp, "pp", false);
    parts.dp = std::make_unique<NcclGroup>(shared, comms.dp, "dp");
    parts.tp = std::make_unique<NcclGroup>(shared, comms.tp, "tp");
  } catch (...) {
    shared->Abort();
    throw;
  }
  return std::make_unique<PipelineComm>(std::move(parts));
}

std::unique_ptr<PipelineComm> MakePipelineComm(TransportKind kind, const Topology& topology,
                                               int world_rank, const GroupComms& comms,
                                               device::Device* device, double deadline_seconds,
                                               double spin_seconds, bool stage_host_tensors,
                                               int64_t max_message_bytes) {
  if (kind == TransportKind::kNccl) {
    return MakeNcclPipelineComm(topology, world_rank, comms, device, deadline_seconds,
                                spin_seconds);
  }
  return MakeMpiPipelineComm(topology, world_rank, comms, deadline_seconds, spin_seconds,
                             stage_host_tensors, max_message_bytes);
}

int NcclVersion() { return nccl::Version(); }

}  // namespace bigmac::comm
