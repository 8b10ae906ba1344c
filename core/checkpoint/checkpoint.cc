#include "core/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "core/checkpoint/crc32.h"
#include "core/checkpoint/internal.h"
#include "core/checkpoint/tp_slices.h"
#include "core/util/files.h"
#include "core/util/format.h"

namespace bigmac::checkpoint {
namespace fs = std::filesystem;
using internal::CheckMaster;
using internal::F32Bytes;
using internal::kKinds;
using internal::kLatest;
using internal::kManifest;
using internal::RunAndAgree;
namespace {

// The size of the regular file at `path`, or a CheckpointError saying why it cannot be read.
uint64_t CheckedFileSize(const std::string& path) {
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
  return size;
}

std::string ReadWholeFile(const std::string& path) {
  const uint64_t size = CheckedFileSize(path);
  // Read through the checked opener: the file checked above may have been replaced since.
  std::string data;
  if (std::string problem = util::ReadUserFile(path, size, "checkpoint file", &data);
      !problem.empty()) {
    throw CheckpointError(problem);
  }
  return data;
}

// Reads the layer file at `path` in large O_DIRECT reads into one reused, aligned buffer (no
// page-cache copy; bench/NOTES.md), handing each chunk to `chunk(data, offset, bytes)` in order.
// A filesystem that refuses O_DIRECT is read through the cache. Returns the bytes read; throws
// CheckpointError.
int64_t StreamLayerFile(const std::string& path,
                        const std::function<void(const char*, int64_t, int64_t)>& chunk) {
  constexpr size_t kAlign = internal::kDirectIoAlign;
  constexpr size_t kChunk = internal::kDirectIoChunk;
  struct Free {
    void operator()(char* data) const { std::free(data); }
  };
  thread_local std::unique_ptr<char, Free> buffer(
      static_cast<char*>(std::aligned_alloc(kAlign, kChunk)));
  if (!buffer) throw CheckpointError(path + ": cannot allocate a buffer to read it into");
  const uint64_t size = CheckedFileSize(path);
  int fd = -1;
  uint64_t opened_size = 0;
  // Through the checked opener: the file checked above may have been replaced since.
  if (std::string problem = util::OpenUserFile(path, size, "checkpoint file", &fd, &opened_size);
      !problem.empty()) {
    throw CheckpointError(problem);
  }
  const int flags = fcntl(fd, F_GETFL);
  bool direct = fcntl(fd, F_SETFL, flags | O_DIRECT) == 0;
  int64_t offset = 0;
  std::string problem;
  while (true) {
    const ssize_t n = read(fd, buffer.get(), kChunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EINVAL && direct) {
      direct = fcntl(fd, F_SETFL, flags) != 0;  // the filesystem takes no O_DIRECT
      if (!direct) continue;
    }
    if (n < 0) {
      problem = path + ": cannot read the checkpoint file: " + std::strerror(errno);
      break;
    }
    if (n == 0) break;
    try {
      chunk(buffer.get(), offset, n);
    } catch (...) {
      close(fd);
      throw;
    }
    offset += n;
  }
  close(fd);
  if (!problem.empty()) throw CheckpointError(problem);
  return offset;
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

namespace internal {

int64_t F32Bytes(const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t extent : shape) {
    if (extent < 0 || (extent != 0 && numel > (INT64_MAX / 4) / extent)) return -1;
    numel *= extent;
  }
  return numel * 4;
}

void CheckMaster(const std::string& where, const ModelState& state, int layer_id,
                 const layer::Param& param) {
  if (param.value.dtype() == memory::DType::kF32) return;
  throw CheckpointError(where + ": " + ParamName(state, layer_id, param) + " is " +
                        memory::DTypeName(param.value.dtype()) +
                        " in this model; checkpoints hold " + kMasterDType +
                        " master weights only");
}

void RunAndAgree(comm::Group& world, const std::function<void()>& work,
                 const std::string& elsewhere, const std::string& suffix) {
  std::string error;
  try {
    work();
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!world.AllOk(error.empty()))
    throw CheckpointError((error.empty() ? elsewhere : error) + suffix);
}

}  // namespace internal

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

namespace {

// VerifyLayerFile, or (`read` false) PrecheckLayerFile.
LayerTensors CheckLayerFile(const std::string& step_dir, const Manifest& manifest, int layer_id,
                            const std::vector<ExpectedTensor>& expected, bool read,
                            const FileChunkSink& sink) {
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
  LayerTensors tensors;
  std::vector<const TensorEntry*> in_file_order;
  for (const TensorEntry& entry : manifest.tensors()) {
    if (entry.layer_id() != layer_id) continue;
    tensors[entry.name()] = &entry;
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
    auto it = tensors.find(want.name);
    if (it == tensors.end()) throw missing(want.name);
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
      auto sibling = tensors.find(base + "#" + kind);
      if (sibling == tensors.end()) throw missing(base + "#" + kind);
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
  uint64_t size = 0;
  try {
    size = CheckedFileSize(path);
  } catch (const CheckpointError& e) {
    std::error_code link_error;
    throw LayerFileError(
        fs::exists(fs::symlink_status(path, link_error)) ? "UNREADABLE" : "MISSING", e.what());
  }
  if (static_cast<int64_t>(size) != file->bytes()) throw wrong_size(size);
  // Each tensor inside the file, before anything is read.
  for (const TensorEntry* entry : in_file_order) {
    if (entry->offset() < 0 || entry->offset() + entry->bytes() > file->bytes())
      throw bad_tensor(entry->name(), "lies outside the file");
  }
  if (!read) return tensors;
  // The bytes, streamed: the file's CRC-32 and each tensor's, while each chunk is in cache.
  uint32_t file_crc = 0;
  std::vector<uint32_t> tensor_crcs(in_file_order.size(), 0);
  int64_t bytes_read = 0;
  try {
    bytes_read = StreamLayerFile(path, [&](const char* data, int64_t offset, int64_t bytes) {
      if (offset + bytes > file->bytes()) throw wrong_size(offset + bytes);
      file_crc = Crc32Update(file_crc, data, bytes);
      for (size_t i = 0; i < in_file_order.size(); ++i) {
        const int64_t begin = std::max(offset, in_file_order[i]->offset());
        const int64_t end =
            std::min(offset + bytes, in_file_order[i]->offset() + in_file_order[i]->bytes());
        if (begin < end)
          tensor_crcs[i] = Crc32Update(tensor_crcs[i], data + (begin - offset), end - begin);
      }
      if (sink) sink(data, offset, bytes);
    });
  } catch (const LayerFileError&) {
    throw;
  } catch (const CheckpointError& e) {
    std::error_code link_error;
    throw LayerFileError(
        fs::exists(fs::symlink_status(path, link_error)) ? "UNREADABLE" : "MISSING", e.what());
  }
  if (bytes_read != file->bytes()) throw wrong_size(bytes_read);
  if (file_crc != file->crc32()) {
    throw LayerFileError(
        "CHECKSUM MISMATCH",
        path + ": checksum mismatch (CRC-32 of the file differs from the manifest)");
  }
  // The file's checksum covers its bytes; each tensor's ties its name to its place.
  for (size_t i = 0; i < in_file_order.size(); ++i) {
    if (tensor_crcs[i] != in_file_order[i]->crc32()) {
      throw bad_tensor(in_file_order[i]->name(), "has a checksum mismatch at offset " +
                                                     std::to_string(in_file_order[i]->offset()) +
                                                     " (the manifest's tensor entry was altered)");
    }
  }
  return tensors;
}

}  // namespace

LayerTensors PrecheckLayerFile(const std::string& step_dir, const Manifest& manifest, int layer_id,
                               const std::vector<ExpectedTensor>& expected) {
  return CheckLayerFile(step_dir, manifest, layer_id, expected, /*read=*/false, {});
}

LayerTensors VerifyLayerFile(const std::string& step_dir, const Manifest& manifest, int layer_id,
                             const std::vector<ExpectedTensor>& expected,
                             const FileChunkSink& sink) {
  return CheckLayerFile(step_dir, manifest, layer_id, expected, /*read=*/true, sink);
}

namespace {

// Where one tensor of a layer file goes as the file streams by: the bytes [begin, end) of the
// tensor that this rank keeps, into device memory at `to` (a parameter, a moment or its ZeRO
// slice); or, when this rank holds a tp slice of it, the whole tensor into host `staging`, cut
// into `target` once the file is verified.
struct Destination {
  int64_t file_offset = 0;
  int64_t begin = 0;
  int64_t end = 0;
  device::Device* device = nullptr;
  char* to = nullptr;
  std::vector<char> staging;
  layer::TpShard shard;
  memory::Tensor* target = nullptr;
};

// Copies the part of the chunk [offset, offset + bytes) at `data` that falls in `d`.
void Deliver(Destination& d, const char* data, int64_t offset, int64_t bytes) {
  const int64_t begin = std::max(offset, d.file_offset + d.begin);
  const int64_t end = std::min(offset + bytes, d.file_offset + d.end);
  if (begin >= end) return;
  const char* from = data + (begin - offset);
  if (d.to) {
    d.device->CopyHostToDevice(d.to + (begin - d.file_offset - d.begin), from, end - begin);
  } else {
    std::memcpy(d.staging.data() + (begin - d.file_offset), from, end - begin);
  }
}

}  // namespace

int64_t Load(const std::string& step_dir, const config::ResolvedConfig& config,
             const ModelState& state, optim::AdamW& adamw, comm::PipelineComm& comm) {
  // Each parameter's tensors and the layer file they are read from: its own layer's, or for a
  // tied copy the value in its owner's file (stored once, loaded without a duplicate).
  struct Wanted {
    layer::Param* param;
    int layer_id;
    std::string name;  // without the #kind
    bool optimizer_state;
    layer::TpShard shard;  // the file holds the full tensor; this rank takes its slice
  };
  Manifest manifest;
  std::vector<Wanted> wanted;
  std::vector<int> layer_order;
  std::map<int, LayerTensors> layer_tensors;  // each file's entries, as the prechecks saw them
  // First, on every rank, whatever can be refused without reading a byte (the manifest, every
  // file's entries and size): a refusal of that kind changes nothing in any rank's model.
  RunAndAgree(
      comm.world(),
      [&] {
        manifest = ReadManifest(step_dir, config.values());
        std::map<std::string, int> layer_of;  // tensor name -> layer_id, for a tied copy's owner
        for (const TensorEntry& entry : manifest.tensors())
          layer_of[entry.name()] = entry.layer_id();
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
        for (int layer_id : layer_order) {
          layer_tensors[layer_id] =
              PrecheckLayerFile(step_dir, manifest, layer_id, expected[layer_id]);
        }
      },
      step_dir + ": another rank refused the checkpoint");
  // Then file by file, each streamed straight into the tensors while it is verified.
  RunAndAgree(
      comm.world(),
      [&] {
        for (int layer_id : layer_order) {
          const LayerTensors& tensors = layer_tensors.at(layer_id);
          std::vector<Destination> destinations;
          for (const Wanted& w : wanted) {
            if (w.layer_id != layer_id) continue;
            std::array<memory::Tensor*, 3> targets = {&w.param->value, nullptr, nullptr};
            if (w.optimizer_state) std::tie(targets[1], targets[2]) = adamw.MomentsToLoad(w.param);
            const int64_t element = memory::DTypeSize(w.param->value.dtype());
            for (int k = 0; k < (w.optimizer_state ? 3 : 1); ++k) {
              if (!targets[k]) continue;  // an empty ZeRO slice
              Destination& d = destinations.emplace_back();
              // Present with the expected shape: the precheck said so.
              d.file_offset = tensors.at(w.name + "#" + kKinds[k])->offset();
              d.device = targets[k]->device();
              if (w.shard.sliced()) {  // tp: the whole tensor, cut once verified
                d.end = F32Bytes(w.shard.full_shape);
                d.staging.resize(static_cast<size_t>(d.end));
                d.shard = w.shard;
                d.target = targets[k];
                continue;
              }
              // A moment's ZeRO slice starts at StateBegin; everything else is whole.
              d.begin = k > 0 ? adamw.StateBegin(w.param) * element : 0;
              d.end = d.begin + targets[k]->bytes();
              d.to = static_cast<char*>(targets[k]->raw());
            }
          }
          VerifyLayerFile(step_dir, manifest, layer_id, {},
                          [&](const char* data, int64_t offset, int64_t bytes) {
                            for (Destination& d : destinations) Deliver(d, data, offset, bytes);
                          });
          for (Destination& d : destinations) {
            if (!d.target) continue;
            std::vector<char> local(d.target->bytes());
            layer::FullToLocal(d.shard, d.staging.data(), local.data(),
                               memory::DTypeSize(d.target->dtype()));
            d.target->CopyFromHost(local.data());
          }
        }
      },
      step_dir + ": another rank could not load its layers");
  return manifest.next_step();
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
  // Where training stands in the data (docs/data.md, blends).
  if (manifest.has_data()) {
    std::vector<std::string> drawn;
    for (const DatasetDrawn& dataset : manifest.data().datasets()) {
      drawn.push_back(util::Format("%s (weight %.4g) %lld tokens", dataset.path().c_str(),
                                   dataset.weight(), static_cast<long long>(dataset.tokens())));
    }
    lines->push_back(
        util::Printable(util::Format("  data: next sample %lld | trained on ",
                                     static_cast<long long>(manifest.data().next_sample())) +
                        util::Join(drawn, ", ")));
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
