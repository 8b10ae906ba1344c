#include "core/checkpoint/saver.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>

#include "core/checkpoint/crc32.h"
#include "core/checkpoint/internal.h"
#include "core/checkpoint/tp_slices.h"
#include "google/protobuf/text_format.h"

namespace bigmac::checkpoint {
namespace fs = std::filesystem;
using internal::kKinds;
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void FsyncPath(const std::string& path, bool directory) {
  const int fd = open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw CheckpointError(path + ": cannot open to fsync: " + std::strerror(errno));
  const int rc = fsync(fd);
  close(fd);
  if (rc != 0) throw CheckpointError(path + ": fsync failed: " + std::strerror(errno));
}

// Writes `data` to `path` and fsyncs it (the manifest and `latest`). Throws on any short write.
void WriteFileSynced(const std::string& path, const std::string& data) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw CheckpointError(path + ": cannot create: " + std::strerror(errno));
  for (size_t written = 0; written < data.size();) {
    const ssize_t n = write(fd, data.data() + written, data.size() - written);
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      close(fd);
      throw CheckpointError(path + ": write failed after " + std::to_string(written) + " of " +
                            std::to_string(data.size()) + " bytes: " + why);
    }
    written += static_cast<size_t>(n);
  }
  const int rc = fsync(fd);
  close(fd);
  if (rc != 0) throw CheckpointError(path + ": fsync failed: " + std::strerror(errno));
}

// Which replica writes layer `layer_id`'s file: replica layer_id mod dp.
bool WritesLayer(int layer_id, const comm::Group& dp) {
  const int replicas = dp.size();
  return ((layer_id % replicas) + replicas) % replicas == dp.rank();
}

// One layer file this rank has a part in, and how it is written.
struct LayerFilePlan {
  int layer_id = 0;
  std::string file;
  std::vector<const layer::Param*> owned;  // a tied copy is stored once, by its owner
  std::vector<layer::TpShard> shards;
  bool writer = false;    // this replica writes the file's values (and its entries)
  bool gathered = false;  // tensor parallel: full tensors gathered from the tp slices
};

// The layer files of this rank's layers that it takes part in: replica layer_id mod dp writes
// each; under tensor parallelism every tp rank of that replica gathers and its tp rank 0 writes
// (ZeRO-1 is refused with tp > 1 at start-up); under ZeRO-1 (AdamW slice state) every replica
// writes its slices of the moments into that one file too.
std::vector<LayerFilePlan> PlanLayerFiles(const ModelState& state, const optim::AdamW& adamw,
                                          const comm::PipelineComm& comm) {
  std::vector<LayerFilePlan> plans;
  for (const LayerParams& layer : state.layers) {
    LayerFilePlan plan;
    plan.layer_id = layer.layer_id;
    plan.file = LayerFileName(layer.layer_id, state.num_layers);
    for (size_t i = 0; i < layer.params.size(); ++i) {
      if (layer.params[i]->tied_copy) continue;
      plan.owned.push_back(layer.params[i]);
      plan.shards.push_back(layer.shards.empty() ? layer::TpShard{} : layer.shards[i]);
    }
    if (plan.owned.empty()) continue;
    plan.writer = WritesLayer(layer.layer_id, comm.dp());
    plan.gathered = comm.tp().size() > 1;
    const bool slices = std::any_of(plan.owned.begin(), plan.owned.end(),
                                    [&](const layer::Param* p) { return adamw.HasSliceState(p); });
    if (plan.writer || (slices && !plan.gathered)) plans.push_back(std::move(plan));
  }
  return plans;
}

// The tensor entries of a layer file: value, exp_avg and exp_avg_sq of each parameter, packed
// in that order from offset 0, each of the full shape `shapes[p]`. Their CRCs are set at the
// commit, from the pieces.
std::vector<TensorEntry> LayerEntries(const LayerFilePlan& plan, const ModelState& state,
                                      const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<TensorEntry> entries;
  int64_t offset = 0;
  for (size_t p = 0; p < plan.owned.size(); ++p) {
    const int64_t bytes = internal::F32Bytes(shapes[p]);
    for (const char* kind : kKinds) {
      TensorEntry& entry = entries.emplace_back();
      entry.set_name(ParamName(state, plan.layer_id, *plan.owned[p]) + "#" + kind);
      entry.set_layer_id(plan.layer_id);
      entry.set_file(plan.file);
      entry.set_offset(offset);
      entry.set_bytes(bytes);
      for (int64_t extent : shapes[p]) entry.add_shape(extent);
      entry.set_dtype(kMasterDType);
      offset += bytes;
    }
  }
  return entries;
}

// A run of one tensor's bytes that this rank writes: `source` (null: zeros, a moment before the
// first step) goes to `buffer_offset` in the snapshot, then to `file_offset` in the file.
struct Piece {
  const memory::Tensor* source = nullptr;
  std::string entry;
  int64_t entry_offset = 0;
  int64_t file_offset = 0;
  int64_t bytes = 0;
  int64_t buffer_offset = 0;
  // Which tensor: the layer file's plan, the parameter in it, value (0) or moment (1, 2).
  int plan = 0;
  int param = 0;
  int kind = 0;
};

// The pieces of one file this rank writes, and the file's size.
struct FileJob {
  std::string file;
  int64_t file_bytes = 0;
  std::vector<Piece> pieces;
  // This rank writes the whole file, its pieces back to back from `buffer_begin` (aligned to
  // kDirectIoAlign, the region padded to it): one stream of large O_DIRECT writes.
  bool whole = false;
  int64_t buffer_begin = 0;
};

using internal::kDirectIoAlign;
using internal::kDirectIoChunk;

int64_t AlignUp(int64_t bytes) {
  return (bytes + kDirectIoAlign - 1) / kDirectIoAlign * kDirectIoAlign;
}

// The host buffer the snapshot is copied into, kept from save to save: from the device's staging
// memory (pinned on CUDA), so a device-to-host copy runs at the bus's speed.
class SnapshotBuffer {
 public:
  SnapshotBuffer() = default;
  ~SnapshotBuffer() { Release(); }
  SnapshotBuffer(const SnapshotBuffer&) = delete;
  SnapshotBuffer& operator=(const SnapshotBuffer&) = delete;

  // `bytes` from a kDirectIoAlign boundary.
  char* Reserve(device::Device* device, int64_t bytes) {
    if (bytes > bytes_ || device != device_) {
      Release();
      device_ = device;
      allocation_ = static_cast<char*>(device->AllocateHostStaging(bytes + kDirectIoAlign));
      data_ = allocation_ +
              (kDirectIoAlign - reinterpret_cast<uintptr_t>(allocation_) % kDirectIoAlign) %
                  kDirectIoAlign;
      bytes_ = bytes;
    }
    return data_;
  }
  const char* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  void Release() {
    if (allocation_) device_->FreeHostStaging(allocation_);
    allocation_ = data_ = nullptr;
    bytes_ = 0;
  }
  device::Device* device_ = nullptr;
  char* allocation_ = nullptr;
  char* data_ = nullptr;
  int64_t bytes_ = 0;
};

// What the background write reports: the pieces' CRCs, or the error.
struct WriteResult {
  std::vector<TensorPiece> pieces;
  int64_t bytes = 0;
  double seconds = 0;
  std::string error;
};

// What a file write does under a reliability test's fault plan: dies half-way (crash), fails
// half-way as on a full disk (fail); `slow_ms` before each fsync.
struct WriteFaults {
  bool crash = false;
  bool fail = false;
  int64_t slow_ms = 0;
};

// Writes `bytes` from `data` at `offset` of `fd` in chunks of kDirectIoChunk bytes. `share` and
// `*written` count this file's bytes for the fault plan, whose half-way point is rounded to
// kDirectIoAlign. Returns "" or the error (errno in `*error_number`).
std::string WriteRange(int fd, const char* data, int64_t bytes, int64_t offset, int64_t share,
                       const WriteFaults& faults, int64_t* written, int* error_number) {
  const int64_t half = std::max<int64_t>(1, share / 2 / kDirectIoAlign * kDirectIoAlign);
  for (int64_t done = 0; done < bytes;) {
    int64_t size = std::min(kDirectIoChunk, bytes - done);
    if (faults.crash || faults.fail) {
      if (faults.fail && *written >= half) return "No space left on device (injected)";
      if (*written < half) size = std::min(size, half - *written);
    }
    const ssize_t n =
        pwrite(fd, data + done, static_cast<size_t>(size), static_cast<off_t>(offset + done));
    if (n <= 0) {
      *error_number = n < 0 ? errno : ENOSPC;
      return std::strerror(*error_number);
    }
    done += n;
    *written += n;
    if (faults.crash && *written >= half) _exit(9);
  }
  return "";
}

// Writes every job's pieces from `buffer` into `dir` and fsyncs each file. Touches nothing but the
// buffer and the files. A file this rank writes whole goes out in large O_DIRECT writes from the
// aligned snapshot (no page-cache copy; bench/NOTES.md), then is cut to its size; where the
// filesystem refuses O_DIRECT, and for the pieces of a shared (ZeRO-1) file, buffered pwrite.
// The first file only dies half-way under `faults.crash`.
WriteResult WriteJobs(const std::vector<FileJob>& jobs, const char* buffer, const std::string& dir,
                      WriteFaults faults) {
  const auto start = Clock::now();
  WriteResult result;
  for (const FileJob& job : jobs) {
    const std::string path = dir + "/" + job.file;
    int64_t share = 0;
    for (const Piece& piece : job.pieces) share += piece.bytes;
    int64_t written = 0;
    int error_number = 0;
    std::string failure;
    int fd = -1;
    bool direct = false;
    if (job.whole) {
      fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
      direct = fd >= 0;
      if (direct) {
        failure = WriteRange(fd, buffer + job.buffer_begin, AlignUp(job.file_bytes), 0, share,
                             faults, &written, &error_number);
        if (!failure.empty() && error_number == EINVAL && written == 0) {
          close(fd);  // O_DIRECT opened but refused: write through the page cache instead
          fd = -1;
          direct = false;
          failure.clear();
        }
      }
    }
    if (fd < 0) {
      // Replicas may write pieces of one file: no O_TRUNC, each sizes it the same.
      fd = open(path.c_str(), O_WRONLY | O_CREAT, 0644);
      if (fd < 0) {
        result.error = path + ": cannot create: " + std::strerror(errno);
        break;
      }
    }
    if (!direct && ftruncate(fd, static_cast<off_t>(job.file_bytes)) != 0) {
      result.error = path + ": cannot size it to " + std::to_string(job.file_bytes) +
                     " bytes: " + std::strerror(errno);
    }
    for (size_t i = 0; !direct && result.error.empty() && failure.empty() && i < job.pieces.size();
         ++i) {
      const Piece& piece = job.pieces[i];
      failure = WriteRange(fd, buffer + piece.buffer_offset, piece.bytes, piece.file_offset, share,
                           faults, &written, &error_number);
    }
    // O_DIRECT wrote whole blocks: the file is cut to its size.
    if (direct && failure.empty() && ftruncate(fd, static_cast<off_t>(job.file_bytes)) != 0) {
      result.error = path + ": cannot size it to " + std::to_string(job.file_bytes) +
                     " bytes: " + std::strerror(errno);
    }
    if (!failure.empty()) {
      result.error = path + ": write failed after " + std::to_string(std::min(written, share)) +
                     " of " + std::to_string(share) + " bytes: " + failure;
    }
    if (result.error.empty()) {
      for (const Piece& piece : job.pieces) {
        TensorPiece& reported = result.pieces.emplace_back();
        reported.set_entry(piece.entry);
        reported.set_offset(piece.entry_offset);
        reported.set_bytes(piece.bytes);
        reported.set_crc32(Crc32(buffer + piece.buffer_offset, static_cast<size_t>(piece.bytes)));
      }
    }
    if (faults.slow_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(faults.slow_ms));
    if (result.error.empty() && fsync(fd) != 0)
      result.error = path + ": fsync failed: " + std::strerror(errno);
    close(fd);
    result.bytes += std::min(written, share);
    faults.crash = false;  // only the first file dies half-way
    if (!result.error.empty()) break;
  }
  result.seconds = SecondsSince(start);
  return result;
}

// `parts` (pieces of a tensor, or tensors of a file: anything with offset, bytes and crc32) must
// cover [0, bytes) of `what` exactly; returns their combined CRC-32. Throws CheckpointError.
template <typename Part>
uint32_t CombineTiling(const std::string& what, std::vector<Part*> parts, int64_t bytes) {
  std::sort(parts.begin(), parts.end(),
            [](const Part* a, const Part* b) { return a->offset() < b->offset(); });
  uint32_t crc = 0;
  int64_t covered = 0;
  for (const Part* part : parts) {
    if (part->offset() != covered) {
      throw CheckpointError(what + ": bytes " + std::to_string(covered) + " to " +
                            std::to_string(part->offset()) + " were written by no rank, or twice");
    }
    crc = Crc32Combine(crc, part->crc32(), static_cast<size_t>(part->bytes()));
    covered += part->bytes();
  }
  if (covered != bytes) {
    throw CheckpointError(what + ": " + std::to_string(covered) + " of " + std::to_string(bytes) +
                          " bytes written");
  }
  return crc;
}

// Rank 0: every entry's CRC-32 from the pieces the ranks wrote, which must tile it, and every
// file's from its entries, which must tile the file. Throws CheckpointError.
void SetCrcsFromPieces(const std::vector<TensorPiece>& pieces, Manifest* manifest) {
  std::map<std::string, std::vector<const TensorPiece*>> by_entry;
  for (const TensorPiece& piece : pieces) by_entry[piece.entry()].push_back(&piece);
  std::map<std::string, std::vector<const TensorEntry*>> by_file;
  for (TensorEntry& entry : *manifest->mutable_tensors()) {
    entry.set_crc32(CombineTiling("tensor " + entry.name(), by_entry[entry.name()], entry.bytes()));
    by_file[entry.file()].push_back(&entry);
  }
  for (LayerFile& file : *manifest->mutable_files())
    file.set_crc32(CombineTiling(file.file(), by_file[file.file()], file.bytes()));
}

// Every rank's report gathered on rank 0 and merged there into the manifest, CRCs set; throws
// the first rank's error. Collective over the world.
Manifest GatherReports(comm::Group& world, int64_t step, SaveReport report) {
  report.set_rank(world.rank());
  const std::vector<std::string> reports = world.GatherToRoot(report.SerializeAsString());
  Manifest manifest;
  std::vector<TensorPiece> pieces;
  for (size_t rank = 0; rank < reports.size(); ++rank) {
    SaveReport part;
    if (!part.ParseFromString(reports[rank])) {
      throw CheckpointError("checkpoint step " + std::to_string(step) + ": rank " +
                            std::to_string(rank) + " sent an unreadable save report");
    }
    if (part.has_error()) throw CheckpointError(part.error());
    manifest.MergeFrom(part.fragment());
    pieces.insert(pieces.end(), part.pieces().begin(), part.pieces().end());
  }
  if (world.rank() == 0) SetCrcsFromPieces(pieces, &manifest);
  return manifest;
}

// Rank 0: the manifest completed and written into the temporary directory, which is then
// renamed into place and named by `latest`. A checkpoint of the same step from an abandoned run
// is moved aside, not deleted, until the new one is in place and `latest` names it.
void CommitManifest(const SaveRequest& request, const std::string& tmp_dir, Manifest manifest) {
  const config::ResolvedConfig& config = *request.config;
  const std::string& root = request.root;
  const int64_t step = request.step;
  manifest.set_format_version(kFormatVersion);
  manifest.set_step(step);
  manifest.set_next_step(step);
  *manifest.mutable_config() = config.values();
  manifest.set_pp(config.pp);
  manifest.set_dp(config.dp);
  for (int count : config.partition.LayersPerStage()) manifest.add_layers_per_stage(count);
  manifest.set_partition_policy(partition::PolicyName(config.policy));
  manifest.set_seed(config.values().train().seed());
  manifest.set_master_dtype(kMasterDType);
  if (!request.tokenizer.empty()) manifest.set_tokenizer(request.tokenizer);
  if (request.data) *manifest.mutable_data() = *request.data;
  for (const std::string& plugin : config.values().plugins()) {
    std::error_code ignored;  // a path the OS refuses stays as written
    const fs::path absolute = fs::weakly_canonical(plugin, ignored);
    manifest.add_plugin_paths(absolute.empty() ? plugin : absolute.string());
  }
  WriteFileSynced(tmp_dir + "/" + internal::kManifest, manifest.SerializeAsString());
  std::string text;
  google::protobuf::TextFormat::PrintToString(manifest, &text);
  WriteFileSynced(tmp_dir + "/manifest.txt", text);  // for people; manifest.pb is authoritative
  FsyncPath(tmp_dir, true);
  const std::string final_dir = root + "/" + StepDirName(step);
  const std::string replaced = root + "/.replaced_" + StepDirName(step);
  if (fs::exists(final_dir)) {
    fs::remove_all(replaced);
    fs::rename(final_dir, replaced);
  }
  fs::rename(tmp_dir, final_dir);
  FsyncPath(root, true);
  const std::string latest = root + "/" + internal::kLatest;
  WriteFileSynced(latest + ".tmp", StepDirName(step) + "\n");
  fs::rename(latest + ".tmp", latest);
  FsyncPath(root, true);
  fs::remove_all(replaced);
}

// Rank 0: the newest `keep_last` checkpoints of this run's history are kept, those up to
// `step`. Directories of later steps belong to an abandoned run that this one resumed before;
// they are left alone (and replaced when this run reaches them).
void Prune(const std::string& root, int64_t step, int keep_last) {
  std::vector<std::string> steps;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind("step_", 0) == 0 && name <= StepDirName(step))
      steps.push_back(name);
  }
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + keep_last < steps.size(); ++i) fs::remove_all(root + "/" + steps[i]);
}

}  // namespace

struct Saver::Impl {
  explicit Impl(bool async) : async(async) {}

  // The snapshot: this rank's pieces, planned (with the manifest entries of the files it writes
  // values of) and copied into the buffer. Collective over tp when tensor parallel.
  void Snapshot(const ModelState& state, const optim::AdamW& adamw, comm::PipelineComm& comm);
  // Joins the background write (or runs it here when synchronous).
  void Join();
  // The snapshot's copies have landed (the writer waited for them): their event goes.
  void ReleaseCopies();
  SaveStats Commit(comm::PipelineComm& comm);

  const bool async;
  SnapshotBuffer buffer;
  // The snapshot's device-to-host copies, on the device's copy stream: complete when `copied` is
  // (recorded after them; null on the CPU, where they are done at the call). `guard` is set until
  // the compute stream has been made to wait for them (GuardState) or the host saw them land.
  device::Device* copy_device = nullptr;
  device::Event copied;
  bool guard = false;
  // The save in flight.
  bool in_flight = false;
  SaveRequest request;
  std::string tmp_dir;
  Clock::time_point started;
  double snapshot_seconds = 0;
  double wait_seconds = 0;
  std::vector<FileJob> jobs;
  Manifest fragment;
  std::string error;  // this rank's, before the write
  std::thread writer;
  std::atomic<bool> written{false};
  WriteResult result;
};

void Saver::Impl::Snapshot(const ModelState& state, const optim::AdamW& adamw,
                           comm::PipelineComm& comm) {
  jobs.clear();
  fragment.Clear();
  device::Device* device = nullptr;
  int64_t total = 0;
  const std::vector<LayerFilePlan> plans = PlanLayerFiles(state, adamw, comm);
  // The three tensors of a parameter this rank holds: value and moments, whole or a slice (a
  // moment is null before its first step, or for an empty ZeRO slice).
  auto own = [&](const layer::Param* param) {
    return std::array<const memory::Tensor*, 3>{&param->value, adamw.FirstMoment(param),
                                                adamw.SecondMoment(param)};
  };
  // First the plan: every piece's place in the buffer, sized from the full shapes, so that the
  // buffer is reserved before anything is gathered.
  for (size_t i = 0; i < plans.size(); ++i) {
    const LayerFilePlan& plan = plans[i];
    const std::string where = tmp_dir + "/" + plan.file;
    std::vector<std::vector<int64_t>> shapes;
    for (size_t p = 0; p < plan.owned.size(); ++p) {
      const layer::Param* param = plan.owned[p];
      internal::CheckMaster(where, state, plan.layer_id, *param);
      device = param->value.device();
      const bool sliced = plan.gathered && plan.shards[p].sliced();
      shapes.push_back(sliced ? plan.shards[p].full_shape : param->value.shape());
    }
    if (plan.gathered && comm.tp().rank() != 0) continue;  // tp rank 0 writes
    std::vector<TensorEntry> entries = LayerEntries(plan, state, shapes);
    FileJob& job = jobs.emplace_back();
    job.file = plan.file;
    job.file_bytes = entries.empty() ? 0 : entries.back().offset() + entries.back().bytes();
    total = AlignUp(total);
    job.buffer_begin = total;
    for (size_t p = 0; p < plan.owned.size(); ++p) {
      const bool slice = !plan.gathered && adamw.HasSliceState(plan.owned[p]);
      const std::array<const memory::Tensor*, 3> sources = own(plan.owned[p]);
      for (int k = 0; k < 3; ++k) {
        const TensorEntry& entry = entries[3 * p + k];
        Piece piece{sources[k],          entry.name(),        0,
                    entry.offset(),      entry.bytes(),       total,
                    static_cast<int>(i), static_cast<int>(p), k};
        if (k > 0 && slice) {  // this replica's slice of the moment (ZeRO-1)
          piece.entry_offset =
              adamw.StateBegin(plan.owned[p]) * memory::DTypeSize(plan.owned[p]->value.dtype());
          piece.file_offset += piece.entry_offset;
          piece.bytes = piece.source ? piece.source->bytes() : 0;
        } else if (!plan.writer) {
          continue;  // the writer writes values and whole moments
        }
        if (piece.bytes == 0) continue;  // an empty ZeRO slice
        total += piece.bytes;
        job.pieces.push_back(std::move(piece));
      }
    }
    // Pieces back to back from offset 0 to the end: the file is this rank's alone.
    int64_t next = 0;
    for (const Piece& piece : job.pieces)
      next = piece.file_offset == next ? next + piece.bytes : -1;
    job.whole = next == job.file_bytes && job.file_bytes > 0;
    total = AlignUp(total);  // O_DIRECT writes whole blocks
    if (!plan.writer) continue;
    for (TensorEntry& entry : entries) *fragment.add_tensors() = std::move(entry);
    LayerFile* layer_file = fragment.add_files();
    layer_file->set_layer_id(plan.layer_id);
    layer_file->set_file(plan.file);
    layer_file->set_bytes(job.file_bytes);
    layer_file->set_writer_rank(comm.world().rank());
  }
  char* data = device ? buffer.Reserve(device, total) : nullptr;
  if (!device) return;
  // The copies run on the copy stream, after everything the compute stream has been given (the
  // optimizer step that made these values), and overlap what it is given next.
  const device::Stream stream = device->copy_stream();
  const device::Event ready = device->RecordEvent(device->compute_stream());
  device->WaitEvent(stream, ready);
  device->DestroyEvent(ready);
  copy_device = device;
  std::map<std::array<int, 3>, const Piece*> pieces;
  for (const FileJob& job : jobs) {
    for (const Piece& piece : job.pieces) pieces[{piece.plan, piece.param, piece.kind}] = &piece;
  }
  auto copy = [&](const Piece& piece, const memory::Tensor* from, bool lives_on) {
    char* to = data + piece.buffer_offset;
    if (!from) {
      std::memset(to, 0, static_cast<size_t>(piece.bytes));
    } else if (lives_on) {
      device->CopyDeviceToHostAsync(to, from->raw(), from->bytes(), stream);
    } else {
      from->CopyToHost(to);  // a gathered temporary: copied before it is freed
    }
  };
  // Recorded also when a gather throws: the copies already queued still write the buffer.
  auto record_copied = [&] {
    copied = device->RecordEvent(stream);
    guard = true;
  };
  // Then the copies, tensor by tensor. Under tp every rank of the group gathers each tensor (a
  // collective, in the same order everywhere) and only tp rank 0 keeps it, one at a time.
  try {
    for (size_t i = 0; i < plans.size(); ++i) {
      const LayerFilePlan& plan = plans[i];
      for (size_t p = 0; p < plan.owned.size(); ++p) {
        const std::array<const memory::Tensor*, 3> sources = own(plan.owned[p]);
        for (int k = 0; k < 3; ++k) {
          auto piece = pieces.find({static_cast<int>(i), static_cast<int>(p), k});
          if (plan.gathered && plan.shards[p].sliced() && sources[k]) {
            const memory::Tensor full = GatherTpSlices(*sources[k], plan.shards[p], comm.tp());
            if (piece != pieces.end()) copy(*piece->second, &full, /*lives_on=*/false);
          } else if (piece != pieces.end()) {
            copy(*piece->second, sources[k], /*lives_on=*/true);
          }
        }
      }
    }
  } catch (...) {
    record_copied();
    throw;
  }
  record_copied();
}

void Saver::Impl::Join() {
  const auto start = Clock::now();
  if (writer.joinable()) writer.join();
  wait_seconds += SecondsSince(start);
  ReleaseCopies();
}

void Saver::Impl::ReleaseCopies() {
  if (!copy_device) return;
  copy_device->DestroyEvent(copied);
  copy_device = nullptr;
  copied = {};
  guard = false;  // the host has seen them land: later work is ordered after them
}

SaveStats Saver::Impl::Commit(comm::PipelineComm& comm) {
  Join();
  in_flight = false;
  comm::Group& world = comm.world();
  const bool is_root = world.rank() == 0;
  SaveReport report;
  const std::string& failure = !error.empty() ? error : result.error;
  if (!failure.empty()) {
    report.set_error(failure);
  } else {
    *report.mutable_fragment() = std::move(fragment);
    for (TensorPiece& piece : result.pieces) *report.add_pieces() = std::move(piece);
  }
  std::string root_error;
  std::optional<Manifest> manifest;
  try {
    manifest = GatherReports(world, request.step, std::move(report));
  } catch (const CheckpointError& e) {
    if (is_root) root_error = e.what();
  }
  const double total_bytes =
      world.SumToRoot(double(result.bytes), "the bytes of the checkpoint, summed on rank 0");
  const std::string& own_error = failure.empty() ? root_error : failure;
  try {
    internal::RunAndAgree(
        world,
        [&] {
          if (!own_error.empty()) throw CheckpointError(own_error);
          if (!is_root) return;
          CommitManifest(request, tmp_dir, std::move(*manifest));
          Prune(request.root, request.step, request.keep_last);
        },
        "checkpoint step " + std::to_string(request.step) + " failed on another rank",
        "; the previous checkpoint is intact");
  } catch (const CheckpointError&) {
    // Whichever rank failed, the half-written step goes: rank 0 made its directory.
    std::error_code ignored;
    if (is_root) fs::remove_all(tmp_dir, ignored);
    throw;
  }
  SaveStats stats;
  stats.dir = request.root + "/" + StepDirName(request.step);
  stats.step = request.step;
  stats.bytes = static_cast<int64_t>(total_bytes);
  stats.seconds = SecondsSince(started);
  stats.snapshot_seconds = snapshot_seconds;
  stats.write_seconds = result.seconds;
  stats.wait_seconds = wait_seconds;
  stats.async = async;
  return stats;
}

Saver::Saver(bool async) : impl_(std::make_unique<Impl>(async)) {}

Saver::~Saver() {
  if (impl_->writer.joinable()) impl_->writer.join();
  if (impl_->copy_device) {
    try {  // a snapshot whose write never started (an error before it): its copies still land
      impl_->copy_device->WaitEventOnHost(impl_->copied);
      impl_->ReleaseCopies();
    } catch (const std::exception&) {
      // The device failed; the error that ended the run is reported elsewhere.
    }
  }
}

std::optional<SaveStats> Saver::Start(const SaveRequest& request, const ModelState& state,
                                      const optim::AdamW& adamw, comm::PipelineComm& comm) {
  std::optional<SaveStats> finished = Finish(comm);
  Impl& s = *impl_;
  s.request = request;
  s.tmp_dir = request.root + "/.tmp_" + StepDirName(request.step);
  s.started = Clock::now();
  s.wait_seconds = 0;
  s.error.clear();
  s.result = WriteResult();
  s.written = false;
  const std::string step_text = std::to_string(request.step);
  internal::RunAndAgree(
      comm.world(),
      [&] {
        if (comm.world().rank() != 0) return;
        try {
          fs::create_directories(request.root);
          fs::remove_all(s.tmp_dir);
          fs::create_directories(s.tmp_dir);
        } catch (const std::exception& e) {
          throw CheckpointError(request.root + ": cannot prepare " + s.tmp_dir + ": " + e.what());
        }
      },
      "checkpoint step " + step_text + ": rank 0 could not prepare " + s.tmp_dir);
  s.in_flight = true;
  try {
    s.Snapshot(state, adamw, comm);
  } catch (const std::exception& e) {
    s.error = e.what();  // reported at the commit, on every rank
  }
  s.snapshot_seconds = SecondsSince(s.started);
  // The fault plan (docs/checkpoint.md): the first file write dies half-way through it, or every
  // file write fails half-way (a full disk), or each file waits before its fsync.
  const bool crash = request.faults.crash_in_checkpoint_step == request.step;
  const bool fail = request.faults.fail_checkpoint_step == request.step;
  const int64_t slow_ms = request.faults.slow_checkpoint_ms;
  auto write = [&s, crash, fail, slow_ms] {
    try {
      if (s.copy_device) s.copy_device->WaitEventOnHost(s.copied);  // the snapshot has landed
    } catch (const std::exception& e) {
      if (s.error.empty()) s.error = e.what();
    }
    if (s.error.empty())
      s.result = WriteJobs(s.jobs, s.buffer.data(), s.tmp_dir, {crash, fail, slow_ms});
    s.written = true;
  };
  if (s.async) {
    s.writer = std::thread(write);
  } else {
    write();
  }
  return finished;
}

std::optional<SaveStats> Saver::Poll(comm::PipelineComm& comm) {
  if (!impl_->in_flight) return std::nullopt;
  if (!comm.world().AllOk(impl_->written.load())) return std::nullopt;
  return impl_->Commit(comm);
}

std::optional<SaveStats> Saver::Finish(comm::PipelineComm& comm) {
  if (!impl_->in_flight) return std::nullopt;
  return impl_->Commit(comm);
}

double Saver::Prepare(const ModelState& state, const optim::AdamW& adamw,
                      comm::PipelineComm& comm) {
  Finish(comm);
  const auto start = Clock::now();
  impl_->tmp_dir = "(the snapshot buffer, prepared)";  // names nothing: no file is written
  impl_->Snapshot(state, adamw, comm);
  if (impl_->copy_device) impl_->copy_device->WaitEventOnHost(impl_->copied);
  impl_->ReleaseCopies();
  impl_->jobs.clear();
  impl_->fragment.Clear();
  return SecondsSince(start);
}

void Saver::GuardState() {
  Impl& s = *impl_;
  if (!s.guard) return;
  s.copy_device->WaitEvent(s.copy_device->compute_stream(), s.copied);
  s.guard = false;
}

bool Saver::in_flight() const { return impl_->in_flight; }

int64_t Saver::buffer_bytes() const { return impl_->buffer.bytes(); }

SaveStats Save(const std::string& root, int64_t step, const config::ResolvedConfig& config,
               const ModelState& state, const optim::AdamW& adamw, comm::PipelineComm& comm,
               int keep_last, const std::string& tokenizer, const util::FaultPlan& faults) {
  Saver saver(/*async=*/false);
  saver.Start({root, step, &config, keep_last, tokenizer, faults}, state, adamw, comm);
  return *saver.Finish(comm);
}

}  // namespace bigmac::checkpoint
