#ifndef BIGMAC_CORE_CHECKPOINT_CHECKPOINT_H_
#define BIGMAC_CORE_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/checkpoint/checkpoint.pb.h"
#include "core/checkpoint/model_state.h"
#include "core/comm/pipeline_comm.h"
#include "core/config/resolve.h"
#include "core/optim/adamw.h"
#include "core/util/fault_plan.h"

namespace bigmac::checkpoint {

// A checkpoint that cannot be written or used; the message names the file and the problem.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A problem with one layer file: what() is the sentence Load reports (naming the file), status()
// its short form in `ckpt inspect`'s table ("MISSING", "UNREADABLE", "SIZE 1000 != 152448",
// "CHECKSUM MISMATCH", "BAD TENSOR"), printed there before the same sentence.
class LayerFileError : public CheckpointError {
 public:
  LayerFileError(std::string status, const std::string& message)
      : CheckpointError(message), status_(std::move(status)) {}
  const std::string& status() const { return status_; }

 private:
  std::string status_;
};

inline constexpr int kFormatVersion = 1;
// The dtype of the master weights and AdamW moments, the only one checkpoints hold (whatever
// precision.dtype computes in).
inline constexpr char kMasterDType[] = "f32";

// "step_000100".
std::string StepDirName(int64_t step);
// The file of one layer_id: "embedding.bin", "block_0003.bin", "head.bin".
std::string LayerFileName(int layer_id, int num_layers);

struct SaveStats {
  std::string dir;  // the final step directory
  int64_t step = 0;
  int64_t bytes = 0;            // written by all ranks
  double seconds = 0;           // from the snapshot to the commit
  double snapshot_seconds = 0;  // rank 0's copy into host memory: what a step waits for
  double write_seconds = 0;     // rank 0's writes and fsyncs (on a background thread if async)
  double wait_seconds = 0;      // rank 0's step loop blocked on the write (see Saver)
  bool async = false;
};

// Collective. Writes step `step` under `root` synchronously (core/checkpoint/saver.h has the
// asynchronous form): every rank writes the files of the layers in `state` (with dp > 1,
// layer_id k is written by replica k mod dp) into a temporary directory and fsyncs them; rank 0
// writes the manifest, fsyncs, renames the directory into place, fsyncs `root`, then replaces the
// `latest` pointer, and deletes all but the newest `keep_last` checkpoints. A failure anywhere
// leaves the previous checkpoints untouched and throws CheckpointError on every rank.
// `tokenizer` (rank 0's) goes into the manifest. `faults`: what a reliability test injects.
SaveStats Save(const std::string& root, int64_t step, const config::ResolvedConfig& config,
               const ModelState& state, const optim::AdamW& adamw, comm::PipelineComm& comm,
               int keep_last, const std::string& tokenizer = "",
               const util::FaultPlan& faults = {});

// "auto": the step directory `root/latest` names, or "" if there is none yet. Anything else is a
// step directory, or a checkpoint root with a `latest` pointer. Throws CheckpointError.
std::string ResolveStepDir(const std::string& resume, const std::string& root);

// Reads `step_dir`/manifest.pb and checks everything it claims that can be checked without the
// model: not empty, parses, this format version, and its claims about files and tensors. Throws
// CheckpointError.
Manifest ReadCheckedManifest(const std::string& step_dir);

// The config snapshot a checkpoint was saved with. Throws CheckpointError.
config::Config ReadManifestConfig(const std::string& step_dir);

// Reads and checks `step_dir`/manifest.pb (format, model shape against `config`).
Manifest ReadManifest(const std::string& step_dir, const config::Config& config);

// A tensor the model needs from a layer file: "block 3/attn.qkv.weight#exp_avg" and its shape.
struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
};

// The manifest's entries of a layer file's tensors by name (pointing into the manifest, which
// must outlive them).
using LayerTensors = std::map<std::string, const TensorEntry*>;

// Where a layer file's bytes go as they are read: each chunk in order, `data` holding the file's
// bytes [offset, offset + bytes).
using FileChunkSink = std::function<void(const char* data, int64_t offset, int64_t bytes)>;

// The one check of a layer file, shared by Load and Inspect: the manifest lists a file for
// `layer_id`, and in it each of `expected` with its shape; the file has the manifest's size and
// CRC-32; every tensor the manifest places in it is f32, as many bytes as its shape, inside the
// file, matches its own CRC-32 (so a manifest cannot point one tensor at another's bytes), and
// comes as a value with its two AdamW moments. The file is read once, in large chunks handed to
// `sink` (may be empty) as the checksums are computed: what a sink got is verified only when this
// returns. Throws LayerFileError naming the file and the first problem.
LayerTensors VerifyLayerFile(const std::string& step_dir, const Manifest& manifest, int layer_id,
                             const std::vector<ExpectedTensor>& expected,
                             const FileChunkSink& sink = {});
// VerifyLayerFile's checks that need none of the file's bytes (the manifest's entries, the
// expected tensors, the file's size), so that a load can refuse before it reads any file.
LayerTensors PrecheckLayerFile(const std::string& step_dir, const Manifest& manifest, int layer_id,
                               const std::vector<ExpectedTensor>& expected);

// Collective. Loads the parameters of `state` (master values and AdamW moments; a tied copy's value
// from its owner's file) from `step_dir`, whatever layout the checkpoint was saved with. The
// manifest and every file's presence and size are checked against the model (shapes, every
// tensor present), and the ranks agree, before any file is read, so such a refusal changes
// nothing; each file then streams straight
// into the parameters and moments (`adamw`'s state, created if it has none) and is verified as it
// is read (CRC-32 of the file and of each tensor). Nothing on disk changes. Returns the step to
// continue from. Throws CheckpointError on every rank if any rank failed; after a checksum
// mismatch the model and the moments may hold part of the checkpoint, and the caller must not go
// on with them (every caller stops: exit 7).
int64_t Load(const std::string& step_dir, const config::ResolvedConfig& config,
             const ModelState& state, optim::AdamW& adamw, comm::PipelineComm& comm);

// `bigmac ckpt inspect`: the manifest and every file's size and checksum status, one line each.
// Returns false if anything is damaged or missing.
bool Inspect(const std::string& step_dir, std::vector<std::string>* lines);

}  // namespace bigmac::checkpoint

#endif  // BIGMAC_CORE_CHECKPOINT_CHECKPOINT_H_
