#include "core/comm/mpi_pipeline_comm.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <stdexcept>
#include <vector>

#include "core/comm/progress.h"

namespace bigmac::comm {
namespace {

constexpr int64_t kMagic = 0x424d4143;  // "BMAC"
constexpr int kHeaderWords = 8;         // magic, dtype, ndim, 4 dims, numel
// The most elements one MPI_Iallreduce sums (its count is an int).
constexpr int64_t kMaxReduceCount = int64_t{1} << 30;
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
  std::string text = memory::DTypeName(dtype) + "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

class MpiPipelineComm : public PipelineComm {
 public:
  MpiPipelineComm(const Topology& topology, int world_rank, const GroupComms& comms,
                  double deadline, double spin)
      : topology_(topology),
        world_rank_(world_rank),
        comms_(comms),
        deadline_(deadline),
        spin_(spin) {
    coords_ = topology.CoordsOf(world_rank);
  }
  ~MpiPipelineComm() override {
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
    p.world_peer = PeerWorldRank(peer);
    p.header = {kMagic,
                static_cast<int64_t>(tensor.dtype()),
                static_cast<int64_t>(tensor.shape().size()),
                0,
                0,
                0,
                0,
                tensor.numel()};
    for (size_t i = 0; i < tensor.shape().size(); ++i) p.header[3 + i] = tensor.shape()[i];
    const char* data = static_cast<const char*>(tensor.raw());
    if (tensor.device()->backend() != device::Backend::kCpu) {
      // Device memory goes through the host.
      p.staging.resize(tensor.bytes());
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
    p.tensor = std::move(tensor);
    Reap();
  }

  memory::Tensor Receive(int peer, int tag, const std::vector<int64_t>& shape, memory::DType dtype,
                         device::Device* device, const std::string& what) override {
    const std::string from = what + " from pp rank " + std::to_string(peer);
    const progress::WaitScope waiting({progress::WaitKind::kReceive,
                                       what,
                                       "pp",
                                       Describe(dtype, shape),
                                       tag,
                                       {PeerWorldRank(peer)}});
    MPI_Status status;
    Wait(from + " (world rank " + std::to_string(PeerWorldRank(peer)) + ")", [&] {
      int found = 0;
      MPI_Iprobe(peer, tag, comms_.pp, &found, &status);
      Reap();
      return found != 0;
    });
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
    std::vector<char> staging;
    char* data = static_cast<char*>(tensor.raw());
    if (device->backend() != device::Backend::kCpu) {
      staging.resize(tensor.bytes());
      data = staging.data();
    }
    for (int64_t offset = 0; offset < tensor.bytes(); offset += max_message_bytes_) {
      const int64_t n = std::min(max_message_bytes_, tensor.bytes() - offset);
      MPI_Irecv(data + offset, static_cast<int>(n), MPI_BYTE, peer, tag, comms_.pp, &request);
      Complete(&request, from + " (its data)");
    }
    if (!staging.empty()) tensor.CopyFromHost(staging.data());
    return tensor;
  }

  void FinishSends() override {
    const std::string what = "delivery of " + std::to_string(pending_.size()) + " sent message(s)";
    const progress::WaitScope waiting(
        {progress::WaitKind::kSends, what, "pp", "", -1, PendingPeers()});
    Wait(what, [&] {
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
    reductions_.emplace_back();
    Reduction& r = reductions_.back();
    r.tensor = tensor;
    r.what = what;
    if (topology_.dp_size() == 1 || tensor->numel() == 0) {
      r.done = true;
      return static_cast<int>(reductions_.size()) - 1;
    }
    const memory::DType dtype = tensor->dtype();
    if (dtype != memory::DType::kF32 && dtype != memory::DType::kF64 &&
        dtype != memory::DType::kBF16) {
      throw TransportError(what + ": cannot sum " + memory::DTypeName(dtype) + " tensors");
    }
    // MPI sums f32 and f64 in host memory; bf16 is summed in f32, device memory is staged.
    r.wide = dtype == memory::DType::kBF16 ? memory::DType::kF32 : dtype;
    void* data = tensor->raw();
    if (dtype == memory::DType::kBF16 || tensor->device()->backend() != device::Backend::kCpu) {
      memory::Tensor host_copy(tensor->device(), tensor->shape(), r.wide);
      host_copy.ConvertFrom(*tensor);
      r.staging.resize(host_copy.bytes());
      host_copy.CopyToHost(r.staging.data());
      data = r.staging.data();
    }
    const bool f64 = r.wide == memory::DType::kF64;
    const int64_t element = f64 ? 8 : 4;
    const int64_t count = tensor->numel();
    // MPI counts are ints: one reduction per kMaxReduceCount elements (in practice one per bucket).
    for (int64_t offset = 0; offset < count; offset += kMaxReduceCount) {
      r.requests.emplace_back();
      MPI_Iallreduce(MPI_IN_PLACE, static_cast<char*>(data) + offset * element,
                     static_cast<int>(std::min(kMaxReduceCount, count - offset)),
                     f64 ? MPI_DOUBLE : MPI_FLOAT, MPI_SUM, comms_.dp, &r.requests.back());
    }
    return static_cast<int>(reductions_.size()) - 1;
  }

  bool TestAllReduce(int handle) override {
    if (handle < 0 || handle >= static_cast<int>(reductions_.size()))
      throw std::logic_error("TestAllReduce: no reduction " + std::to_string(handle) +
                             " is in flight");
    Reap();  // also progresses every outstanding collective
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
      Wait(reductions_[waiting_for].what + " (reduction " + std::to_string(waiting_for + 1) +
               " of " + std::to_string(reductions_.size()) + " started this step)",
           [&] {
             Reap();
             return Test(&reductions_[waiting_for]);
           });
    }
    reductions_.clear();
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
    if (tensor->numel() > kMaxReduceCount)
      throw TransportError(what + ": more than 2^30 elements in one tp all-reduce");
    const auto start = std::chrono::steady_clock::now();
    const progress::WaitScope waiting({progress::WaitKind::kCollective, what, "tp"});
    std::vector<char> staging;
    void* data = tensor->raw();
    if (tensor->device()->backend() != device::Backend::kCpu) {
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
    std::vector<char> staging;
    std::vector<MPI_Request> requests;
    int world_peer = -1;
  };

  // One non-blocking dp reduction: the tensor summed in place, or its host staging copy.
  struct Reduction {
    memory::Tensor* tensor = nullptr;
    std::string what;
    memory::DType wide = memory::DType::kF32;
    std::vector<char> staging;  // bf16 widened to f32, or device memory: copied back when done
    std::vector<MPI_Request> requests;
    bool done = false;
  };

  // Progresses `r` without blocking; once complete, its result is in its tensor.
  bool Test(Reduction* r) {
    if (r->done) return true;
    int complete = 0;
    MPI_Testall(static_cast<int>(r->requests.size()), r->requests.data(), &complete,
                MPI_STATUSES_IGNORE);
    if (!complete) return false;
    if (!r->staging.empty()) {
      memory::Tensor wide(r->tensor->device(), r->tensor->shape(), r->wide);
      wide.CopyFromHost(r->staging.data());
      r->tensor->ConvertFrom(wide);
      r->staging = {};
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
    Wait(what, [&] {
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
  void Wait(const std::string& what, Ready ready) {
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
  Coords coords_;
  const int64_t max_message_bytes_ = MaxMessageBytes();
  std::list<Pending> pending_;
  std::vector<Reduction> reductions_;  // started since the last WaitAllReduces
};

}  // namespace

std::unique_ptr<PipelineComm> MakeMpiPipelineComm(const Topology& topology, int world_rank,
                                                  const GroupComms& comms, double deadline_seconds,
                                                  double spin_seconds) {
  return std::make_unique<MpiPipelineComm>(topology, world_rank, comms, deadline_seconds,
                                           spin_seconds);
}

}  // namespace bigmac::comm
