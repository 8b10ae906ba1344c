#include "core/cli/startup_checks.h"

#include <sys/stat.h>

#include <cerrno>
#include <exception>
#include <filesystem>

#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/output_guard.h"
#include "core/checkpoint/resume_preview.h"
#include "core/cli/exit_codes.h"
#include "core/data/blend.h"
#include "core/data/error.h"
#include "core/data/tokenizer.h"
#include "core/util/files.h"
#include "core/util/format.h"
#include "stages/gpt/cuda/constraints.h"

namespace bigmac::cli {
namespace {

// "checkpoint.dir (config.yaml:4)".
std::string KeyWithSource(const config::ResolvedConfig& resolved, const std::string& key) {
  return key + " (" + resolved.sources().Get(key).ToString() + ")";
}

// A layer file the manifest names: present, regular, of its size (what Load checks first).
std::string CheckLayerFile(const std::string& path, int64_t bytes) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) {
    return errno == ENOENT ? path + ": missing (cannot open)"
                           : path + ": cannot open: " + util::OsReason(errno);
  }
  if (!S_ISREG(info.st_mode)) return path + ": not a regular file";
  if (info.st_size != bytes) {
    return path + ": " + std::to_string(info.st_size) + " bytes, the manifest says " +
           std::to_string(bytes) + " (truncated or altered)";
  }
  return "";
}

}  // namespace

std::string OutputDirProblem(const std::string& label, const std::string& dir) {
  if (std::string problem = util::CheckOutputDir(dir); !problem.empty()) {
    return label + ": " + problem;
  }
  return checkpoint::CheckNotInCheckpoint(dir, label);
}

std::string OutputFileProblem(const std::string& label, const std::string& file, bool overwrite) {
  if (std::string problem = util::CheckOutputFile(file); !problem.empty()) {
    return label + ": " + problem;
  }
  if (std::string problem = checkpoint::CheckNotInCheckpoint(file, label); !problem.empty())
    return problem;
  return ReplaceProblem(label, {file}, overwrite);
}

std::string ReplaceProblem(const std::string& label, const std::vector<std::string>& files,
                           bool overwrite) {
  if (overwrite) return "";
  for (const std::string& file : files) {
    std::string target;  // a link is replaced where it leads, so that is what must be free
    struct stat info;
    if (!util::WrittenPath(file, &target).empty() || lstat(target.c_str(), &info) == 0) {
      return label + ": " + file + " exists; pass --overwrite to replace it (nothing was written)";
    }
  }
  return "";
}

StartupCheck CheckTrainOutputs(const config::ResolvedConfig& resolved, const std::string& dump,
                               bool overwrite) {
  StartupCheck check;
  check.exit_code = kExitOutput;
  const config::Config& cfg = resolved.values();
  auto add = [&check](const std::string& problem) {
    if (!problem.empty()) check.problems.push_back(problem);
  };
  // The fixed names a run writes in a directory must be writable files too: a directory called
  // `latest` would otherwise fail the first save, hours in.
  auto fixed_names = [&add](const std::string& label, const std::string& dir,
                            std::initializer_list<const char*> names) {
    for (const char* name : names) {
      const std::string path = dir + "/" + name;
      struct stat info;
      if (lstat(path.c_str(), &info) != 0) continue;
      if (std::string problem = util::CheckOutputFile(path); !problem.empty())
        add(label + ": " + problem);
    }
  };
  if (const std::string& dir = cfg.checkpoint().dir(); !dir.empty()) {
    const std::string label = KeyWithSource(resolved, "checkpoint.dir");
    if (std::string problem = OutputDirProblem(label, dir); !problem.empty()) {
      add(problem);
    } else {
      fixed_names(label, dir, {"latest"});
    }
  }
  if (const std::string& dir = cfg.train().output_dir(); !dir.empty()) {
    const std::string label = KeyWithSource(resolved, "train.output_dir");
    if (std::string problem = OutputDirProblem(label, dir); !problem.empty()) {
      add(problem);
    } else {
      fixed_names(label, dir, {"metrics.jsonl", "trace.json"});
    }
  }
  if (!dump.empty()) {
    add(OutputDirProblem("--dump", dump));
    // The files of an earlier dump (engine::DumpWeights): losses.txt, tied_copy.bin, layer_*.f32.
    std::vector<std::string> earlier = {dump + "/losses.txt", dump + "/tied_copy.bin"};
    std::error_code error;
    for (std::filesystem::directory_iterator it(dump, error), end; !error && it != end;
         it.increment(error)) {
      const std::string name = it->path().filename().string();
      if (name.rfind("layer_", 0) == 0 && name.size() > 4 &&
          name.compare(name.size() - 4, 4, ".f32") == 0) {
        earlier.push_back(it->path().string());
      }
    }
    add(ReplaceProblem("--dump", earlier, overwrite));
  }
  return check;
}

StartupCheck LockTrainOutputs(const config::ResolvedConfig& resolved, bool dry_run,
                              std::vector<std::unique_ptr<util::DirectoryLock>>* held) {
  StartupCheck check;
  check.exit_code = kExitOutput;
  const config::Config& cfg = resolved.values();
  std::vector<std::string> locked;  // directories already claimed, to lock a shared one once
  for (const char* key : {"checkpoint.dir", "train.output_dir"}) {
    const std::string& dir =
        std::string(key) == "checkpoint.dir" ? cfg.checkpoint().dir() : cfg.train().output_dir();
    if (dir.empty()) continue;
    bool same = false;
    for (const std::string& other : locked) {
      std::error_code error;
      same = same || std::filesystem::equivalent(dir, other, error) || dir == other;
    }
    if (same) continue;
    locked.push_back(dir);
    const std::string label = KeyWithSource(resolved, key);
    if (dry_run) {
      if (std::string problem = util::DirectoryLock::Probe(dir, label); !problem.empty())
        check.problems.push_back(problem);
      continue;
    }
    std::string problem, note;
    std::unique_ptr<util::DirectoryLock> lock =
        util::DirectoryLock::Acquire(dir, label, "train", &problem, &note);
    if (!lock) {
      check.problems.push_back(problem);
      held->clear();  // every lock or none
      return check;
    }
    if (!note.empty()) check.summary += (check.summary.empty() ? "" : "\n") + note;
    held->push_back(std::move(lock));
  }
  return check;
}

StartupCheck CheckResumeSource(const config::ResolvedConfig& resolved, const std::string& resume,
                               bool allow_data_change) {
  StartupCheck check;
  check.exit_code = kExitCheckpoint;
  if (resume.empty()) return check;
  const config::Config& cfg = resolved.values();
  const std::string& root = cfg.checkpoint().dir();
  try {
    if (resume == "auto" && root.empty()) {
      check.exit_code = kExitConfig;
      check.problems.push_back(
          "--resume auto needs checkpoint.dir (where the run's checkpoints are); name a "
          "checkpoint with --resume DIR instead");
      return check;
    }
    const std::string step_dir = checkpoint::ResolveStepDir(resume, root);
    if (step_dir.empty()) {
      check.summary = "--resume auto: no checkpoint in " + root + " yet; the run starts fresh";
      return check;
    }
    // The tokenizer first: data of another vocabulary also changes the model's shapes, and the
    // data is what to fix (exit 5).
    data::CheckSameTokenizer(checkpoint::ReadCheckedManifest(step_dir).tokenizer(),
                             data::DataHome(resolved.data, cfg.data().dir()), step_dir);
    const checkpoint::Manifest manifest = checkpoint::ReadManifest(step_dir, cfg);
    if (const std::vector<std::string> changes =
            checkpoint::BlendChanges(manifest.config(), resolved);
        !changes.empty() && !allow_data_change) {
      if (check.problems.empty()) check.exit_code = kExitConfig;
      check.problems.push_back(
          "--resume " + resume + ": the checkpoint " + step_dir +
          " was trained on other data: " + util::Join(changes, "; ") +
          ". Every later batch and the per-dataset counts would change; pass "
          "--allow-data-change to continue with the new data (each dataset it keeps, by path, "
          "keeps its count), or resume with the saved data.path and data.split");
    }
    for (const checkpoint::LayerFile& file : manifest.files()) {
      if (std::string problem = CheckLayerFile(step_dir + "/" + file.file(), file.bytes());
          !problem.empty()) {
        check.problems.push_back(problem);
      }
    }
    const int64_t max_steps = cfg.train().max_steps();
    if (manifest.step() >= max_steps) {
      if (check.problems.empty()) check.exit_code = kExitConfig;
      check.problems.push_back("--resume " + resume + ": the checkpoint " + step_dir +
                               " is at step " + std::to_string(manifest.step()) + " and " +
                               "train.max_steps=" + std::to_string(max_steps) + " (" +
                               resolved.sources().Get("train.max_steps").ToString() + ")" +
                               ": no step is left to train; raise train.max_steps above " +
                               std::to_string(manifest.step()) + " to train further");
    }
    check.summary = "resume from " + step_dir + " at step " + std::to_string(manifest.step()) +
                    " of " + std::to_string(max_steps) + ": the manifest matches the model, " +
                    std::to_string(manifest.files_size()) + " layer files present (not read)";
    for (const std::string& line : checkpoint::DescribeResume(manifest, resolved))
      check.summary += "\n  " + line;
  } catch (const checkpoint::CheckpointError& error) {
    check.problems.push_back(error.what());
  } catch (const data::DataError& error) {
    check.exit_code = kExitBadData;
    check.problems.push_back(error.what());
  } catch (const std::exception& error) {  // std::filesystem_error: a path the OS refuses
    check.problems.push_back("--resume " + resume + ": " + error.what());
  }
  return check;
}

std::vector<std::string> UnsupportedForTraining(const config::ResolvedConfig& resolved) {
  const config::Config& values = resolved.values();
  std::vector<std::string> missing;
  if (resolved.backend == ::bigmac::device::Backend::kCuda) {
    if (values.parallel().tp_size() != 1) {
      missing.push_back("parallel.tp_size=" + std::to_string(values.parallel().tp_size()) +
                        " with device.backend=cuda: tensor parallelism runs on the CPU backend "
                        "only (rule: tp_size > 1 needs device.backend=cpu until the CUDA layers "
                        "have tensor-parallel slices; the tp layers are CPU code)");
    }
    for (std::string& problem : stages::gpt::cuda::CudaModelProblems(config::ModelDimsOf(values)))
      missing.push_back(std::move(problem));
  }
  return missing;
}

}  // namespace bigmac::cli
