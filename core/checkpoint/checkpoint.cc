#include "core/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "core/checkpoint/crc32.h"
#include "core/checkpoint/tp_slices.h"
#include "core/util/files.h"
#include "core/util/format.h"
#include "google/protobuf/text_format.h"

namespace bigmac::checkpoint {
namespace fs = std::filesystem;
namespace {

constexpr char kManifest[] = "manifest.pb";
constexpr char kLatest[] = "latest";
const char* const kKinds[] = {"value", "exp_avg", "exp_avg_sq"};

void FsyncPath(const std::string& path, bool directory) {
  const int fd = open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw CheckpointError(path + ": cannot open to fsync: " + std::strerror(errno));
  const int rc = fsync(fd);
  close(fd);
  if (rc != 0) throw CheckpointError(path + ": fsync failed: " + std::strerror(errno));
}

// Writes `data` to `path` and fsyncs it. Throws on any short write (a full disk, say).
// `crash_midway` (a testing hook) kills the process half-way through, as a crash would.
// `fail_midway` (a testing hook) makes the write fail half-way, as a full disk would.
void WriteFileSynced(const std::string& path, const std::string& data, bool crash_midway = false,
                     bool fail_midway = false) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw CheckpointError(path + ": cannot create: " + std::strerror(errno));
  size_t written = 0;
  while (written < data.size()) {
    if (fail_midway && written >= data.size() / 2) {
      close(fd);
      throw CheckpointError(path + ": write failed after " + std::to_string(written) + " of " +
                            std::to_string(data.size()) +
                            " bytes: No space left on device (injected)");
    }
    const size_t chunk =
        crash_midway || fail_midway ? std::max<size_t>(1, data.size() / 2) : data.size() - written;
    const ssize_t n = write(fd, data.data() + written, std::min(chunk, data.size() - written));
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      close(fd);
      throw CheckpointError(path + ": write failed after " + std::to_string(written) + " of " +
                            std::to_string(data.size()) + " bytes: " + why);
    }
    written += static_cast<size_t>(n);
    if (crash_midway && written >= data.size() / 2) _exit(9);
  }
  const int rc = fsync(fd);
  close(fd);
  if (rc != 0) throw CheckpointError(path + ": fsync failed: " + std::strerror(errno));
}

std::string ReadWholeFile(const std::string& path) {
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (!fs::exists(status)) {
    // A link that leads nowhere (or loops) is there, but cannot be opened: say why.
    std::error_code link_error;
    if (fs::exists(fs::symlink_status(path, link_error)))
      throw CheckpointError(
          path + ": cannot open: " + (error ? error.message() : "a symbolic link to nothing"));
    throw CheckpointError(path + ": missing (cannot open)");
  }
  if (!fs::is_regular_file(status)) throw CheckpointError(path + ": not a regular file");
  const uintmax_t size = fs::file_size(path, error);
  if (error) throw CheckpointError(path + ": cannot read its size: " + error.message());
  // Read through the checked opener: the file checked above may have been replaced since.
  std::string data;
  if (std::string problem = util::ReadUserFile(path, size, "checkpoint file", &data);
      !problem.empty()) {
    throw CheckpointError(problem);
  }
  return data;
}

// ZeRO-1: writes this rank's pieces of one layer file of `total` bytes at `path` (the tensors at
// `entries`, three per parameter of `owned`: value, exp_avg, exp_avg_sq) and fsyncs them. The
// layer's writer writes the values and any whole moments; every replica writes the slices of the
// moments its AdamW holds. The replicas' pieces tile the file. `fail_midway` is the full-disk
// testing hook. Returns the bytes written.
int64_t WriteOwnedPieces(const std::string& path, int64_t total,
                         const std::vector<TensorEntry>& entries,
                         const std::vector<const layer::Param*>& owned, const optim::AdamW& adamw,
                         bool writer, bool fail_midway) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT, 0644);
  if (fd < 0) throw CheckpointError(path + ": cannot create: " + std::strerror(errno));
  int64_t written = 0;
  std::string failure;
  auto put = [&](const memory::Tensor& tensor, int64_t offset) {
    std::string host(static_cast<size_t>(tensor.bytes()), '\0');
    tensor.CopyToHost(host.data());  // device memory through the host
    for (size_t done = 0; done < host.size() && failure.empty();) {
      const ssize_t n = fail_midway ? -1
                                    : pwrite(fd, host.data() + done, host.size() - done,
                                             static_cast<off_t>(offset + done));
      if (n <= 0) {
        failure = path + ": write failed after " + std::to_string(written) + " bytes: " +
                  (fail_midway ? "No space left on device (injected)" : std::strerror(errno));
      } else {
        done += static_cast<size_t>(n);
        written += n;
      }
    }
  };
  if (ftruncate(fd, static_cast<off_t>(total)) != 0)
    failure =
        path + ": cannot size it to " + std::to_string(total) + " bytes: " + std::strerror(errno);
  for (size_t i = 0; i < owned.size() && failure.empty(); ++i) {
    const layer::Param* param = owned[i];
    if (writer) put(param->value, entries[3 * i].offset());
    const bool slice = adamw.HasSliceState(param);
    if (!writer && !slice) continue;
    const int64_t skip = adamw.StateBegin(param) * memory::DTypeSize(param->value.dtype());
    if (const memory::Tensor* m = adamw.FirstMoment(param))
      put(*m, entries[3 * i + 1].offset() + skip);
    if (const memory::Tensor* v = adamw.SecondMoment(param))
      put(*v, entries[3 * i + 2].offset() + skip);
  }
  if (failure.empty() && fsync(fd) != 0) failure = path + ": fsync failed: " + std::strerror(errno);
  close(fd);
  if (!failure.empty()) throw CheckpointError(failure);
  return written;
}

// ZeRO-1: once every replica has written its pieces, the writer reads each of `files` back from
// `dir`, sets the CRC-32 of its tensors in `fragment` (entries already there) and adds the file.
void ChecksumWrittenFiles(const std::string& dir, std::vector<LayerFile> files,
                          Manifest* fragment) {
  for (LayerFile& file : files) {
    const std::string path = dir + "/" + file.file();
    const std::string data = ReadWholeFile(path);
    if (static_cast<int64_t>(data.size()) != file.bytes())
      throw CheckpointError(path + ": " + std::to_string(data.size()) + " bytes written, " +
                            std::to_string(file.bytes()) + " expected");
    uint32_t file_crc = 0;
    for (TensorEntry& entry : *fragment->mutable_tensors()) {
      if (entry.file() != file.file()) continue;
      entry.set_crc32(Crc32(data.data() + entry.offset(), static_cast<size_t>(entry.bytes())));
      file_crc = Crc32Combine(file_crc, entry.crc32(), static_cast<size_t>(entry.bytes()));
    }
    file.set_crc32(file_crc);
    *fragment->add_files() = std::move(file);
  }
}

// What a manifest may claim before anything it names is opened: a plausible model size, every
// file named after its layer_id (so no path leads outside the step directory), tensors inside
// their layer's file by the numbers. Returns "" or the first problem.
std::string CheckManifestClaims(const Manifest& manifest) {
  constexpr int kMaxLayers = 1 << 20;
  const int num_layers = manifest.config().model().num_layers();
  if (num_layers < 1 || num_layers > kMaxLayers) {
    return "model.num_layers=" + std::to_string(num_layers) + " is not a plausible model";
  }
  if (manifest.step() < 0 || manifest.next_step() != manifest.step()) {
    return "step " + std::to_string(manifest.step()) + " and next_step " +
           std::to_string(manifest.next_step()) +
           " disagree (a checkpoint after step N resumes at step N)";
  }
  // Manifests written before master_dtype existed hold f32 only.
  if (manifest.has_master_dtype() && manifest.master_dtype() != kMasterDType) {
    return "master_dtype '" + manifest.master_dtype() + "': BigMac loads only " + kMasterDType +
           " master weights and moments (precision.dtype only sets the compute copies)";
  }
  std::map<int, const LayerFile*> files;
  for (const LayerFile& file : manifest.files()) {
    if (file.layer_id() < layer::kEmbeddingLayerId ||
        file.layer_id() > layer::HeadLayerId(num_layers)) {
      return "layer_id " + std::to_string(file.layer_id()) + " is outside the model";
    }
    if (file.file() != LayerFileName(file.layer_id(), num_layers)) {
      return "layer_id " + std::to_string(file.layer_id()) + " names file '" + file.file() +
             "', expected '" + LayerFileName(file.layer_id(), num_layers) + "'";
    }
    if (file.bytes() < 0) return file.file() + ": negative size " + std::to_string(file.bytes());
    if (files.count(file.layer_id()))
      return "layer_id " + std::to_string(file.layer_id()) + " appears twice";
    files[file.layer_id()] = &file;
  }
  for (const TensorEntry& entry : manifest.tensors()) {
    auto it = files.find(entry.layer_id());
    if (it == files.end()) continue;  // a missing layer_id: reported by whoever needs the layer
    if (entry.file() != it->second->file()) {
      return "tensor " + entry.name() + " names file '" + entry.file() + "', not its layer's file";
    }
    if (entry.offset() < 0 || entry.bytes() < 0 ||
        entry.offset() > it->second->bytes() - entry.bytes()) {
      return "tensor " + entry.name() + " at offset " + std::to_string(entry.offset()) + " with " +
             std::to_string(entry.bytes()) + " bytes lies outside " + entry.file() + " (" +
             std::to_string(it->second->bytes()) + " bytes)";
    }
  }
  return "";
}

// "[4, 64]".
std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string text;
  for (int64_t extent : shape) text += (text.empty() ? "" : ", ") + std::to_string(extent);
  return "[" + text + "]";
}

// The bytes of an f32 tensor of `shape`, or -1 if an extent is negative or the count overflows.
int64_t F32Bytes(const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t extent : shape) {
    if (extent < 0 || (extent != 0 && numel > (INT64_MAX / 4) / extent)) return -1;
    numel *= extent;
  }
  return numel * 4;
}

std::string LayerName(int layer_id, int num_layers) {
  return layer::LayerIdName(layer_id, num_layers);
}

bool SameModel(const config::Config& a, const config::Config& b, std::string* why) {
  // The resolved shapes (a llama key left at 0 means its default), so an explicit default and
  // an implicit one are the same model.
  const layer::ModelDims da = config::ModelDimsOf(a), db = config::ModelDimsOf(b);
  const auto differ = [&](const std::string& name, const std::string& x, const std::string& y) {
    if (x == y) return false;
    *why = name + "=" + x + " in the checkpoint, " + y + " in this config";
    return true;
  };
  const auto number = [](double value) { return util::Format("%g", value); };
  if (differ("model.arch", a.model().arch(), b.model().arch())) return false;
  const std::pair<const char*, std::pair<int64_t, int64_t>> fields[] = {
      {"model.num_layers", {da.num_layers, db.num_layers}},
      {"model.hidden_size", {da.hidden_size, db.hidden_size}},
      {"model.num_heads", {da.num_heads, db.num_heads}},
      {"model.vocab_size", {da.vocab_size, db.vocab_size}},
      {"model.num_kv_heads", {da.kv_heads(), db.kv_heads()}},
      {"model.intermediate_size", {da.mlp_width(), db.mlp_width()}},
      {"model.tie_embeddings", {da.tied_head(), db.tied_head()}},
  };
  for (const auto& [name, values] : fields) {
    if (differ(name, std::to_string(values.first), std::to_string(values.second))) return false;
  }
  if (da.arch == layer::Arch::kGpt) {
    return !differ("train.seq_length (position table)", std::to_string(da.max_seq_length),
                   std::to_string(db.max_seq_length));
  }
  // Llama has no position table; these change what the weights mean, not their shapes.
  return !differ("model.rope_theta", number(da.rope_theta), number(db.rope_theta)) &&
         !differ("model.rms_norm_eps", number(da.rms_norm_eps), number(db.rms_norm_eps));
}

}  // namespace

std::string StepDirName(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%06lld", static_cast<long long>(step));
  return name;
}

std::string LayerFileName(int layer_id, int num_layers) {
  if (layer_id == layer::kEmbeddingLayerId) return "embedding.bin";
  if (layer_id == layer::HeadLayerId(num_layers)) return "head.bin";
  char name[32];
  std::snprintf(name, sizeof(name), "block_%04d.bin", layer_id);
  return name;
}

namespace {

// Which replica writes layer `layer_id`'s file: replica layer_id mod dp.
bool WritesLayer(int layer_id, const comm::Group& dp) {
  const int replicas = dp.size();
  return ((layer_id % replicas) + replicas) % replicas == dp.rank();
}

// Checkpoints hold f32 masters: anything else in the model is refused, naming `where` and the
// parameter.
void CheckMaster(const std::string& where, const ModelState& state, int layer_id,
                 const layer::Param& param) {
  if (param.value.dtype() == memory::DType::kF32) return;
  throw CheckpointError(where + ": " + ParamName(state, layer_id, param) + " is " +
                        memory::DTypeName(param.value.dtype()) +
                        " in this model; checkpoints hold " + kMasterDType +
                        " master weights only");
}

// Runs `work` on this rank, then agrees with every rank: if any failed, every rank throws
// CheckpointError, with its own error or, where its work succeeded, `elsewhere`; `suffix` ends
// both. Collective over `world`.
void RunAndAgree(comm::Group& world, const std::function<void()>& work,
                 const std::string& elsewhere, const std::string& suffix = "") {
  std::string error;
  try {
    work();
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!world.AllOk(error.empty()))
    throw CheckpointError((error.empty() ? elsewhere : error) + suffix);
}

// One layer file this rank has a part in, and how it is written.
struct LayerFilePlan {
  int layer_id = 0;
  std::string file;
  std::vector<const layer::Param*> owned;  // a tied copy is stored once, by its owner
  std::vector<layer::TpShard> shards;
  bool writer = false;    // this replica writes the file
  bool gathered = false;  // tensor parallel: full tensors gathered from the tp slices
  bool pieces = false;    // ZeRO-1: every replica writes its slices of the moments
};

// 1. The layer files of this rank's layers that it takes part in: replica layer_id mod dp writes
// each; under tensor parallelism every tp rank of that replica gathers and its tp rank 0 writes
// (ZeRO-1 is refused with tp > 1 at start-up); under ZeRO-1 (AdamW slice state) every replica
// writes its slices of the moments into that one file too.
std::vector<LayerFilePlan> PlanLayerFiles(const ModelState& state, const optim::AdamW& adamw,
                                          const comm::PipelineComm& comm, int num_layers) {
  std::vector<LayerFilePlan> plans;
  for (const LayerParams& layer : state.layers) {
    LayerFilePlan plan;
    plan.layer_id = layer.layer_id;
    plan.file = LayerFileName(layer.layer_id, num_layers);
    for (size_t i = 0; i < layer.params.size(); ++i) {
      if (layer.params[i]->tied_copy) continue;
      plan.owned.push_back(layer.params[i]);
      plan.shards.push_back(layer.shards.empty() ? layer::TpShard{} : layer.shards[i]);
    }
    if (plan.owned.empty()) continue;
    plan.writer = WritesLayer(layer.layer_id, comm.dp());
    plan.gathered = comm.tp().size() > 1;
    plan.pieces = !plan.gathered &&
                  std::any_of(plan.owned.begin(), plan.owned.end(),
                              [&](const layer::Param* p) { return adamw.HasSliceState(p); });
    if (plan.writer || plan.pieces) plans.push_back(std::move(plan));
  }
  return plans;
}

// The tensor entries of a layer file: value, exp_avg and exp_avg_sq of each parameter, packed
// in that order from offset 0, each of the full shape `shapes[p]`. Their CRCs are set later.
std::vector<TensorEntry> LayerEntries(const LayerFilePlan& plan, const ModelState& state,
                                      const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<TensorEntry> entries;
  int64_t offset = 0;
  for (size_t p = 0; p < plan.owned.size(); ++p) {
    const int64_t bytes = F32Bytes(shapes[p]);
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

// What Save's writes share: where, and the fault plan's injections.
struct WriteContext {
  std::string tmp_dir;
  const ModelState& state;
  const optim::AdamW& adamw;
  comm::PipelineComm& comm;
  bool crash = false;  // the first file write dies half-way (the fault plan)
  bool fail = false;   // file writes fail half-way (the fault plan)
};

// A layer file written whole from full tensors (value, exp_avg, exp_avg_sq per parameter; a null
// moment, before the first step, is written as zeros): its entries and the file go into
// `fragment`. Returns the bytes written.
int64_t WriteWholeFile(const WriteContext& context, const LayerFilePlan& plan,
                       const std::vector<std::array<const memory::Tensor*, 3>>& tensors,
                       Manifest* fragment) {
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& three : tensors) shapes.push_back(three[0]->shape());
  std::vector<TensorEntry> entries = LayerEntries(plan, context.state, shapes);
  const int64_t total = entries.empty() ? 0 : entries.back().offset() + entries.back().bytes();
  std::string data(static_cast<size_t>(total), '\0');
  uint32_t file_crc = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    // Device memory through the host.
    if (const memory::Tensor* tensor = tensors[i / 3][i % 3])
      tensor->CopyToHost(data.data() + entries[i].offset());
    entries[i].set_crc32(Crc32(data.data() + entries[i].offset(), entries[i].bytes()));
    file_crc = Crc32Combine(file_crc, entries[i].crc32(), entries[i].bytes());
    *fragment->add_tensors() = std::move(entries[i]);
  }
  WriteFileSynced(context.tmp_dir + "/" + plan.file, data, context.crash, context.fail);
  LayerFile* layer_file = fragment->add_files();
  layer_file->set_layer_id(plan.layer_id);
  layer_file->set_file(plan.file);
  layer_file->set_bytes(total);
  layer_file->set_crc32(file_crc);
  layer_file->set_writer_rank(context.comm.world().rank());
  return total;
}

// 2. One layer file, as planned: whole from this rank's tensors; gathered from the tp slices
// (every tp rank of the writing replica gathers, its tp rank 0 writes); or this rank's ZeRO-1
// pieces, whose file the writer checksums once every replica has written (added to `read_back`).
// Returns the bytes this rank wrote.
int64_t WriteLayerFile(const WriteContext& context, const LayerFilePlan& plan, Manifest* fragment,
                       std::vector<LayerFile>* read_back) {
  const std::string path = context.tmp_dir + "/" + plan.file;
  for (const layer::Param* param : plan.owned)
    CheckMaster(path, context.state, plan.layer_id, *param);
  const optim::AdamW& adamw = context.adamw;
  if (plan.gathered) {
    std::vector<std::array<memory::Tensor, 3>> full(plan.owned.size());
    for (size_t p = 0; p < plan.owned.size(); ++p) {
      const memory::Tensor* own[3] = {&plan.owned[p]->value, adamw.FirstMoment(plan.owned[p]),
                                      adamw.SecondMoment(plan.owned[p])};
      for (int k = 0; k < 3; ++k) {
        if (own[k]) full[p][k] = GatherTpSlices(*own[k], plan.shards[p], context.comm.tp());
      }
    }
    if (context.comm.tp().rank() != 0) return 0;
    std::vector<std::array<const memory::Tensor*, 3>> tensors;
    for (const auto& three : full) {
      tensors.push_back({&three[0], three[1].empty() ? nullptr : &three[1],
                         three[2].empty() ? nullptr : &three[2]});
    }
    return WriteWholeFile(context, plan, tensors, fragment);
  }
  if (plan.pieces) {
    std::vector<std::vector<int64_t>> shapes;
    for (const layer::Param* param : plan.owned) shapes.push_back(param->value.shape());
    std::vector<TensorEntry> entries = LayerEntries(plan, context.state, shapes);
    const int64_t total = entries.empty() ? 0 : entries.back().offset() + entries.back().bytes();
    const int64_t written =
        WriteOwnedPieces(path, total, entries, plan.owned, adamw, plan.writer, context.fail);
    if (plan.writer) {
      for (TensorEntry& entry : entries) *fragment->add_tensors() = std::move(entry);
      LayerFile& layer_file = read_back->emplace_back();
      layer_file.set_layer_id(plan.layer_id);
      layer_file.set_file(plan.file);
      layer_file.set_bytes(total);
      layer_file.set_writer_rank(context.comm.world().rank());
    }
    return written;
  }
  std::vector<std::array<const memory::Tensor*, 3>> tensors;
  for (const layer::Param* param : plan.owned)
    tensors.push_back({&param->value, adamw.FirstMoment(param), adamw.SecondMoment(param)});
  return WriteWholeFile(context, plan, tensors, fragment);
}

// 3. Every rank's report (its fragment of the manifest, or its error) gathered on rank 0, and
// merged there into the manifest; throws the first rank's error. Collective over the world.
Manifest GatherReports(comm::Group& world, int64_t step, Manifest fragment,
                       const std::string& error) {
  SaveReport report;
  report.set_rank(world.rank());
  if (error.empty()) {
    *report.mutable_fragment() = std::move(fragment);
  } else {
    report.set_error(error);
  }
  const std::vector<std::string> reports = world.GatherToRoot(report.SerializeAsString());
  Manifest manifest;
  for (size_t rank = 0; rank < reports.size(); ++rank) {
    SaveReport part;
    if (!part.ParseFromString(reports[rank])) {
      throw CheckpointError("checkpoint step " + std::to_string(step) + ": rank " +
                            std::to_string(rank) + " sent an unreadable save report");
    }
    if (part.has_error()) throw CheckpointError(part.error());
    manifest.MergeFrom(part.fragment());
  }
  return manifest;
}

// 4. Rank 0: the manifest completed and written into the temporary directory, which is then
// renamed into place and named by `latest`. A checkpoint of the same step from an abandoned run
// is moved aside, not deleted, until the new one is in place and `latest` names it.
void CommitManifest(const std::string& root, int64_t step, const std::string& tmp_dir,
                    const config::ResolvedConfig& config, const std::string& tokenizer,
                    Manifest manifest) {
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
  if (!tokenizer.empty()) manifest.set_tokenizer(tokenizer);
  for (const std::string& plugin : config.values().plugins()) {
    std::error_code ignored;  // a path the OS refuses stays as written
    const fs::path absolute = fs::weakly_canonical(plugin, ignored);
    manifest.add_plugin_paths(absolute.empty() ? plugin : absolute.string());
  }
  WriteFileSynced(tmp_dir + "/" + kManifest, manifest.SerializeAsString());
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
  WriteFileSynced(root + "/" + kLatest + ".tmp", StepDirName(step) + "\n");
  fs::rename(root + "/" + kLatest + ".tmp", root + "/" + kLatest);
  FsyncPath(root, true);
  fs::remove_all(replaced);
}

// 5. Rank 0: the newest `keep_last` checkpoints of this run's history are kept, those up to
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

SaveStats Save(const std::string& root, int64_t step, const config::ResolvedConfig& config,
               const ModelState& state, const optim::AdamW& adamw, comm::PipelineComm& comm,
               int keep_last, const std::string& tokenizer, const util::FaultPlan& faults) {
  const auto start = std::chrono::steady_clock::now();
  comm::Group& world = comm.world();
  const bool is_root = world.rank() == 0;
  WriteContext context{root + "/.tmp_" + StepDirName(step), state, adamw, comm};
  RunAndAgree(
      world,
      [&] {
        if (!is_root) return;
        try {
          fs::create_directories(root);
          fs::remove_all(context.tmp_dir);
          fs::create_directories(context.tmp_dir);
        } catch (const std::exception& e) {
          throw CheckpointError(root + ": cannot prepare " + context.tmp_dir + ": " + e.what());
        }
      },
      "checkpoint step " + std::to_string(step) + ": rank 0 could not prepare " + context.tmp_dir);

  // The fault plan (docs/checkpoint.md): the writer of this step's first file dies half-way
  // through it, or every file write fails half-way (a full disk).
  context.crash = faults.crash_in_checkpoint_step == step;
  context.fail = faults.fail_checkpoint_step == step;
  Manifest fragment;
  int64_t bytes_written = 0;
  std::vector<LayerFile> read_back;  // the writer's ZeRO-1 files, checksummed after the barrier
  std::string error;
  try {
    const int num_layers = config.values().model().num_layers();
    for (const LayerFilePlan& plan : PlanLayerFiles(state, adamw, comm, num_layers))
      bytes_written += WriteLayerFile(context, plan, &fragment, &read_back);
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Every piece is on disk before the writers checksum their ZeRO-1 files (a failure is reported
  // by the rank it happened on).
  if (world.AllOk(error.empty())) {
    try {
      ChecksumWrittenFiles(context.tmp_dir, read_back, &fragment);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  std::optional<Manifest> manifest;
  try {
    manifest = GatherReports(world, step, std::move(fragment), error);
  } catch (const CheckpointError& e) {
    if (is_root) error = e.what();
  }
  const double total_bytes =
      world.SumToRoot(double(bytes_written), "the bytes of the checkpoint, summed on rank 0");
  RunAndAgree(
      world,
      [&] {
        if (!is_root) {
          if (!error.empty()) throw CheckpointError(error);
          return;
        }
        try {
          if (!error.empty()) throw CheckpointError(error);
          CommitManifest(root, step, context.tmp_dir, config, tokenizer, std::move(*manifest));
          Prune(root, step, keep_last);
        } catch (const std::exception&) {
          std::error_code ignored;
          fs::remove_all(context.tmp_dir, ignored);
          throw;
        }
      },
      "checkpoint step " + std::to_string(step) + " failed on another rank",
      "; the previous checkpoint is intact");
  SaveStats stats;
  stats.dir = root + "/" + StepDirName(step);
  stats.bytes = static_cast<int64_t>(total_bytes);
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

std::string ResolveStepDir(const std::string& resume, const std::string& root) {
  auto from_latest = [](const std::string& dir) {
    std::string name = ReadWholeFile(dir + "/" + kLatest);
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    // Only a step directory's name: `latest` must not lead outside the checkpoint directory.
    const bool valid = name.size() > 5 && name.size() <= 32 && name.rfind("step_", 0) == 0 &&
                       name.find_first_not_of("0123456789", 5) == std::string::npos;
    if (!valid) {
      throw CheckpointError(dir + "/" + kLatest + ": names '" + name.substr(0, 64) +
                            "', not a step directory (step_NNNNNN)");
    }
    return dir + "/" + name;
  };
  if (resume == "auto") {
    if (root.empty()) throw CheckpointError("--resume auto needs checkpoint.dir");
    return fs::exists(root + "/" + kLatest) ? from_latest(root) : "";
  }
  if (fs::exists(resume + "/" + kManifest)) return resume;
  if (fs::exists(resume + "/" + kLatest)) return from_latest(resume);
  throw CheckpointError(resume + ": not a checkpoint (no " + kManifest +
                        ") nor a checkpoint directory (no " + kLatest + ")");
}

Manifest ReadCheckedManifest(const std::string& step_dir) {
  const std::string path = step_dir + "/" + kManifest;
  const std::string bytes = ReadWholeFile(path);
  if (bytes.empty()) throw CheckpointError(path + ": empty file (0 bytes), not a manifest");
  Manifest manifest;
  if (!manifest.ParseFromString(bytes)) throw CheckpointError(path + ": not a valid manifest");
  if (manifest.format_version() != kFormatVersion) {
    throw CheckpointError(path + ": format version " + std::to_string(manifest.format_version()) +
                          " is not supported (this build reads " + std::to_string(kFormatVersion) +
                          ")");
  }
  if (std::string problem = CheckManifestClaims(manifest); !problem.empty()) {
    throw CheckpointError(path + ": " + problem);
  }
  return manifest;
}

config::Config ReadManifestConfig(const std::string& step_dir) {
  return ReadCheckedManifest(step_dir).config();
}

Manifest ReadManifest(const std::string& step_dir, const config::Config& config) {
  const std::string path = step_dir + "/" + kManifest;
  Manifest manifest = ReadCheckedManifest(step_dir);
  std::string why;
  if (!SameModel(manifest.config(), config, &why)) {
    throw CheckpointError(path + ": the checkpoint is for a different model shape: " + why);
  }
  return manifest;
}

VerifiedLayerFile VerifyLayerFile(const std::string& step_dir, const Manifest& manifest,
                                  int layer_id, const std::vector<ExpectedTensor>& expected) {
  const int num_layers = manifest.config().model().num_layers();
  const LayerFile* file = nullptr;
  for (const LayerFile& candidate : manifest.files()) {
    if (candidate.layer_id() == layer_id) file = &candidate;
  }
  if (!file) {
    throw LayerFileError("MISSING", step_dir + ": missing layer_id " + std::to_string(layer_id) +
                                        " (" + LayerName(layer_id, num_layers) +
                                        "): the manifest lists no file for it");
  }
  const std::string path = step_dir + "/" + file->file();
  VerifiedLayerFile verified;
  std::vector<const TensorEntry*> in_file_order;
  for (const TensorEntry& entry : manifest.tensors()) {
    if (entry.layer_id() != layer_id) continue;
    verified.tensors[entry.name()] = &entry;
    in_file_order.push_back(&entry);
  }
  auto missing = [&](const std::string& name) {
    return LayerFileError("BAD TENSOR",
                          step_dir + ": tensor " + name + " is missing from the manifest");
  };
  auto bad_tensor = [&](const std::string& name, const std::string& problem) {
    return LayerFileError("BAD TENSOR", path + ": tensor " + name + " " + problem);
  };
  // Before reading anything: what the model needs, then what the manifest claims of the tensors.
  for (const ExpectedTensor& want : expected) {
    auto it = verified.tensors.find(want.name);
    if (it == verified.tensors.end()) throw missing(want.name);
    const TensorEntry& entry = *it->second;
    const std::vector<int64_t> shape(entry.shape().begin(), entry.shape().end());
    if (shape != want.shape || entry.bytes() != F32Bytes(want.shape)) {
      throw bad_tensor(want.name, "has shape " + ShapeText(shape) + " (" +
                                      std::to_string(entry.bytes()) + " bytes), the model wants " +
                                      kMasterDType + ShapeText(want.shape));
    }
  }
  for (const TensorEntry* entry : in_file_order) {
    const std::string& name = entry->name();
    const size_t hash = name.rfind('#');
    const std::string base = name.substr(0, hash);
    for (const char* kind : kKinds) {  // a value comes with its two moments
      auto sibling = verified.tensors.find(base + "#" + kind);
      if (sibling == verified.tensors.end()) throw missing(base + "#" + kind);
      if (!std::equal(sibling->second->shape().begin(), sibling->second->shape().end(),
                      entry->shape().begin(), entry->shape().end())) {
        throw bad_tensor(name, "and " + sibling->first + " differ in shape");
      }
    }
    if (hash == std::string::npos ||
        (name.substr(hash + 1) != kKinds[0] && name.substr(hash + 1) != kKinds[1] &&
         name.substr(hash + 1) != kKinds[2])) {
      throw bad_tensor(name,
                       "is neither a value (#value) nor an AdamW moment (#exp_avg, #exp_avg_sq)");
    }
    if (entry->dtype() != kMasterDType) {
      throw bad_tensor(name, "has dtype '" + entry->dtype() + "'; checkpoints hold " +
                                 kMasterDType + " master weights and moments only");
    }
    const std::vector<int64_t> shape(entry->shape().begin(), entry->shape().end());
    if (entry->bytes() != F32Bytes(shape)) {
      throw bad_tensor(name, "has shape " + ShapeText(shape) + " but " +
                                 std::to_string(entry->bytes()) + " bytes");
    }
  }
  // The file: its size (before reading, so that a file far larger than claimed is not read into
  // memory), then its bytes and CRC-32.
  auto wrong_size = [&](uint64_t size) {
    return LayerFileError("SIZE " + std::to_string(size) + " != " + std::to_string(file->bytes()),
                          path + ": " + std::to_string(size) + " bytes, the manifest says " +
                              std::to_string(file->bytes()) + " (truncated or altered)");
  };
  std::error_code size_error;
  if (const uintmax_t size = fs::file_size(path, size_error);
      !size_error && static_cast<int64_t>(size) != file->bytes()) {
    throw wrong_size(size);
  }
  try {
    verified.bytes = ReadWholeFile(path);
  } catch (const CheckpointError& e) {
    std::error_code link_error;
    throw LayerFileError(
        fs::exists(fs::symlink_status(path, link_error)) ? "UNREADABLE" : "MISSING", e.what());
  }
  if (static_cast<int64_t>(verified.bytes.size()) != file->bytes())
    throw wrong_size(verified.bytes.size());
  if (Crc32(verified.bytes.data(), verified.bytes.size()) != file->crc32()) {
    throw LayerFileError(
        "CHECKSUM MISMATCH",
        path + ": checksum mismatch (CRC-32 of the file differs from the manifest)");
  }
  // Each tensor's place in it.
  for (const TensorEntry* entry : in_file_order) {
    if (entry->offset() < 0 ||
        entry->offset() + entry->bytes() > static_cast<int64_t>(verified.bytes.size())) {
      throw bad_tensor(entry->name(), "lies outside the file");
    }
    // The file's checksum covers its bytes; this one ties the tensor's name to its place.
    if (Crc32(verified.bytes.data() + entry->offset(), entry->bytes()) != entry->crc32()) {
      throw bad_tensor(entry->name(), "has a checksum mismatch at offset " +
                                          std::to_string(entry->offset()) +
                                          " (the manifest's tensor entry was altered)");
    }
  }
  return verified;
}

int64_t Load(const std::string& step_dir, const config::ResolvedConfig& config,
             const ModelState& state, optim::AdamW& adamw, comm::PipelineComm& comm) {
  int64_t next_step = 0;
  // What this rank read, applied once every rank has read all it needs.
  struct Loaded {
    layer::Param* param;
    memory::Tensor value, m, v;
    bool optimizer_state;
  };
  std::vector<Loaded> loaded;
  // Read everything before changing anything, so a bad checkpoint leaves the model as it was.
  RunAndAgree(
      comm.world(),
      [&] {
        const Manifest manifest = ReadManifest(step_dir, config.values());
        next_step = manifest.next_step();
        std::map<std::string, int>
            layer_of;  // tensor name -> layer_id, to find a tied copy's owner
        for (const TensorEntry& entry : manifest.tensors())
          layer_of[entry.name()] = entry.layer_id();
        // Each parameter's tensors and the layer file they are read from: its own layer's, or for a
        // tied copy the value in its owner's file (stored once, loaded without a duplicate).
        struct Wanted {
          layer::Param* param;
          int layer_id;
          std::string name;  // without the #kind
          bool optimizer_state;
          layer::TpShard shard;  // the file holds the full tensor; this rank takes its slice
        };
        std::vector<Wanted> wanted;
        std::vector<int> layer_order;
        std::map<int, std::vector<ExpectedTensor>> expected;
        for (const LayerParams& layer : state.layers) {
          for (size_t i = 0; i < layer.params.size(); ++i) {
            layer::Param* param = layer.params[i];
            layer::TpShard shard;
            if (!layer.shards.empty()) shard = layer.shards[i];
            if (shard.full_shape.empty()) shard.full_shape = param->value.shape();
            CheckMaster(step_dir, state, layer.layer_id, *param);
            Wanted w{param, layer.layer_id, ParamName(state, layer.layer_id, *param), true, shard};
            if (param->tied_copy) {
              auto owner = layer_of.find(param->tied_owner + "#value");
              w = {param, owner == layer_of.end() ? layer.layer_id : owner->second,
                   param->tied_owner, false, shard};
            }
            if (!expected.count(w.layer_id)) layer_order.push_back(w.layer_id);
            for (int k = 0; k < (w.optimizer_state ? 3 : 1); ++k)
              expected[w.layer_id].push_back({w.name + "#" + kKinds[k], shard.full_shape});
            wanted.push_back(std::move(w));
          }
        }
        std::map<int, VerifiedLayerFile> files;
        for (int layer_id : layer_order)
          files[layer_id] = VerifyLayerFile(step_dir, manifest, layer_id, expected[layer_id]);
        for (const Wanted& w : wanted) {
          const VerifiedLayerFile& file = files.at(w.layer_id);
          auto read = [&](const char* kind) {
            memory::Tensor tensor(w.param->value.device(), w.shard.full_shape,
                                  w.param->value.dtype());
            const TensorEntry& entry = *file.tensors.at(w.name + "#" + kind);
            tensor.CopyFromHost(file.bytes.data() + entry.offset());
            return TpSliceOf(tensor, w.shard);
          };
          Loaded l{w.param, read(kKinds[0]), memory::Tensor(), memory::Tensor(), w.optimizer_state};
          if (w.optimizer_state) {
            l.m = read(kKinds[1]);
            l.v = read(kKinds[2]);
          }
          loaded.push_back(std::move(l));
        }
      },
      step_dir + ": another rank could not load its layers");
  for (Loaded& l : loaded) {
    l.param->value.CopyFrom(l.value);
    if (l.optimizer_state) adamw.SetState(l.param, std::move(l.m), std::move(l.v));
  }
  return next_step;
}

bool Inspect(const std::string& step_dir, std::vector<std::string>* lines) {
  Manifest manifest;
  try {
    manifest = ReadCheckedManifest(step_dir);
  } catch (const CheckpointError& e) {
    lines->push_back(e.what());
    return false;
  }
  const config::Config& cfg = manifest.config();
  const int num_layers = cfg.model().num_layers();
  std::string counts;
  for (int count : manifest.layers_per_stage())
    counts += (counts.empty() ? "" : ", ") + std::to_string(count);
  char header[512];
  std::snprintf(header, sizeof(header),
                "%s: step %lld (format %d) | model: %d blocks, hidden %d, %d heads, vocab %d, seq "
                "%d | saved with pp=%d "
                "dp=%d, %s [%s] | seed %lld",
                step_dir.c_str(), static_cast<long long>(manifest.step()),
                manifest.format_version(), num_layers, cfg.model().hidden_size(),
                cfg.model().num_heads(), cfg.model().vocab_size(), cfg.train().seq_length(),
                manifest.pp(), manifest.dp(), manifest.partition_policy().c_str(), counts.c_str(),
                static_cast<long long>(manifest.seed()));
  lines->push_back(header);
  // What generate and ckpt export need besides the files (docs/plugins.md, docs/generate.md).
  if (!manifest.tokenizer().empty() || manifest.plugin_paths_size() > 0) {
    std::vector<std::string> plugins;
    for (const std::string& path : manifest.plugin_paths()) plugins.push_back(path);
    lines->push_back(util::Printable(
        "  tokenizer " + (manifest.tokenizer().empty() ? "(none recorded)" : manifest.tokenizer()) +
        (plugins.empty() ? "" : " | plugins: " + util::Join(plugins, ", "))));
  }
  bool ok = true;
  std::set<int> present;
  int64_t total = 0;
  for (const LayerFile& file : manifest.files()) {
    present.insert(file.layer_id());
    std::string status = "ok";
    try {
      VerifyLayerFile(step_dir, manifest, file.layer_id(), {});
    } catch (const LayerFileError& e) {
      status = e.status() + ": " + e.what();  // Load's words
      ok = false;
    }
    int tensors = 0;
    for (const TensorEntry& entry : manifest.tensors())
      tensors += entry.layer_id() == file.layer_id();
    char line[512];
    std::snprintf(
        line, sizeof(line),
        "  layer_id %4d  %-10s %-16s %10.1f KiB  %2d tensors  written by rank %d  crc32 %08x  ",
        file.layer_id(), LayerName(file.layer_id(), num_layers).c_str(), file.file().c_str(),
        double(file.bytes()) / 1024, tensors, file.writer_rank(), file.crc32());
    lines->push_back(line + status);
    total += file.bytes();
  }
  for (int id = layer::kEmbeddingLayerId; id <= layer::HeadLayerId(num_layers); ++id) {
    if (!present.count(id)) {
      lines->push_back("  layer_id " + std::to_string(id) + " (" + LayerName(id, num_layers) +
                       "): MISSING from the manifest");
      ok = false;
    }
  }
  char footer[128];
  std::snprintf(footer, sizeof(footer), "%zu files, %.2f MiB, %s",
                static_cast<size_t>(manifest.files_size()), double(total) / (1 << 20),
                ok ? "all checksums verified" : "DAMAGED");
  lines->push_back(footer);
  return ok;
}

}  // namespace bigmac::checkpoint
