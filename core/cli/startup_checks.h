#ifndef BIGMAC_CORE_CLI_STARTUP_CHECKS_H_
#define BIGMAC_CORE_CLI_STARTUP_CHECKS_H_

#include <memory>
#include <string>
#include <vector>

#include "core/config/resolve.h"
#include "core/util/dir_lock.h"

namespace bigmac::cli {

// What a start-up check found: the problems (each naming the key or flag, the path and the
// reason), the exit code they mean, and for a good resume source a line describing it.
struct StartupCheck {
  std::vector<std::string> problems;
  int exit_code = 0;
  std::string summary;
};

// "" or the problem with an output directory (file) that `label` names ("--out runs/x"): one
// that cannot be created or written (util::CheckOutputDir), or one that would replace what a
// checkpoint names (checkpoint::CheckNotInCheckpoint). For every command's outputs.
// A file that exists is replaced only with `overwrite` (--overwrite): the one rule for every
// command's outputs (docs/reliability.md, rule 9).
std::string OutputDirProblem(const std::string& label, const std::string& dir);
std::string OutputFileProblem(const std::string& label, const std::string& file, bool overwrite);

// "" unless one of `files` exists and `overwrite` is false: then "<label>: <file> exists; pass
// --overwrite to replace it".
std::string ReplaceProblem(const std::string& label, const std::vector<std::string>& files,
                           bool overwrite);

// Every location a training run writes: checkpoint.dir, train.output_dir (each when set) and
// --dump. Each must be a directory this process can create files in, or creatable, and must not
// replace what a checkpoint names; an earlier --dump is replaced only with `overwrite`. Exit code
// kExitOutput. Nothing is created.
StartupCheck CheckTrainOutputs(const config::ResolvedConfig& resolved, const std::string& dump,
                               bool overwrite);

// One run per directory: locks checkpoint.dir and train.output_dir (each when set; one lock when
// they are the same directory) for the run, creating them if needed, into *held; with `dry_run`
// only probes them and creates nothing. Problems: another live run holds one (exit kExitOutput).
// The summary holds notes worth printing (a stale lock taken over). Called on rank 0 only: the
// other ranks of the run write under its locks.
StartupCheck LockTrainOutputs(const config::ResolvedConfig& resolved, bool dry_run,
                              std::vector<std::unique_ptr<util::DirectoryLock>>* held);

// The resume source, as the trainer will resolve it: it exists, its manifest reads and matches
// the model, every layer file it names is a regular file of the size it claims (no tensor is
// read), and its step is before train.max_steps (else kExitConfig: nothing is left to train).
// Other problems: kExitCheckpoint. A checkpoint trained on another blend or split (data.path,
// data.split) is refused with kExitConfig unless `allow_data_change`. `resume` empty: nothing to
// check.
StartupCheck CheckResumeSource(const config::ResolvedConfig& resolved, const std::string& resume,
                               bool allow_data_change = false);

// Settings the config schema accepts (the dry-run and `plan` show their layouts) that training
// does not implement yet, the CUDA layers' rules among them (stages/gpt/cuda/constraints.h). Each
// names its value and what works instead. Decided from the config alone, so every rank agrees.
std::vector<std::string> UnsupportedForTraining(const config::ResolvedConfig& resolved);

}  // namespace bigmac::cli

#endif  // BIGMAC_CORE_CLI_STARTUP_CHECKS_H_
