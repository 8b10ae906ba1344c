#include "core/checkpoint/output_guard.h"

#include <filesystem>
#include <system_error>

namespace bigmac::checkpoint {
namespace fs = std::filesystem;
namespace {

bool IsStepName(const std::string& name) {
  return name.rfind("step_", 0) == 0 || name.rfind(".tmp_step_", 0) == 0 ||
         name.rfind(".replaced_step_", 0) == 0;
}

bool Exists(const fs::path& path) {
  std::error_code error;
  return fs::exists(path, error);
}

}  // namespace

bool HoldsCheckpoints(const std::string& dir) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) return false;
  // `latest` the pointer file, not a directory of that name (train.output_dir is runs/latest).
  if (fs::is_regular_file(fs::path(dir) / "latest", error)) return true;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    if (IsStepName(it->path().filename().string()) && Exists(it->path() / "manifest.pb"))
      return true;
  }
  return false;
}

std::string CheckNotInCheckpoint(const std::string& path, const std::string& what) {
  std::error_code error;
  // Symbolic links resolved for the part that exists: a link into a checkpoint is inside it.
  fs::path full = fs::weakly_canonical(fs::absolute(path, error), error);
  if (error) return "";  // CheckOutputDir/CheckOutputFile report paths the OS refuses
  const std::string name = full.filename().string();
  if ((name == "latest" || IsStepName(name)) && HoldsCheckpoints(full.parent_path().string())) {
    return what + " " + path + ": would replace '" + name + "' of the checkpoint directory " +
           full.parent_path().string() + "; write somewhere else";
  }
  for (fs::path dir = full; !dir.empty(); dir = dir.parent_path()) {
    if (Exists(dir / "manifest.pb")) {
      return what + " " + path + ": lies inside the checkpoint " + dir.string() +
             ", whose files its manifest names; write somewhere else";
    }
    if (dir == dir.root_path()) break;
  }
  return "";
}

}  // namespace bigmac::checkpoint
