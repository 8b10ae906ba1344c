#ifndef BIGMAC_CORE_COMM_MPI_WORLD_H_
#define BIGMAC_CORE_COMM_MPI_WORLD_H_

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/comm/device.h"
#include "core/comm/topology.h"
#include "core/comm/transport.h"

namespace bigmac::comm {

// MPI bootstrap for one process: MPI_Init on construction, MPI_Finalize on destruction.
class MpiWorld {
 public:
  MpiWorld(int* argc, char*** argv);
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& host() const { return host_; }

  // The rank's index among the ranks on its node, from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED).
  // Collective: call it on every rank, after the configuration is agreed.
  void DiscoverNode();
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }

  // One value per rank, gathered everywhere (collective).
  std::vector<int64_t> AllGather(int64_t value) const;
  // Every rank's string at rank 0 (collective); other ranks get an empty vector.
  std::vector<std::string> GatherToRoot(const std::string& text) const;

 private:
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  std::string host_;
};

// Every rank's `text` at rank 0 of `comm` (others get an empty vector). `complete` waits for each
// of the two non-blocking collectives, so callers choose a plain wait or one with a deadline.
std::vector<std::string> GatherStringsToRoot(const std::string& text, MPI_Comm comm,
                                             const std::function<void(MPI_Request*)>& complete);

// ChooseTransport for this rank, with the job's sharing filled into `request` (its requested
// value, backend and their sources set by the caller): how many local ranks share this rank's
// device (`placement` from ChooseDevice over `cuda_device_count` devices), and the most any GPU of
// the job carries. Collective over MPI_COMM_WORLD (call it on every rank after DiscoverNode), so
// every rank picks the same transport.
bool ChooseJobTransport(const MpiWorld& world, TransportRequest request,
                        const DevicePlacement& placement, int cuda_device_count,
                        TransportChoice* choice, std::string* error);

// One communicator per group of the topology (MPI_COMM_NULL for a middle stage's tied group).
struct GroupComms {
  MPI_Comm dp = MPI_COMM_NULL;
  MPI_Comm pp = MPI_COMM_NULL;
  MPI_Comm tp = MPI_COMM_NULL;
  MPI_Comm tied = MPI_COMM_NULL;

  // Collective over MPI_COMM_WORLD. Checks that each communicator holds exactly the ranks the
  // topology says, in that order; throws std::runtime_error if not.
  static GroupComms Create(const Topology& topology, int rank);
  void Free();
};

}  // namespace bigmac::comm

#endif  // BIGMAC_CORE_COMM_MPI_WORLD_H_
