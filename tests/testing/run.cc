#include "tests/testing/run.h"

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "core/util/process.h"

namespace bigmac::testutil {

RunResult RunCommand(const std::string& command, int deadline_seconds) {
  const util::ChildResult child = util::RunChild(command, deadline_seconds);
  return RunResult{child.exit_code, child.output, child.seconds};
}

std::string Runfile(const std::string& path) {
  const char* root = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (!root) return path;  // run by hand from the workspace root
  return std::string(root) + "/" + (workspace ? workspace : "bigmac") + "/" + path;
}

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir ? dir : "/tmp";
}

std::string Bigmac() { return Runfile("bigmac"); }

std::string FreshDir(const std::string& name) {
  const std::string dir = TempDir() + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string WriteTempFile(const std::string& name, const std::string& contents) {
  const std::string path = TempDir() + "/" + name;
  std::ofstream(path) << contents;
  return path;
}

std::string Mpirun(int ranks, const std::string& path) {
  std::string chosen = path;
  if (chosen.empty()) {
    const char* env = std::getenv("BIGMAC_TEST_MPI_PATH");
    chosen = env && *env ? env : "copy";
  }
  std::string options;
  if (chosen == "copy") {
    options = " --mca btl self,vader --mca btl_vader_single_copy_mechanism none";
  } else if (chosen == "tcp") {
    options = " --mca btl self,tcp";
  } else if (chosen != "cma") {
    throw std::invalid_argument("Mpirun: unknown Open MPI path '" + chosen +
                                "' (copy, cma or tcp)");
  }
  return "mpirun -np " + std::to_string(ranks) + " --oversubscribe --bind-to none" + options;
}

std::string PrepareShards(const std::string& name, const std::string& text) {
  const std::string out = TempDir() + "/" + name + "_shards";
  const std::string corpus = WriteTempFile(name + "_corpus.txt", text);
  const RunResult r =
      RunCommand(Bigmac() + " data prep --input " + corpus + " --output " + out, 60);
  if (r.exit_code != 0) throw std::runtime_error("data prep failed: " + r.output);
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string LiveSlurmDaemons() {
  return RunCommand(
             "ps -eo stat=,comm= | awk '$1 !~ /^Z/ && ($2 == \"slurmctld\" || $2 == \"slurmd\" "
             "|| $2 == \"munged\" || $2 == \"slurmstepd\")'",
             10)
      .output;
}

int CountOccurrences(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
    ++count;
  return count;
}

}  // namespace bigmac::testutil
