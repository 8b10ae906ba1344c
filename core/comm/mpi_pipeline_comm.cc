#include "core/comm/mpi_pipeline_comm.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/comm/progress.h"
#include "core/util/compute_progress.h"

namespace bigmac::comm {
namespace {

constexpr int64_t kMagic = 0x424d4143;  // "BMAC"
constexpr int kHeaderBytes = static_cast<int>(sizeof(int64_t) * kMessageHeaderWords);
// MPI counts are ints: a payload goes out as messages of at most this many bytes (after its
// header, same tag, matched in order), so tensors of 2 GiB and more travel.
constexpr int64_t kMaxMessageBytes = int64_t{1} << 30;

std::array<int64_t, kMessageHeaderWords> HeaderOf(const memory::Tensor& tensor) {
  if (tensor.shape().size() > 4)
    throw TransportError("tensors of more than 4 dimensions cannot be sent");
  std::array<int64_t, kMessageHeaderWords> header = {kMagic,
                                                     static_cast<int64_t>(tensor.dtype()),
                                                     static_cast<int64_t>(tensor.shape().size()),
                                                     0,
                                                     0,
                                                     0,
                                                     0,
                                                     tensor.numel()};
  for (size_t i = 0; i < tensor.shape().size(); ++i) header[3 + i] = tensor.shape()[i];
  return header;
}

MPI_Datatype MpiType(memory::DType wide) {
  return wide == memory::DType::kF64 ? MPI_DOUBLE : MPI_FLOAT;
}

MPI_Op MpiOp(ReduceOp op) { return op == ReduceOp::kSum ? MPI_SUM : MPI_MAX; }

std::vector<int64_t> ShapeOf(const std::array<int64_t, kMessageHeaderWords>& header) {
  std::vector<int64_t> shape;
  for (int i = 0; i < header[2] && i < 4; ++i) shape.push_back(header[3 + i]);
  return shape;
}

// The byte ranges [offset, offset + size) a payload of `bytes` travels in: messages of at most
// `max_message_bytes`, posted in this order by the sender and the receiver alike.
template <typename Post>
void ForEachChunk(int64_t bytes, int64_t max_message_bytes, const Post& post) {
  for (int64_t offset = 0; offset < bytes; offset += max_message_bytes)
    post(offset, static_cast<int>(std::min(max_message_bytes, bytes - offset)));
}

int64_t ChunkCount(int64_t bytes, int64_t max_message_bytes) {
  return (bytes + max_message_bytes - 1) / max_message_bytes;
}

}  // namespace

// ---- MpiEngine ---------------------------------------------------------------------------------

MpiEngine::MpiEngine(const Topology& topology, int world_rank, double deadline_seconds,
                     double spin_seconds, bool stage_host_tensors)
    : who_("pp " + std::to_string(topology.CoordsOf(world_rank).pp) + ", dp " +
           std::to_string(topology.CoordsOf(world_rank).dp)),
      deadline_(deadline_seconds),
      spin_(spin_seconds),
      stage_host_(stage_host_tensors) {}

MpiEngine::~MpiEngine() {
  // Only on an abnormal exit are sends still in flight: MPI may still read their buffers, so
  // they are released to MPI and deliberately leaked rather than freed under it.
  for (Send& send : sends_) {
    for (MPI_Request& request : send.requests) {
      if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
    }
  }
  if (!sends_.empty()) new std::list<Send>(std::move(sends_));  // nodes stay in place
}

MpiEngine::Send& MpiEngine::AddSend() {
  sends_.emplace_back();
  return sends_.back();
}

std::vector<int> MpiEngine::PendingPeers() const {
  std::vector<int> peers;
  for (const Send& send : sends_) {
    if (std::find(peers.begin(), peers.end(), send.world_peer) == peers.end())
      peers.push_back(send.world_peer);
  }
  return peers;
}

void MpiEngine::Reap() {
  for (auto it = sends_.begin(); it != sends_.end();) {
    int done = 0;
    MPI_Testall(static_cast<int>(it->requests.size()), it->requests.data(), &done,
                MPI_STATUSES_IGNORE);
    if (!done) {
      ++it;
      continue;
    }
    if (!it->name.empty() && delivery_sink_) {
      delivery_sink_({std::move(it->name), it->posted, std::chrono::steady_clock::now(),
                      util::InsideComputeProgress()});
    }
    it = sends_.erase(it);
  }
}

void MpiEngine::Wait(const std::string& what, const std::function<bool()>& ready) {
  const auto start = std::chrono::steady_clock::now();
  // Shows in the hang report where the caller did not describe the wait.
  const progress::WaitScope waiting({progress::WaitKind::kCollective, what});
  int sleep_us = 10;
  while (true) {
    const bool done = ready();
    Reap();  // MPI progresses only inside MPI calls: the sends in flight go out meanwhile
    if (done) return;
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited < spin_) {
      sched_yield();
      continue;
    }
    if (waited > deadline_) {
      char limit[32];
      std::snprintf(limit, sizeof(limit), "%g", deadline_);
      const std::string message = who_ + ": waited " + std::to_string(static_cast<int>(waited)) +
                                  " s for " + what + ", past the deadline of " + limit +
                                  " s (train.comm_timeout_seconds)";
      // Before the job stops: the hang report (core/comm/hang_watch.h), if one is installed.
      throw DeadlineError(message + progress::OnDeadline(message));
    }
    usleep(sleep_us);
    sleep_us = std::min(sleep_us * 2, 200);
  }
}

void MpiEngine::Complete(MPI_Request* request, const std::string& what) {
  Wait(what, [&] {
    int done = 0;
    MPI_Test(request, &done, MPI_STATUS_IGNORE);
    return done != 0;
  });
}

bool MpiEngine::Staged(const device::Device* device) const {
  return stage_host_ || device->backend() != device::Backend::kCpu;
}

// ---- MpiLinks ----------------------------------------------------------------------------------

MpiLinks::MpiLinks(std::shared_ptr<MpiEngine> engine, MPI_Comm pp, const Topology& topology,
                   int world_rank, int64_t max_message_bytes)
    : engine_(std::move(engine)),
      pp_(pp),
      topology_(topology),
      coords_(topology.CoordsOf(world_rank)),
      max_message_bytes_(max_message_bytes > 0 ? max_message_bytes : kMaxMessageBytes) {
  engine_->set_delivery_sink([this](MessageSpan span) {
    if (record_messages()) AddMessageSpan(std::move(span));
  });
}

MpiLinks::~MpiLinks() {
  engine_->set_delivery_sink(nullptr);
  // Receives still posted (an abnormal exit): MPI may still write their buffers, which leak.
  expected_.splice(expected_.end(), abandoned_);
  bool posted = false;
  for (Pending& p : expected_) {
    for (MPI_Request& request : p.requests) {
      if (request != MPI_REQUEST_NULL) {
        MPI_Request_free(&request);
        posted = true;
      }
    }
  }
  if (posted) new std::list<Pending>(std::move(expected_));
}

int MpiLinks::PeerWorldRank(int pp_peer) const {
  Coords peer = coords_;
  peer.pp = pp_peer;
  return topology_.RankOf(peer);
}

MpiEngine::Send& MpiLinks::PostHeader(const memory::Tensor& tensor, int peer, int tag) {
  const std::array<int64_t, kMessageHeaderWords> header = HeaderOf(tensor);
  MpiEngine::Send& send = engine_->AddSend();
  send.header = header;
  send.world_peer = PeerWorldRank(peer);
  send.requests.emplace_back();
  MPI_Isend(send.header.data(), kHeaderBytes, MPI_BYTE, peer, tag, pp_, &send.requests.back());
  return send;
}

void MpiLinks::Send(memory::Tensor tensor, int peer, int tag, const std::string& what) {
  // Device memory goes through the host, copied before anything is posted (a failed copy leaves
  // no header without its data); the tensor is free as soon as it is copied.
  const bool stage = engine_->Staged(tensor.device());
  StagingPool::Buffer staging;
  if (stage) {
    staging = engine_->staging().Acquire(tensor.device(), tensor.bytes());
    tensor.CopyToHost(staging.data());
  }
  MpiEngine::Send& send = PostHeader(tensor, peer, tag);
  CountSent(tag, tensor.bytes());
  if (record_messages()) {
    send.name = what + " to pp rank " + std::to_string(peer);
    send.posted = std::chrono::steady_clock::now();
  }
  const char* data = static_cast<const char*>(tensor.raw());
  if (stage) {
    send.staging = std::move(staging);
    data = send.staging.data();
  }
  send.requests.reserve(send.requests.size() + ChunkCount(tensor.bytes(), max_message_bytes_));
  ForEachChunk(tensor.bytes(), max_message_bytes_, [&](int64_t offset, int n) {
    send.requests.emplace_back();
    MPI_Isend(data + offset, n, MPI_BYTE, peer, tag, pp_, &send.requests.back());
  });
  if (!stage) send.tensor = std::move(tensor);
  engine_->Reap();
}

void MpiLinks::SendHeader(const memory::Tensor& tensor, int peer, int tag) {
  PostHeader(tensor, peer, tag);
  engine_->Reap();
}

MPI_Status MpiLinks::Probe(int peer, int tag, const std::string& from) {
  MPI_Status status;
  engine_->Wait(from + " (world rank " + std::to_string(PeerWorldRank(peer)) + ")", [&] {
    int found = 0;
    MPI_Iprobe(peer, tag, pp_, &found, &status);
    return found != 0;
  });
  return status;
}

MessageHeader MpiLinks::ReceiveNextHeader(int peer, const std::string& what) {
  const std::string from = what + " from pp rank " + std::to_string(peer);
  const progress::WaitScope waiting(
      {progress::WaitKind::kReceive, what, "pp", "", -1, {PeerWorldRank(peer)}});
  const MPI_Status status = Probe(peer, MPI_ANY_TAG, from);
  int bytes = 0;
  MPI_Get_count(&status, MPI_BYTE, &bytes);
  std::vector<char> buffer(std::max(bytes, 1));
  MPI_Request request;
  MPI_Irecv(buffer.data(), bytes, MPI_BYTE, peer, status.MPI_TAG, pp_, &request);
  engine_->Complete(&request, from + " (receiving the matched header)");
  int64_t header[kMessageHeaderWords] = {};
  if (bytes == kHeaderBytes) std::memcpy(header, buffer.data(), bytes);
  if (bytes != kHeaderBytes || header[0] != kMagic || header[2] < 0 || header[2] > 4) {
    throw TransportError(from + ": got a malformed header (" + std::to_string(bytes) +
                         " bytes, tag " + std::to_string(status.MPI_TAG) + ")");
  }
  MessageHeader result;
  result.tag = status.MPI_TAG;
  result.dtype = static_cast<memory::DType>(header[1]);
  for (int i = 0; i < header[2]; ++i) result.shape.push_back(header[3 + i]);
  result.numel = header[7];
  return result;
}

bool MpiLinks::TryTakeHeader(Pending* p) {
  // A matched probe: the message found is the one received, without any wait (no wait record,
  // no deadline: this runs inside computations).
  int found = 0;
  MPI_Message message;
  MPI_Status status;
  MPI_Improbe(p->in.peer, p->in.tag, pp_, &found, &message, &status);
  if (!found) return false;
  int bytes = 0;
  MPI_Get_count(&status, MPI_BYTE, &bytes);
  if (bytes != kHeaderBytes) {
    // No header: left for WaitForHeader to take and report. The message is matched now, so it is
    // received here into a buffer kept for that.
    p->junk.resize(std::max(bytes, 1));
    MPI_Mrecv(p->junk.data(), bytes, MPI_BYTE, &message, MPI_STATUS_IGNORE);
    p->header_bytes = bytes;
    return true;
  }
  MPI_Mrecv(p->header.data(), bytes, MPI_BYTE, &message, MPI_STATUS_IGNORE);
  p->header_bytes = bytes;
  return true;
}

void MpiLinks::WaitForHeader(Pending* p, const std::string& from) {
  if (p->header_bytes < 0) {
    const MPI_Status status = Probe(p->in.peer, p->in.tag, from);
    int bytes = 0;
    MPI_Get_count(&status, MPI_BYTE, &bytes);
    char* into = reinterpret_cast<char*>(p->header.data());
    if (bytes != kHeaderBytes) {
      p->junk.resize(std::max(bytes, 1));
      into = p->junk.data();
    }
    MPI_Request request;
    MPI_Irecv(into, bytes, MPI_BYTE, p->in.peer, p->in.tag, pp_, &request);
    engine_->Complete(&request, from + " (receiving the matched message)");
    p->header_bytes = bytes;
  }
  if (p->header_bytes != kHeaderBytes) {
    throw TransportError(from + ": expected " + DescribeTensor(p->in.dtype, p->in.shape) +
                         ", got a malformed message (" + std::to_string(p->header_bytes) +
                         " bytes)");
  }
}

bool MpiLinks::HeaderMatches(const Pending& p) const {
  int64_t numel = 1;
  for (int64_t extent : p.in.shape) numel *= extent;
  return p.header_bytes == kHeaderBytes && p.header[0] == kMagic &&
         ShapeOf(p.header) == p.in.shape && static_cast<memory::DType>(p.header[1]) == p.in.dtype &&
         p.header[7] == numel;
}

void MpiLinks::ThrowMismatch(const Pending& p, const std::string& from) const {
  const auto got_dtype = static_cast<memory::DType>(p.header[1]);
  throw TransportError(from + ": expected " + DescribeTensor(p.in.dtype, p.in.shape) + ", got " +
                       (p.header[0] == kMagic ? DescribeTensor(got_dtype, ShapeOf(p.header))
                                              : "a malformed message") +
                       " (" + std::to_string(p.header_bytes) + " bytes)");
}

void MpiLinks::PostData(Pending* p) {
  // Everything that can throw comes first, and the destination is in place before MPI may write
  // it: a failure leaves the message queued and this receive unposted.
  memory::Tensor tensor(p->in.device, p->in.shape, p->in.dtype);
  StagingPool::Buffer staging;
  if (engine_->Staged(p->in.device))
    staging = engine_->staging().Acquire(p->in.device, tensor.bytes());
  p->requests.reserve(ChunkCount(tensor.bytes(), max_message_bytes_));
  p->tensor = std::move(tensor);
  p->staging = std::move(staging);
  char* data = p->staging.data() ? p->staging.data() : static_cast<char*>(p->tensor.raw());
  ForEachChunk(p->tensor.bytes(), max_message_bytes_, [&](int64_t offset, int n) {
    p->requests.emplace_back();
    MPI_Irecv(data + offset, n, MPI_BYTE, p->in.peer, p->in.tag, pp_, &p->requests.back());
  });
  p->data_posted = true;
  p->posted = std::chrono::steady_clock::now();
}

bool MpiLinks::TestArrived(Pending* p) {
  if (p->arrived) return true;
  if (!p->data_posted) return false;
  int done = 0;
  MPI_Testall(static_cast<int>(p->requests.size()), p->requests.data(), &done, MPI_STATUSES_IGNORE);
  if (!done) return false;
  p->arrived = true;
  p->arrival = std::chrono::steady_clock::now();
  p->arrived_in_compute = util::InsideComputeProgress();
  return true;
}

void MpiLinks::Expect(const Incoming& receive) {
  expected_.push_back({});
  expected_.back().in = receive;
}

void MpiLinks::Progress() {
  engine_->Reap();
  abandoned_.remove_if([this](Pending& p) { return TestArrived(&p); });
  for (auto it = expected_.begin(); it != expected_.end(); ++it) {
    Pending& p = *it;
    if (!p.data_posted) {
      // A later receive with the same (peer, tag) must not take an earlier one's message.
      const bool earlier_unposted = std::any_of(expected_.begin(), it, [&](const Pending& e) {
        return !e.data_posted && e.in.peer == p.in.peer && e.in.tag == p.in.tag;
      });
      if (earlier_unposted) continue;
      if (p.header_bytes < 0 && !TryTakeHeader(&p)) continue;
      if (!HeaderMatches(p)) continue;  // Receive reports it
      PostData(&p);
    }
    TestArrived(&p);
  }
}

size_t MpiLinks::ForgetExpected() {
  size_t posted = 0;
  for (auto it = expected_.begin(); it != expected_.end();) {
    auto next = std::next(it);
    if (it->data_posted && !TestArrived(&*it)) {
      ++posted;  // MPI may still write it: kept apart until it arrives (or leaked at the end)
      abandoned_.splice(abandoned_.end(), expected_, it);
    } else {
      expected_.erase(it);
    }
    it = next;
  }
  return posted;
}

memory::Tensor MpiLinks::Receive(int peer, int tag, const std::vector<int64_t>& shape,
                                 memory::DType dtype, device::Device* device,
                                 const std::string& what) {
  const std::string from = what + " from pp rank " + std::to_string(peer);
  const progress::WaitScope waiting({progress::WaitKind::kReceive,
                                     what,
                                     "pp",
                                     DescribeTensor(dtype, shape),
                                     tag,
                                     {PeerWorldRank(peer)}});
  // An announced receive may be under way already; an unannounced one joins the list, so that
  // buffers MPI may write stay owned by it until they have arrived.
  auto it = std::find_if(expected_.begin(), expected_.end(),
                         [&](const Pending& e) { return e.in.peer == peer && e.in.tag == tag; });
  if (it == expected_.end()) {
    it = expected_.insert(expected_.end(), Pending{});
    it->in = {peer, tag, shape, dtype, device, what};
  } else if (it->in.shape != shape || it->in.dtype != dtype || it->in.device != device) {
    throw std::logic_error(from + ": announced as " + DescribeTensor(it->in.dtype, it->in.shape) +
                           ", received as " + DescribeTensor(dtype, shape));
  }
  Pending& p = *it;
  if (!p.data_posted) {
    WaitForHeader(&p, from);
    if (!HeaderMatches(p)) {
      const Pending mismatched = std::move(p);
      expected_.erase(it);
      ThrowMismatch(mismatched, from);
    }
    PostData(&p);
  }
  for (MPI_Request& request : p.requests) engine_->Complete(&request, from + " (its data)");
  TestArrived(&p);
  if (record_messages()) AddMessageSpan({from, p.posted, p.arrival, p.arrived_in_compute});
  memory::Tensor tensor = std::move(p.tensor);
  const StagingPool::Buffer staging = std::move(p.staging);
  expected_.erase(it);
  if (!staging.data()) return tensor;
  tensor.CopyFromHost(staging.data());
  // A copy from pinned memory may still be reading it: done before the buffer is reused.
  if (device->host_staging_pinned()) device->Synchronize();
  return tensor;
}

void MpiLinks::FinishSends() {
  const std::string what =
      "delivery of " + std::to_string(engine_->sends_in_flight()) + " sent message(s)";
  const progress::WaitScope waiting(
      {progress::WaitKind::kSends, what, "pp", "", -1, engine_->PendingPeers()});
  engine_->Wait(what, [&] {
    engine_->Reap();
    return engine_->sends_in_flight() == 0;
  });
}

// ---- MpiGroup ----------------------------------------------------------------------------------

namespace {
enum Kind { kAllReduce, kReduceScatter, kAllGather };
}  // namespace

// One non-blocking collective, in place on its tensor or on a host staging copy of it.
struct MpiGroup::Collective {
  memory::Tensor* tensor = nullptr;
  std::string what;
  Kind kind = kAllReduce;
  ReduceOp op = ReduceOp::kSum;
  bool ordered = false;  // through the all-to-all and a local combine in rank order
  memory::DType wide = memory::DType::kF32;
  StagingPool::Buffer staging;  // bf16 widened to f32, device memory, or a padded copy
  bool staged = false;
  std::vector<char> received;  // the all-to-all's pieces of this rank's shard, in rank order
  void* data = nullptr;        // the host buffer the collective works on
  int64_t shard = 0;           // elements per rank
  bool scattered = false;      // an ordered all-reduce's first half is done
  std::vector<MPI_Request> requests;
  bool done = false;
};

MpiGroup::MpiGroup(std::shared_ptr<MpiEngine> engine, MPI_Comm comm, std::string name,
                   bool ordered_sums)
    : engine_(std::move(engine)), comm_(comm), name_(std::move(name)), ordered_(ordered_sums) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  // Collective over the group: every rank constructs its transport at start-up.
  if (ordered_ && size_ > 1) MPI_Comm_dup(comm_, &gather_comm_);
}

MpiGroup::~MpiGroup() {
  // Collectives still in flight (an abnormal exit, the job is stopping): a collective's request
  // cannot be freed, and MPI may still write their staging buffers, so those leak.
  if (!started_.empty()) new std::vector<std::unique_ptr<Collective>>(std::move(started_));
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (gather_comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&gather_comm_);
}

int MpiGroup::StartAllReduce(memory::Tensor* tensor, ReduceOp op, const std::string& what) {
  return Start(kAllReduce, tensor, op, what);
}

int MpiGroup::StartReduceScatter(memory::Tensor* tensor, const std::string& what) {
  DpShardOf(tensor->numel(), size_, rank_);  // checks the shape
  return Start(ordered_ ? kReduceScatter : kAllReduce, tensor, ReduceOp::kSum, what);
}

int MpiGroup::StartAllGather(memory::Tensor* tensor, const std::string& what) {
  DpShardOf(tensor->numel(), size_, rank_);
  return Start(kAllGather, tensor, ReduceOp::kSum, what);
}

int MpiGroup::Start(int kind, memory::Tensor* tensor, ReduceOp op, const std::string& what) {
  started_.push_back(std::make_unique<Collective>());
  Collective& c = *started_.back();
  const int handle = static_cast<int>(started_.size()) - 1;
  c.tensor = tensor;
  c.what = what;
  c.kind = static_cast<Kind>(kind);
  c.op = op;
  c.ordered = ordered_ && kind != kAllGather;
  if (size_ == 1 || tensor->numel() == 0) {
    c.done = true;
    return handle;
  }
  const memory::DType dtype = tensor->dtype();
  if (dtype != memory::DType::kF32 && dtype != memory::DType::kF64 &&
      dtype != memory::DType::kBF16) {
    throw TransportError(what + ": cannot reduce " + memory::DTypeName(dtype) + " tensors");
  }
  // MPI works on f32 and f64 in host memory; bf16 is reduced in f32, device memory is staged, and
  // an ordered collective on a numel that the group does not divide is padded with zeros.
  c.wide = dtype == memory::DType::kBF16 ? memory::DType::kF32 : dtype;
  const int64_t element = memory::DTypeSize(c.wide);
  const int64_t padded = c.kind == kAllGather || c.ordered
                             ? (tensor->numel() + size_ - 1) / size_ * size_
                             : tensor->numel();
  c.shard = padded / size_;
  if (padded > std::numeric_limits<int>::max() && !c.ordered && c.kind != kAllGather)
    throw TransportError(what + ": more elements in one all-reduce than an MPI count holds");
  if (c.shard > std::numeric_limits<int>::max())
    throw TransportError(what + ": " + std::to_string(c.shard) +
                         " elements per rank, more than an MPI count holds");
  c.data = tensor->raw();
  if (dtype == memory::DType::kBF16 || engine_->Staged(tensor->device()) ||
      padded != tensor->numel()) {
    // Through the staging pool (pinned on CUDA); its buffers are not zeroed: the padding is.
    memory::Tensor host_copy(tensor->device(), tensor->shape(), c.wide);
    host_copy.ConvertFrom(*tensor);
    c.staging = engine_->staging().Acquire(tensor->device(), padded * element);
    c.staged = true;
    host_copy.CopyToHost(c.staging.data());
    std::memset(c.staging.data() + tensor->numel() * element, 0,
                (padded - tensor->numel()) * element);
    c.data = c.staging.data();
  }
  c.requests.emplace_back();
  if (c.kind == kAllGather) {
    StartGather(&c, comm_);
  } else if (c.ordered) {
    c.received.resize(padded * element);
    MPI_Ialltoall(c.data, static_cast<int>(c.shard), MpiType(c.wide), c.received.data(),
                  static_cast<int>(c.shard), MpiType(c.wide), comm_, &c.requests.back());
  } else {
    MPI_Iallreduce(MPI_IN_PLACE, c.data, static_cast<int>(padded), MpiType(c.wide), MpiOp(op),
                   comm_, &c.requests.back());
  }
  return handle;
}

void MpiGroup::StartGather(Collective* c, MPI_Comm comm) {
  c->requests.assign(1, MPI_REQUEST_NULL);
  MPI_Iallgather(MPI_IN_PLACE, 0, MpiType(c->wide), c->data, static_cast<int>(c->shard),
                 MpiType(c->wide), comm, &c->requests.back());
}

// Starts the all-gathers of ordered all-reduces whose reduce-scatter is done, in start order (the
// same on every rank): none overtakes an earlier all-reduce still scattering.
void MpiGroup::StartSecondHalves() {
  while (next_gather_ < started_.size()) {
    Collective& c = *started_[next_gather_];
    if (c.kind == kAllReduce && c.ordered && !c.done) {
      if (!c.scattered) return;
      if (c.requests.empty()) StartGather(&c, gather_comm_);
    }
    ++next_gather_;
  }
}

// The pieces of this rank's shard, combined in rank order into its place in the buffer.
template <typename T>
void MpiGroup::CombineShard(Collective* c) {
  const T* pieces = reinterpret_cast<const T*>(c->received.data());
  T* out = static_cast<T*>(c->data) + rank_ * c->shard;
  std::copy(pieces, pieces + c->shard, out);
  for (int q = 1; q < size_; ++q) {
    const T* piece = pieces + q * c->shard;
    if (c->op == ReduceOp::kSum) {
      for (int64_t i = 0; i < c->shard; ++i) out[i] += piece[i];
    } else {
      for (int64_t i = 0; i < c->shard; ++i) out[i] = std::max(out[i], piece[i]);
    }
  }
  c->received = {};
}

// Progresses `c` without blocking; once complete, its result is in its tensor.
bool MpiGroup::Advance(Collective* c) {
  if (c->done) return true;
  if (c->requests.empty()) {  // a scattered all-reduce whose all-gather waits for its turn
    StartSecondHalves();
    if (c->requests.empty()) return false;
  }
  int complete = 0;
  MPI_Testall(static_cast<int>(c->requests.size()), c->requests.data(), &complete,
              MPI_STATUSES_IGNORE);
  if (!complete) return false;
  if (c->ordered && !c->scattered) {
    if (c->wide == memory::DType::kF64) {
      CombineShard<double>(c);
    } else {
      CombineShard<float>(c);
    }
    c->scattered = true;
    c->requests.clear();
    if (c->kind == kAllReduce) {
      StartSecondHalves();
      return false;
    }
  }
  if (c->staged) {
    memory::Tensor wide(c->tensor->device(), c->tensor->shape(), c->wide);
    wide.CopyFromHost(c->staging.data());
    c->tensor->ConvertFrom(wide);
    // A copy from pinned memory may still be reading it: done before the buffer is reused.
    if (c->tensor->device()->host_staging_pinned()) c->tensor->device()->Synchronize();
    c->staging = {};
    c->staged = false;
  }
  c->done = true;
  return true;
}

bool MpiGroup::Test(int handle) {
  if (handle < 0 || handle >= static_cast<int>(started_.size()))
    throw std::logic_error("Test: no collective " + std::to_string(handle) + " is in flight on " +
                           "the " + name_ + " group");
  engine_->Reap();  // also progresses every outstanding collective
  // The earlier ones too: an all-reduce's second half waits for theirs to start.
  for (int i = 0; i < handle; ++i) Advance(started_[i].get());
  return Advance(started_[handle].get());
}

void MpiGroup::Progress() {
  for (const std::unique_ptr<Collective>& c : started_) Advance(c.get());
}

void MpiGroup::WaitAll() {
  size_t first = 0;  // the first collective not known to be complete
  auto all_done = [&] {
    engine_->Reap();
    while (first < started_.size() && Advance(started_[first].get())) ++first;
    return first == started_.size();
  };
  while (!all_done()) {
    // Waits on the first pending one (its name goes into a deadline message and the hang
    // report's wait record), then goes on.
    const size_t waiting_for = first;
    Collective* c = started_[waiting_for].get();
    const progress::WaitScope waiting({progress::WaitKind::kCollective, c->what, name_});
    engine_->Wait(c->what + " (reduction " + std::to_string(waiting_for + 1) + " of " +
                      std::to_string(started_.size()) + " started this step)",
                  [&] { return Advance(c); });
  }
  started_.clear();
  next_gather_ = 0;
}

std::vector<memory::Tensor> MpiGroup::AllGather(const memory::Tensor& tensor,
                                                const std::string& what) {
  const progress::WaitScope waiting({progress::WaitKind::kCollective, what, name_});
  if (tensor.bytes() > kMaxMessageBytes)
    throw TransportError(what + ": slices of 1 GiB and more are not gathered");
  const int bytes = static_cast<int>(tensor.bytes());
  std::vector<char> local(bytes);
  tensor.CopyToHost(local.data());
  std::vector<char> all(static_cast<size_t>(bytes) * size_);
  MPI_Request request;
  MPI_Iallgather(local.data(), bytes, MPI_BYTE, all.data(), bytes, MPI_BYTE, comm_, &request);
  engine_->Complete(&request, what);
  std::vector<memory::Tensor> result;
  for (int i = 0; i < size_; ++i) {
    result.emplace_back(tensor.device(), tensor.shape(), tensor.dtype());
    result.back().CopyFromHost(all.data() + static_cast<size_t>(bytes) * i);
  }
  return result;
}

double MpiGroup::ReduceValue(double value, ReduceOp op, bool to_root, const std::string& what) {
  if (size_ == 1) return value;
  double result = 0;
  const progress::WaitScope waiting({progress::WaitKind::kCollective, what, name_});
  MPI_Request request;
  if (to_root) {
    MPI_Ireduce(&value, &result, 1, MPI_DOUBLE, MpiOp(op), 0, comm_, &request);
  } else {
    MPI_Iallreduce(&value, &result, 1, MPI_DOUBLE, MpiOp(op), comm_, &request);
  }
  engine_->Complete(&request, what);
  return result;
}

bool MpiGroup::AllOk(bool ok) {
  const progress::WaitScope waiting(
      {progress::WaitKind::kCollective, "agreement of all ranks", name_});
  int local = ok ? 1 : 0;
  int all = 0;
  MPI_Request request;
  MPI_Iallreduce(&local, &all, 1, MPI_INT, MPI_MIN, comm_, &request);
  engine_->Complete(&request, "agreement of all ranks");
  return all == 1;
}

std::vector<std::string> MpiGroup::GatherToRoot(const std::string& text) {
  const std::string what = "gathering report lines on rank 0";
  const progress::WaitScope waiting({progress::WaitKind::kCollective, what, name_});
  return GatherStringsToRoot(text, comm_,
                             [&](MPI_Request* request) { engine_->Complete(request, what); });
}

std::vector<std::vector<int>> MpiGroup::AllGatherInts(const std::vector<int>& values,
                                                      const std::string& what) {
  const progress::WaitScope waiting({progress::WaitKind::kCollective, what, name_});
  const int count = static_cast<int>(values.size());
  std::vector<int> counts(size_), offsets(size_);
  MPI_Request request;
  MPI_Iallgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, comm_, &request);
  engine_->Complete(&request, what);
  int total = 0;
  for (int i = 0; i < size_; ++i) {
    offsets[i] = total;
    total += counts[i];
  }
  std::vector<int> all(total);
  MPI_Iallgatherv(values.data(), count, MPI_INT, all.data(), counts.data(), offsets.data(), MPI_INT,
                  comm_, &request);
  engine_->Complete(&request, what);
  std::vector<std::vector<int>> result(size_);
  for (int i = 0; i < size_; ++i)
    result[i].assign(all.begin() + offsets[i], all.begin() + offsets[i] + counts[i]);
  return result;
}

// ---- The transport -----------------------------------------------------------------------------

std::unique_ptr<PipelineComm> MakeMpiPipelineComm(const Topology& topology, int world_rank,
                                                  const GroupComms& comms, double deadline_seconds,
                                                  double spin_seconds, bool stage_host_tensors,
                                                  int64_t max_message_bytes) {
  auto engine = std::make_shared<MpiEngine>(topology, world_rank, deadline_seconds, spin_seconds,
                                            stage_host_tensors);
  PipelineComm::Parts parts;
  parts.links =
      std::make_unique<MpiLinks>(engine, comms.pp, topology, world_rank, max_message_bytes);
  parts.world = std::make_unique<MpiGroup>(engine, MPI_COMM_WORLD, "world", false);
  parts.pp = std::make_unique<MpiGroup>(engine, comms.pp, "pp", false);
  parts.dp = std::make_unique<MpiGroup>(engine, comms.dp, "dp", true);
  parts.tp = std::make_unique<MpiGroup>(engine, comms.tp, "tp", false);
  parts.shared = engine;
  return std::make_unique<PipelineComm>(std::move(parts));
}

}  // namespace bigmac::comm
