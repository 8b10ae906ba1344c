#include "core/comm/mpi_pipeline_comm.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <list>
#include <stdexcept>
#include <vector>

#include "core/comm/progress.h"

namespace bigmac::comm {
namespace {

constexpr int64_t kMagic = 0x424d4143;  // "BMAC"
constexpr int kHeaderWords = 8;         // magic, dtype, ndim, 4 dims, numel
// MPI counts are ints: a payload goes out as messages of at most this many bytes (after its
// header, same tag, matched in order), so tensors of 2 GiB and more travel.
constexpr int64_t kMaxMessageBytes = int64_t{1} << 30;

// BIGMAC_TEST_MAX_MESSAGE_BYTES: a smaller limit, so tests exercise the split without 2 GiB.
int64_t MaxMessageBytes() {
  if (const char* text = std::getenv("BIGMAC_TEST_MAX_MESSAGE_BYTES")) {
    const long long value = std::atoll(text);
    if (value > 0) return value;
  }
  return kMaxMessageBytes;
}

std::string Describe(memory::DType dtype, const std::vector<int64_t>& shape) {
  return DescribeTensor(dtype, shape);
}

// Host buffers for staging, from the devices' AllocateHostStaging (pinned on CUDA, where a
// cudaHostAlloc costs far more than a message): a released buffer waits for the next message that
// fits, and at most kKeep wait (the largest are kept).
class StagingPool {
 public:
  struct Block {
    device::Device* device = nullptr;
    char* data = nullptr;
    int64_t capacity = 0;
  };
  // A block on loan; back to the pool when destroyed.
  class Buffer {
   public:
    Buffer() = default;
    Buffer(StagingPool* pool, Block block) : pool_(pool), block_(block) {}
    Buffer(Buffer&& other) noexcept : pool_(other.pool_), block_(other.block_) {
      other.pool_ = nullptr;
    }
    Buffer& operator=(Buffer&& other) noexcept {
      if (this != &other) {
        Return();
        pool_ = other.pool_;
        block_ = other.block_;
        other.pool_ = nullptr;
      }
      return *this;
    }
    ~Buffer() { Return(); }
    char* data() const { return block_.data; }

   private:
    void Return() {
      if (pool_) pool_->Release(block_);
      pool_ = nullptr;
    }
    StagingPool* pool_ = nullptr;
    Block block_;
  };

  StagingPool() = default;
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;
  ~StagingPool() {
    for (const Block& block : free_) block.device->FreeHostStaging(block.data);
  }

  Buffer Acquire(device::Device* device, int64_t bytes) {
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->device == device && it->capacity >= bytes &&
          (best == free_.end() || it->capacity < best->capacity)) {
        best = it;
      }
    }
    if (best != free_.end()) {
      const Block block = *best;
      free_.erase(best);
      return Buffer(this, block);
    }
    constexpr int64_t kGrain = int64_t{64} << 10;
    const int64_t capacity = std::max<int64_t>(kGrain, (bytes + kGrain - 1) / kGrain * kGrain);
    Block block{device, static_cast<char*>(device->AllocateHostStaging(capacity)), capacity};
    ++buffers_;
    bytes_ += capacity;
    return Buffer(this, block);
  }

  int64_t buffers() const { return buffers_; }
  int64_t bytes() const { return bytes_; }

 private:
  static constexpr size_t kKeep = 8;
  void Release(const Block& block) {
    free_.push_back(block);
    if (free_.size() <= kKeep) return;
    auto smallest =
        std::min_element(free_.begin(), free_.end(),
                         [](const Block& a, const Block& b) { return a.capacity < b.capacity; });
    smallest->device->FreeHostStaging(smallest->data);
    free_.erase(smallest);
  }

  std::vector<Block> free_;
  int64_t buffers_ = 0;
  int64_t bytes_ = 0;
};

class MpiComm : public MpiPipelineComm {
 public:
  MpiComm(const Topology& topology, int world_rank, const GroupComms& comms, double deadline,
          double spin, bool stage_host_tensors)
      : topology_(topology),
        world_rank_(world_rank),
        comms_(comms),
        deadline_(deadline),
        spin_(spin),
        stage_host_(stage_host_tensors) {
    coords_ = topology.CoordsOf(world_rank);
    // The all-reduces' second halves start when their first halves complete, which may be in a
    // different order than other collectives on comms_.dp: they get a communicator of their own
    // (collective over the dp group, as every rank constructs its transport at start-up).
    if (topology.dp_size() > 1) MPI_Comm_dup(comms_.dp, &gather_comm_);
  }
  ~MpiComm() override {
    // Only on an abnormal exit are sends still in flight: MPI may still read their buffers, so
    // they are released to MPI and deliberately leaked rather than freed under it.
    for (Pending& p : pending_) {
      for (MPI_Request& request : p.requests) {
        if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
      }
    }
    if (!pending_.empty()) new std::list<Pending>(std::move(pending_));  // nodes stay in place
    // Reductions still in flight (an abnormal exit, the job is stopping): a collective's request
    // cannot be freed, and MPI may still write their staging buffers, so those leak too.
    if (!reductions_.empty()) new std::vector<Reduction>(std::move(reductions_));
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (gather_comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&gather_comm_);
  }

  int pp_rank() const override { return coords_.pp; }
  int pp_size() const override { return topology_.pp_size(); }
  int dp_rank() const override { return coords_.dp; }
  int dp_size() const override { return topology_.dp_size(); }
  int world_rank() const override { return world_rank_; }

  void Send(memory::Tensor tensor, int peer, int tag, const std::string&) override {
    if (tensor.shape().size() > 4)
      throw TransportError("tensors of more than 4 dimensions cannot be sent");
    CountSent(tag, tensor.bytes());
    pending_.emplace_back();
    Pending& p = pending_.back();
    p.header = HeaderOf(tensor);
    p.world_peer = PeerWorldRank(peer);
    const char* data = static_cast<const char*>(tensor.raw());
    const bool stage = Staged(tensor.device());
    if (stage) {
      // Device memory goes through the host; the tensor is free as soon as it is copied.
      p.staging = staging_.Acquire(tensor.device(), tensor.bytes());
      tensor.CopyToHost(p.staging.data());
      data = p.staging.data();
    }
    p.requests.emplace_back();
    MPI_Isend(p.header.data(), static_cast<int>(sizeof(int64_t) * kHeaderWords), MPI_BYTE, peer,
              tag, comms_.pp, &p.requests.back());
    for (int64_t offset = 0; offset < tensor.bytes(); offset += max_message_bytes_) {
      const int64_t n = std::min(max_message_bytes_, tensor.bytes() - offset);
      p.requests.emplace_back();
      MPI_Isend(data + offset, static_cast<int>(n), MPI_BYTE, peer, tag, comms_.pp,
                &p.requests.back());
    }
    if (!stage) p.tensor = std::move(tensor);
    Reap();
  }

  void SendHeader(const memory::Tensor& tensor, int peer, int tag) override {
    if (tensor.shape().size() > 4)
      throw TransportError("tensors of more than 4 dimensions cannot be sent");
    pending_.emplace_back();
    Pending& p = pending_.back();
    p.header = HeaderOf(tensor);
    p.world_peer = PeerWorldRank(peer);
    p.requests.emplace_back();
    MPI_Isend(p.header.data(), static_cast<int>(sizeof(int64_t) * kHeaderWords), MPI_BYTE, peer,
              tag, comms_.pp, &p.requests.back());
    Reap();
  }

  MessageHeader ReceiveNextHeader(int peer, const std::string& what) override {
    const std::string from = what + " from pp rank " + std::to_string(peer);
    const progress::WaitScope waiting(
        {progress::WaitKind::kReceive, what, "pp", "", -1, {PeerWorldRank(peer)}});
    const MPI_Status status = Probe(peer, MPI_ANY_TAG, from);
    int bytes = 0;
    MPI_Get_count(&status, MPI_BYTE, &bytes);
    std::vector<char> buffer(std::max(bytes, 1));
    MPI_Request request;
    MPI_Irecv(buffer.data(), bytes, MPI_BYTE, peer, status.MPI_TAG, comms_.pp, &request);
    Complete(&request, from + " (receiving the matched header)");
    int64_t header[kHeaderWords] = {};
    if (bytes == static_cast<int>(sizeof(header))) std::memcpy(header, buffer.data(), bytes);
    if (bytes != static_cast<int>(sizeof(header)) || header[0] != kMagic || header[2] < 0 ||
        header[2] > 4) {
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

  void Wait(const std::string& what, const std::function<bool()>& ready) override {
    WaitUntil(what, [&] {
      if (ready()) return true;
      Reap();  // MPI progresses only inside MPI calls: the headers in flight go out meanwhile
      return false;
    });
  }

  int64_t staging_buffers() const override { return staging_.buffers(); }
  int64_t staging_bytes() const override { return staging_.bytes(); }

  memory::Tensor Receive(int peer, int tag, const std::vector<int64_t>& shape, memory::DType dtype,
                         device::Device* device, const std::string& what) override {
    const std::string from = what + " from pp rank " + std::to_string(peer);
    const progress::WaitScope waiting({progress::WaitKind::kReceive,
                                       what,
                                       "pp",
                                       Describe(dtype, shape),
                                       tag,
                                       {PeerWorldRank(peer)}});
    MPI_Status status = Probe(peer, tag, from);
    int bytes = 0;
    MPI_Get_count(&status, MPI_BYTE, &bytes);
    int64_t header[kHeaderWords] = {};
    if (bytes != static_cast<int>(sizeof(header))) {
      // Not a header: take the message off the queue and report it.
      std::vector<char> junk(std::max(bytes, 1));
      MPI_Request request;
      MPI_Irecv(junk.data(), bytes, MPI_BYTE, peer, tag, comms_.pp, &request);
      Complete(&request, from + " (receiving the matched message)");
      throw TransportError(from + ": expected " + Describe(dtype, shape) +
                           ", got a malformed message (" + std::to_string(bytes) + " bytes)");
    }
    MPI_Request request;
    MPI_Irecv(header, bytes, MPI_BYTE, peer, tag, comms_.pp, &request);
    Complete(&request, from + " (receiving the matched message)");
    std::vector<int64_t> got_shape;
    for (int i = 0; i < header[2] && i < 4; ++i) got_shape.push_back(header[3 + i]);
    const auto got_dtype = static_cast<memory::DType>(header[1]);
    int64_t numel = 1;
    for (int64_t extent : shape) numel *= extent;
    if (header[0] != kMagic || got_shape != shape || got_dtype != dtype || header[7] != numel) {
      throw TransportError(
          from + ": expected " + Describe(dtype, shape) + ", got " +
          (header[0] == kMagic ? Describe(got_dtype, got_shape) : "a malformed message") + " (" +
          std::to_string(bytes) + " bytes)");
    }
    memory::Tensor tensor(device, shape, dtype);
    StagingPool::Buffer staging;
    char* data = static_cast<char*>(tensor.raw());
    const bool stage = Staged(device);
    if (stage) {
      staging = staging_.Acquire(device, tensor.bytes());
      data = staging.data();
    }
    for (int64_t offset = 0; offset < tensor.bytes(); offset += max_message_bytes_) {
      const int64_t n = std::min(max_message_bytes_, tensor.bytes() - offset);
      MPI_Irecv(data + offset, static_cast<int>(n), MPI_BYTE, peer, tag, comms_.pp, &request);
      Complete(&request, from + " (its data)");
    }
    if (stage) {
      tensor.CopyFromHost(staging.data());
      // A copy from pinned memory may still be reading it: done before the buffer is reused.
      if (device->host_staging_pinned()) device->Synchronize();
    }
    return tensor;
  }

  void FinishSends() override {
    const std::string what = "delivery of " + std::to_string(pending_.size()) + " sent message(s)";
    const progress::WaitScope waiting(
        {progress::WaitKind::kSends, what, "pp", "", -1, PendingPeers()});
    WaitUntil(what, [&] {
      Reap();
      return pending_.empty();
    });
  }

  void AllReduceSumDp(memory::Tensor* tensor) override {
    if (!reductions_.empty())
      throw std::logic_error("AllReduceSumDp while non-blocking reductions are in flight");
    StartAllReduceSumDp(tensor, "ReduceDp: all-reduce of gradients over the data-parallel group");
    WaitAllReduces();
  }

  int StartAllReduceSumDp(memory::Tensor* tensor, const std::string& what) override {
    return StartCollective(Collective::kAllReduce, tensor, what);
  }

  int StartReduceScatterSumDp(memory::Tensor* tensor, const std::string& what) override {
    DpShardOf(tensor->numel(), topology_.dp_size(), coords_.dp);  // checks the shape
    return StartCollective(Collective::kReduceScatter, tensor, what);
  }

  int StartAllGatherDp(memory::Tensor* tensor, const std::string& what) override {
    DpShardOf(tensor->numel(), topology_.dp_size(), coords_.dp);
    return StartCollective(Collective::kAllGather, tensor, what);
  }

  bool TestAllReduce(int handle) override {
    if (handle < 0 || handle >= static_cast<int>(reductions_.size()))
      throw std::logic_error("TestAllReduce: no reduction " + std::to_string(handle) +
                             " is in flight");
    Reap();  // also progresses every outstanding collective
    // The earlier ones too: an all-reduce's second half waits for theirs to start.
    for (int i = 0; i < handle; ++i) Test(&reductions_[i]);
    return Test(&reductions_[handle]);
  }

  void Progress() override {
    Reap();
    for (Reduction& r : reductions_) Test(&r);
  }

  void WaitAllReduces() override {
    size_t first = 0;  // the first reduction not known to be complete
    auto all_done = [&] {
      Reap();
      while (first < reductions_.size() && Test(&reductions_[first])) ++first;
      return first == reductions_.size();
    };
    while (!all_done()) {
      // Waits on the first pending one (its name goes into a deadline message and the hang
      // report's wait record), then goes on.
      const size_t waiting_for = first;
      const progress::WaitScope waiting(
          {progress::WaitKind::kCollective, reductions_[waiting_for].what, "dp"});
      WaitUntil(reductions_[waiting_for].what + " (reduction " + std::to_string(waiting_for + 1) +
                    " of " + std::to_string(reductions_.size()) + " started this step)",
                [&] {
                  Reap();
                  return Test(&reductions_[waiting_for]);
                });
    }
    reductions_.clear();
    next_gather_ = 0;
  }

  double AllReduceSumPp(double value) override {
    double sum = 0;
    const progress::WaitScope waiting(
        {progress::WaitKind::kCollective,
         "OptimizerStep: all-reduce of the gradient norm over the pipeline", "pp"});
    MPI_Request request;
    MPI_Iallreduce(&value, &sum, 1, MPI_DOUBLE, MPI_SUM, comms_.pp, &request);
    Complete(&request, "OptimizerStep: all-reduce of the gradient norm over the pipeline");
    return sum;
  }

  int tp_rank() const override { return coords_.tp; }
  int tp_size() const override { return topology_.tp_size(); }

  void AllReduceTp(memory::Tensor* tensor, ReduceOp op, const std::string& what) override {
    if (topology_.tp_size() == 1) return;
    const memory::DType dtype = tensor->dtype();
    if (dtype != memory::DType::kF32 && dtype != memory::DType::kF64)
      throw TransportError(what + ": the tp all-reduce takes f32 or f64, not " +
                           memory::DTypeName(dtype));
    if (tensor->numel() > std::numeric_limits<int>::max())
      throw TransportError(what + ": more elements in one tp all-reduce than an MPI count holds");
    const auto start = std::chrono::steady_clock::now();
    const progress::WaitScope waiting({progress::WaitKind::kCollective, what, "tp"});
    std::vector<char> staging;
    void* data = tensor->raw();
    if (Staged(tensor->device())) {
      staging.resize(tensor->bytes());
      tensor->CopyToHost(staging.data());
      data = staging.data();
    }
    MPI_Request request;
    MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(tensor->numel()),
                   dtype == memory::DType::kF32 ? MPI_FLOAT : MPI_DOUBLE,
                   op == ReduceOp::kSum ? MPI_SUM : MPI_MAX, comms_.tp, &request);
    Complete(&request, what);
    if (!staging.empty()) tensor->CopyFromHost(staging.data());
    CountTpReduced(tensor->bytes(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }

  double AllReduceSumTp(double value) override {
    if (topology_.tp_size() == 1) return value;
    const std::string what = "OptimizerStep: all-reduce of the gradient norm over the tp group";
    const progress::WaitScope waiting({progress::WaitKind::kCollective, what, "tp"});
    double sum = 0;
    MPI_Request request;
    MPI_Iallreduce(&value, &sum, 1, MPI_DOUBLE, MPI_SUM, comms_.tp, &request);
    Complete(&request, what);
    return sum;
  }

  std::vector<memory::Tensor> AllGatherTp(const memory::Tensor& tensor) override {
    const int p = topology_.tp_size();
    const std::string what = "gathering tensor-parallel slices " + tensor.ShapeString();
    const progress::WaitScope waiting({progress::WaitKind::kCollective, what, "tp"});
    if (tensor.bytes() > kMaxMessageBytes)
      throw TransportError(what + ": slices of 1 GiB and more are not gathered");
    const int bytes = static_cast<int>(tensor.bytes());
    std::vector<char> local(bytes);
    tensor.CopyToHost(local.data());
    std::vector<char> all(static_cast<size_t>(bytes) * p);
    MPI_Request request;
    MPI_Iallgather(local.data(), bytes, MPI_BYTE, all.data(), bytes, MPI_BYTE, comms_.tp, &request);
    Complete(&request, what);
    std::vector<memory::Tensor> result;
    for (int i = 0; i < p; ++i) {
      result.emplace_back(tensor.device(), tensor.shape(), tensor.dtype());
      result.back().CopyFromHost(all.data() + static_cast<size_t>(bytes) * i);
    }
    return result;
  }

  double SumToRoot(double value) override {
    return ReduceToRoot(value, MPI_SUM, "the sum of losses on rank 0");
  }

  double MaxToRoot(double value) override {
    return ReduceToRoot(value, MPI_MAX, "the peak memory on rank 0");
  }

  std::vector<std::string> GatherToRoot(const std::string& text) override {
    const progress::WaitScope waiting(
        {progress::WaitKind::kCollective, "gathering report lines on rank 0", "world"});
    return GatherStringsToRoot(text, MPI_COMM_WORLD, [&](MPI_Request* request) {
      Complete(request, "gathering report lines on rank 0");
    });
  }

  bool AllOk(bool ok) override {
    const progress::WaitScope waiting(
        {progress::WaitKind::kCollective, "agreement of all ranks", "world"});
    int local = ok ? 1 : 0;
    int all = 0;
    MPI_Request request;
    MPI_Iallreduce(&local, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &request);
    Complete(&request, "agreement of all ranks");
    return all == 1;
  }

  std::vector<std::vector<int>> AllGatherPp(const std::vector<int>& values) override {
    const progress::WaitScope waiting(
        {progress::WaitKind::kCollective, "the pipeline's layer_ids (all-gather)", "pp"});
    const int p = topology_.pp_size();
    const int count = static_cast<int>(values.size());
    std::vector<int> counts(p), offsets(p);
    MPI_Request request;
    MPI_Iallgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, comms_.pp, &request);
    Complete(&request, "the pipeline's layer_ids (all-gather)");
    int total = 0;
    for (int i = 0; i < p; ++i) {
      offsets[i] = total;
      total += counts[i];
    }
    std::vector<int> all(total);
    MPI_Iallgatherv(values.data(), count, MPI_INT, all.data(), counts.data(), offsets.data(),
                    MPI_INT, comms_.pp, &request);
    Complete(&request, "the pipeline's layer_ids (all-gather)");
    std::vector<std::vector<int>> result(p);
    for (int i = 0; i < p; ++i)
      result[i].assign(all.begin() + offsets[i], all.begin() + offsets[i] + counts[i]);
    return result;
  }

 private:
  // One send in flight: its header, the tensor it owns (or its host staging copy) and the
  // requests of the header and the data messages.
  struct Pending {
    std::array<int64_t, kHeaderWords> header{};
    memory::Tensor tensor;
    StagingPool::Buffer staging;
    std::vector<MPI_Request> requests;
    int world_peer = -1;
  };

  static std::array<int64_t, kHeaderWords> HeaderOf(const memory::Tensor& tensor) {
    std::array<int64_t, kHeaderWords> header = {kMagic,
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

  // Device memory always goes through host buffers; host memory when the tests ask for it.
  bool Staged(const device::Device* device) const {
    return stage_host_ || device->backend() != device::Backend::kCpu;
  }

  // Waits (with the deadline) until a message from pp rank `peer` with `tag` (or MPI_ANY_TAG)
  // can be received.
  MPI_Status Probe(int peer, int tag, const std::string& from) {
    MPI_Status status;
    WaitUntil(from + " (world rank " + std::to_string(PeerWorldRank(peer)) + ")", [&] {
      int found = 0;
      MPI_Iprobe(peer, tag, comms_.pp, &found, &status);
      Reap();
      return found != 0;
    });
    return status;
  }

  // The dp collectives. An all-reduce is a reduce-scatter followed by an all-gather, and a
  // reduce-scatter is an all-to-all of the shards followed by a local sum in dp-rank order,
  // ((g0 + g1) + g2) + g3: the sums do not depend on MPI's choice of algorithm (which changes with
  // the message size), and the all-reduce and ZeRO-1's reduce-scatter give bitwise the same sums.
  enum class Collective { kAllReduce, kReduceScatter, kAllGather };

  // One non-blocking dp collective, in place on its tensor or on a host staging copy of it.
  struct Reduction {
    memory::Tensor* tensor = nullptr;
    std::string what;
    Collective kind = Collective::kAllReduce;
    memory::DType wide = memory::DType::kF32;
    StagingPool::Buffer staging;  // bf16 widened to f32, device memory, or a padded copy
    bool staged = false;
    std::vector<char> received;  // the all-to-all's pieces of this rank's shard, in rank order
    void* data = nullptr;        // the host buffer the collective works on
    int64_t shard = 0;           // elements per rank
    bool scattered = false;      // an all-reduce's first half is done
    std::vector<MPI_Request> requests;
    bool done = false;
  };

  int StartCollective(Collective kind, memory::Tensor* tensor, const std::string& what) {
    reductions_.emplace_back();
    Reduction& r = reductions_.back();
    r.tensor = tensor;
    r.what = what;
    r.kind = kind;
    const int dp = topology_.dp_size();
    if (dp == 1 || tensor->numel() == 0) {
      r.done = true;
      return static_cast<int>(reductions_.size()) - 1;
    }
    const memory::DType dtype = tensor->dtype();
    if (dtype != memory::DType::kF32 && dtype != memory::DType::kF64 &&
        dtype != memory::DType::kBF16) {
      throw TransportError(what + ": cannot sum " + memory::DTypeName(dtype) + " tensors");
    }
    // MPI works on f32 and f64 in host memory; bf16 is summed in f32, device memory is staged,
    // and an all-reduce of a numel that dp does not divide is padded with zeros.
    r.wide = dtype == memory::DType::kBF16 ? memory::DType::kF32 : dtype;
    const int64_t element = memory::DTypeSize(r.wide);
    const int64_t padded = (tensor->numel() + dp - 1) / dp * dp;
    r.shard = padded / dp;
    if (r.shard > std::numeric_limits<int>::max())
      throw TransportError(what + ": " + std::to_string(r.shard) +
                           " elements per rank, more than an MPI count holds");
    r.data = tensor->raw();
    if (dtype == memory::DType::kBF16 || Staged(tensor->device()) || padded != tensor->numel()) {
      // Through the staging pool (pinned on CUDA); its buffers are not zeroed: the padding is.
      memory::Tensor host_copy(tensor->device(), tensor->shape(), r.wide);
      host_copy.ConvertFrom(*tensor);
      r.staging = staging_.Acquire(tensor->device(), padded * element);
      r.staged = true;
      host_copy.CopyToHost(r.staging.data());
      std::memset(r.staging.data() + tensor->numel() * element, 0,
                  (padded - tensor->numel()) * element);
      r.data = r.staging.data();
    }
    if (kind == Collective::kAllGather) {
      StartAllGather(&r, comms_.dp);
    } else {
      r.received.resize(padded * element);
      r.requests.emplace_back();
      MPI_Ialltoall(r.data, static_cast<int>(r.shard), MpiType(r.wide), r.received.data(),
                    static_cast<int>(r.shard), MpiType(r.wide), comms_.dp, &r.requests.back());
    }
    return static_cast<int>(reductions_.size()) - 1;
  }

  static MPI_Datatype MpiType(memory::DType wide) {
    return wide == memory::DType::kF64 ? MPI_DOUBLE : MPI_FLOAT;
  }

  void StartAllGather(Reduction* r, MPI_Comm comm) {
    r->requests.assign(1, MPI_REQUEST_NULL);
    MPI_Iallgather(MPI_IN_PLACE, 0, MpiType(r->wide), r->data, static_cast<int>(r->shard),
                   MpiType(r->wide), comm, &r->requests.back());
  }

  // Starts the all-gathers of all-reduces whose reduce-scatter is done, in start order (the same
  // on every rank): none overtakes an earlier all-reduce still scattering.
  void StartSecondHalves() {
    while (next_gather_ < reductions_.size()) {
      Reduction& r = reductions_[next_gather_];
      if (r.kind == Collective::kAllReduce && !r.done) {
        if (!r.scattered) return;
        if (r.requests.empty()) StartAllGather(&r, gather_comm_);
      }
      ++next_gather_;
    }
  }

  // The pieces of this rank's shard, summed in dp-rank order into its place in the buffer.
  template <typename T>
  void SumShard(Reduction* r) {
    const T* pieces = reinterpret_cast<const T*>(r->received.data());
    T* out = static_cast<T*>(r->data) + coords_.dp * r->shard;
    std::copy(pieces, pieces + r->shard, out);
    for (int q = 1; q < topology_.dp_size(); ++q) {
      const T* piece = pieces + q * r->shard;
      for (int64_t i = 0; i < r->shard; ++i) out[i] += piece[i];
    }
    r->received = {};
  }

  // Progresses `r` without blocking; once complete, its result is in its tensor.
  bool Test(Reduction* r) {
    if (r->done) return true;
    if (r->requests.empty()) {  // a scattered all-reduce whose all-gather waits for its turn
      StartSecondHalves();
      if (r->requests.empty()) return false;
    }
    int complete = 0;
    MPI_Testall(static_cast<int>(r->requests.size()), r->requests.data(), &complete,
                MPI_STATUSES_IGNORE);
    if (!complete) return false;
    if (r->kind != Collective::kAllGather && !r->scattered) {
      if (r->wide == memory::DType::kF64) {
        SumShard<double>(r);
      } else {
        SumShard<float>(r);
      }
      r->scattered = true;
      r->requests.clear();
      if (r->kind == Collective::kAllReduce) {
        StartSecondHalves();
        return false;
      }
    }
    if (r->staged) {
      memory::Tensor wide(r->tensor->device(), r->tensor->shape(), r->wide);
      wide.CopyFromHost(r->staging.data());
      r->tensor->ConvertFrom(wide);
      // A copy from pinned memory may still be reading it: done before the buffer is reused.
      if (r->tensor->device()->host_staging_pinned()) r->tensor->device()->Synchronize();
      r->staging = {};
      r->staged = false;
    }
    r->done = true;
    return true;
  }

  int PeerWorldRank(int pp_peer) const {
    Coords peer = coords_;
    peer.pp = pp_peer;
    return topology_.RankOf(peer);
  }

  double ReduceToRoot(double value, MPI_Op op, const std::string& what) {
    double result = 0;
    const progress::WaitScope waiting({progress::WaitKind::kCollective, what, "world"});
    MPI_Request request;
    MPI_Ireduce(&value, &result, 1, MPI_DOUBLE, op, 0, MPI_COMM_WORLD, &request);
    Complete(&request, what);
    return result;
  }

  // The world ranks of the pipeline neighbours whose sends are still in flight.
  std::vector<int> PendingPeers() const {
    std::vector<int> peers;
    for (const Pending& p : pending_) {
      if (std::find(peers.begin(), peers.end(), p.world_peer) == peers.end())
        peers.push_back(p.world_peer);
    }
    return peers;
  }

  // Waits for a non-blocking collective, with the deadline.
  void Complete(MPI_Request* request, const std::string& what) {
    WaitUntil(what, [&] {
      int done = 0;
      MPI_Test(request, &done, MPI_STATUS_IGNORE);
      Reap();
      return done != 0;
    });
  }

  // Frees the buffers of delivered sends.
  void Reap() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      int done = 0;
      MPI_Testall(static_cast<int>(it->requests.size()), it->requests.data(), &done,
                  MPI_STATUSES_IGNORE);
      it = done ? pending_.erase(it) : std::next(it);
    }
  }

  // Polls `ready` until it returns true or the deadline passes. For the first `spin_` seconds it
  // yields between polls (a message due now is seen within microseconds, and a rank sharing the
  // core still gets it); then it sleeps, backing off to 200 us, so a long wait leaves the CPU to
  // the ranks it waits for. (A fixed back-off to 1 ms cost up to 1 ms per receive: bench/NOTES.md.)
  template <typename Ready>
  void WaitUntil(const std::string& what, Ready ready) {
    const auto start = std::chrono::steady_clock::now();
    // Shows in the hang report where the caller did not describe the wait.
    const progress::WaitScope waiting({progress::WaitKind::kCollective, what});
    int sleep_us = 10;
    while (!ready()) {
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited < spin_) {
        sched_yield();
        continue;
      }
      if (waited > deadline_) {
        char limit[32];
        std::snprintf(limit, sizeof(limit), "%g", deadline_);
        const std::string message =
            "pp " + std::to_string(coords_.pp) + ", dp " + std::to_string(coords_.dp) +
            ": waited " + std::to_string(static_cast<int>(waited)) + " s for " + what +
            ", past the deadline of " + limit + " s (train.comm_timeout_seconds)";
        // Before the job stops: the hang report (core/comm/hang_watch.h), if one is installed.
        throw DeadlineError(message + progress::OnDeadline(message));
      }
      usleep(sleep_us);
      sleep_us = std::min(sleep_us * 2, 200);
    }
  }

  Topology topology_;
  int world_rank_;
  GroupComms comms_;
  double deadline_;
  double spin_;
  bool stage_host_;
  Coords coords_;
  const int64_t max_message_bytes_ = MaxMessageBytes();
  StagingPool staging_;  // before pending_, whose buffers return to it
  std::list<Pending> pending_;
  std::vector<Reduction> reductions_;  // started since the last WaitAllReduces
  size_t next_gather_ = 0;             // the first all-reduce whose second half may not be started
  MPI_Comm gather_comm_ = MPI_COMM_NULL;  // the all-reduces' all-gathers
};

}  // namespace

std::unique_ptr<MpiPipelineComm> MakeMpiPipelineComm(const Topology& topology, int world_rank,
                                                     const GroupComms& comms,
                                                     double deadline_seconds, double spin_seconds,
                                                     bool stage_host_tensors) {
  return std::make_unique<MpiComm>(topology, world_rank, comms, deadline_seconds, spin_seconds,
                                   stage_host_tensors);
}

}  // namespace bigmac::comm
