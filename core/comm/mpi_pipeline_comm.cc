#include "core/comm/mpi_pipeline_comm.h"

#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <list>

namespace bigmac::comm {
namespace {

constexpr int64_t kMagic = 0x424d4143;  // "BMAC"
constexpr int kHeaderWords = 8;         // magic, dtype, ndim, 4 dims, numel
constexpr int64_t kDpBucketFloats = int64_t{1} << 20;

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
      MPI_Request_free(&p.request);
      new std::vector<char>(std::move(p.buffer));
    }
  }

  int pp_rank() const override { return coords_.pp; }
  int pp_size() const override { return topology_.pp_size(); }
  int dp_rank() const override { return coords_.dp; }
  int dp_size() const override { return topology_.dp_size(); }
  int world_rank() const override { return world_rank_; }

  void Send(const memory::Tensor& tensor, int peer, int tag, const std::string&) override {
    if (tensor.shape().size() > 4)
      throw TransportError("tensors of more than 4 dimensions cannot be sent");
    Pending pending;
    pending.buffer.resize(kHeaderWords * sizeof(int64_t) + tensor.bytes());
    int64_t header[kHeaderWords] = {kMagic,
                                    static_cast<int64_t>(tensor.dtype()),
                                    static_cast<int64_t>(tensor.shape().size()),
                                    0,
                                    0,
                                    0,
                                    0,
                                    tensor.numel()};
    for (size_t i = 0; i < tensor.shape().size(); ++i) header[3 + i] = tensor.shape()[i];
    std::memcpy(pending.buffer.data(), header, sizeof(header));
    const void* data =
        tensor.dtype() == memory::DType::kF64   ? static_cast<const void*>(tensor.data<double>())
        : tensor.dtype() == memory::DType::kI32 ? static_cast<const void*>(tensor.data<int32_t>())
                                                : static_cast<const void*>(tensor.data<float>());
    std::memcpy(pending.buffer.data() + sizeof(header), data, tensor.bytes());
    pending_.push_back(std::move(pending));
    Pending& p = pending_.back();
    MPI_Isend(p.buffer.data(), static_cast<int>(p.buffer.size()), MPI_BYTE, peer, tag, comms_.pp,
              &p.request);
    Reap();
  }

  memory::Tensor Receive(int peer, int tag, const std::vector<int64_t>& shape, memory::DType dtype,
                         memory::DeviceAllocator* allocator, const std::string& what) override {
    MPI_Status status;
    Wait(what + " from pp rank " + std::to_string(peer) + " (world rank " +
             std::to_string(PeerWorldRank(peer)) + ")",
         [&] {
           int found = 0;
           MPI_Iprobe(peer, tag, comms_.pp, &found, &status);
           Reap();
           return found != 0;
         });
    int bytes = 0;
    MPI_Get_count(&status, MPI_BYTE, &bytes);
    std::vector<char> buffer(bytes);
    MPI_Request request;
    MPI_Irecv(buffer.data(), bytes, MPI_BYTE, peer, tag, comms_.pp, &request);
    Complete(&request,
             what + " from pp rank " + std::to_string(peer) + " (receiving the matched message)");
    int64_t header[kHeaderWords] = {};
    if (bytes >= static_cast<int>(sizeof(header)))
      std::memcpy(header, buffer.data(), sizeof(header));
    std::vector<int64_t> got_shape;
    for (int i = 0; i < header[2] && i < 4; ++i) got_shape.push_back(header[3 + i]);
    const auto got_dtype = static_cast<memory::DType>(header[1]);
    if (header[0] != kMagic || got_shape != shape || got_dtype != dtype ||
        bytes != static_cast<int>(sizeof(header) + header[7] * memory::DTypeSize(dtype))) {
      throw TransportError(
          what + " from pp rank " + std::to_string(peer) + ": expected " + Describe(dtype, shape) +
          ", got " +
          (header[0] == kMagic ? Describe(got_dtype, got_shape) : "a malformed message") + " (" +
          std::to_string(bytes) + " bytes)");
    }
    memory::Tensor tensor(allocator, shape, dtype);
    void* data = dtype == memory::DType::kF64   ? static_cast<void*>(tensor.data<double>())
                 : dtype == memory::DType::kI32 ? static_cast<void*>(tensor.data<int32_t>())
                                                : static_cast<void*>(tensor.data<float>());
    std::memcpy(data, buffer.data() + sizeof(header), tensor.bytes());
    return tensor;
  }

  void FinishSends() override {
    Wait("delivery of " + std::to_string(pending_.size()) + " sent message(s)", [&] {
      Reap();
      return pending_.empty();
    });
  }

  void AllReduceSumDp(float* data, int64_t count) override {
    if (topology_.dp_size() == 1) return;
    for (int64_t offset = 0; offset < count; offset += kDpBucketFloats) {
      const int n = static_cast<int>(std::min(kDpBucketFloats, count - offset));
      MPI_Request request;
      MPI_Iallreduce(MPI_IN_PLACE, data + offset, n, MPI_FLOAT, MPI_SUM, comms_.dp, &request);
      Complete(&request, "ReduceDp: all-reduce of gradients over the data-parallel group");
    }
  }

  double AllReduceSumPp(double value) override {
    double sum = 0;
    MPI_Request request;
    MPI_Iallreduce(&value, &sum, 1, MPI_DOUBLE, MPI_SUM, comms_.pp, &request);
    Complete(&request, "OptimizerStep: all-reduce of the gradient norm over the pipeline");
    return sum;
  }

  double SumToRoot(double value) override {
    return ReduceToRoot(value, MPI_SUM, "the sum of losses on rank 0");
  }

  double MaxToRoot(double value) override {
    return ReduceToRoot(value, MPI_MAX, "the peak memory on rank 0");
  }

  std::vector<std::string> GatherToRoot(const std::string& text) override {
    return GatherStringsToRoot(text, MPI_COMM_WORLD, [&](MPI_Request* request) {
      Complete(request, "gathering report lines on rank 0");
    });
  }

  bool AllOk(bool ok) override {
    int local = ok ? 1 : 0;
    int all = 0;
    MPI_Request request;
    MPI_Iallreduce(&local, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &request);
    Complete(&request, "agreement of all ranks");
    return all == 1;
  }

  std::vector<std::vector<int>> AllGatherPp(const std::vector<int>& values) override {
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
  struct Pending {
    std::vector<char> buffer;
    MPI_Request request = MPI_REQUEST_NULL;
  };

  int PeerWorldRank(int pp_peer) const {
    Coords peer = coords_;
    peer.pp = pp_peer;
    return topology_.RankOf(peer);
  }

  double ReduceToRoot(double value, MPI_Op op, const std::string& what) {
    double result = 0;
    MPI_Request request;
    MPI_Ireduce(&value, &result, 1, MPI_DOUBLE, op, 0, MPI_COMM_WORLD, &request);
    Complete(&request, what);
    return result;
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
      MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
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
        throw DeadlineError("pp " + std::to_string(coords_.pp) + ", dp " +
                            std::to_string(coords_.dp) + ": waited " +
                            std::to_string(static_cast<int>(waited)) + " s for " + what +
                            ", past the deadline of " + limit + " s (train.comm_timeout_seconds)");
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
  std::list<Pending> pending_;
};

}  // namespace

std::unique_ptr<PipelineComm> MakeMpiPipelineComm(const Topology& topology, int world_rank,
                                                  const GroupComms& comms, double deadline_seconds,
                                                  double spin_seconds) {
  return std::make_unique<MpiPipelineComm>(topology, world_rank, comms, deadline_seconds,
                                           spin_seconds);
}

}  // namespace bigmac::comm
