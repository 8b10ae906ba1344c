#include "core/comm/mpi_world.h"

#include <unistd.h>

#include <algorithm>
#include <stdexcept>

namespace bigmac::comm {
namespace {

// Splits MPI_COMM_WORLD by the group `members` (every rank calls it; ranks outside any group
// pass an empty list and get MPI_COMM_NULL). Members are ordered by their position in the group.
MPI_Comm SplitByGroup(const std::vector<int>& members, int rank) {
  int color = MPI_UNDEFINED;
  int key = 0;
  if (!members.empty()) {
    color = members.front();  // the smallest rank names the group
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i] == rank) key = static_cast<int>(i);
    }
  }
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm);
  return comm;
}

void CheckMembers(MPI_Comm comm, const std::vector<int>& expected, const char* name) {
  if (comm == MPI_COMM_NULL) {
    if (!expected.empty()) throw std::runtime_error(std::string(name) + " communicator missing");
    return;
  }
  int size = 0;
  MPI_Comm_size(comm, &size);
  MPI_Group group;
  MPI_Group world_group;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  std::vector<int> local(size), world(size);
  for (int i = 0; i < size; ++i) local[i] = i;
  MPI_Group_translate_ranks(group, size, local.data(), world_group, world.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  if (world != expected)
    throw std::runtime_error(std::string(name) + " communicator has the wrong ranks");
}

}  // namespace

MpiWorld::MpiWorld(int* argc, char*** argv) {
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  char name[MPI_MAX_PROCESSOR_NAME];
  int length = 0;
  MPI_Get_processor_name(name, &length);
  host_.assign(name, length);
}

MpiWorld::~MpiWorld() { MPI_Finalize(); }

void MpiWorld::DiscoverNode() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local_rank_);
  MPI_Comm_size(node, &local_size_);
  MPI_Comm_free(&node);
}

std::vector<int64_t> MpiWorld::AllGather(int64_t value) const {
  std::vector<int64_t> values(size_);
  MPI_Allgather(&value, 1, MPI_INT64_T, values.data(), 1, MPI_INT64_T, MPI_COMM_WORLD);
  return values;
}

std::vector<std::string> MpiWorld::GatherToRoot(const std::string& text) const {
  return GatherStringsToRoot(text, MPI_COMM_WORLD,
                             [](MPI_Request* request) { MPI_Wait(request, MPI_STATUS_IGNORE); });
}

std::vector<std::string> GatherStringsToRoot(const std::string& text, MPI_Comm comm,
                                             const std::function<void(MPI_Request*)>& complete) {
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const int length = static_cast<int>(text.size());
  std::vector<int> lengths(rank == 0 ? size : 0);
  MPI_Request request;
  MPI_Igather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, comm, &request);
  complete(&request);
  std::vector<int> offsets(lengths.size());
  int total = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    offsets[i] = total;
    total += lengths[i];
  }
  std::string all(total, '\0');
  MPI_Igatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR,
               0, comm, &request);
  complete(&request);
  std::vector<std::string> texts;
  for (size_t i = 0; i < lengths.size(); ++i) texts.push_back(all.substr(offsets[i], lengths[i]));
  return texts;
}

bool ChooseJobTransport(const MpiWorld& world, TransportRequest request,
                        const DevicePlacement& placement, int cuda_device_count,
                        TransportChoice* choice, std::string* error) {
  request.backend = placement.backend;
  request.ranks_on_device =
      placement.backend == device::Backend::kCuda
          ? RanksOnDevice(world.local_rank(), world.local_size(), cuda_device_count)
          : 1;
  request.max_ranks_on_device = 1;
  for (int64_t n : world.AllGather(request.ranks_on_device))
    request.max_ranks_on_device = std::max<int>(request.max_ranks_on_device, n);
  request.device = device::BackendName(placement.backend) + ":" + std::to_string(placement.index);
  return ChooseTransport(request, choice, error);
}

GroupComms GroupComms::Create(const Topology& topology, int rank) {
  GroupComms comms;
  comms.dp = SplitByGroup(topology.DpGroup(rank), rank);
  comms.pp = SplitByGroup(topology.PpGroup(rank), rank);
  comms.tp = SplitByGroup(topology.TpGroup(rank), rank);
  comms.tied = SplitByGroup(topology.TiedGroup(rank), rank);
  CheckMembers(comms.dp, topology.DpGroup(rank), "dp");
  CheckMembers(comms.pp, topology.PpGroup(rank), "pp");
  CheckMembers(comms.tp, topology.TpGroup(rank), "tp");
  CheckMembers(comms.tied, topology.TiedGroup(rank), "tied");
  return comms;
}

void GroupComms::Free() {
  for (MPI_Comm* comm : {&dp, &pp, &tp, &tied}) {
    if (*comm != MPI_COMM_NULL) MPI_Comm_free(comm);
  }
}

}  // namespace bigmac::comm
