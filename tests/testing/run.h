#ifndef BIGMAC_TESTS_TESTING_RUN_H_
#define BIGMAC_TESTS_TESTING_RUN_H_

#include <string>

namespace bigmac::testutil {

struct RunResult {
  int exit_code = -1;  // 124: killed by the deadline
  std::string output;  // stdout and stderr, interleaved
  double seconds = 0;
};

// Runs `command` through /bin/sh with a hard deadline (a hang fails the test instead of stalling
// it).
RunResult RunCommand(const std::string& command, int deadline_seconds = 120);

// Path of a runfile of this workspace, e.g. Runfile("bigmac") or Runfile("configs/tiny_pp4.yaml").
std::string Runfile(const std::string& path);

// The test's temporary directory (Bazel's TEST_TMPDIR, else /tmp).
std::string TempDir();

// The bigmac binary of this workspace (a runfile).
std::string Bigmac();

// A new, empty directory `name` under the test's temporary directory (anything there before is
// removed); returns its path.
std::string FreshDir(const std::string& name);

// A fresh file under the test's temporary directory holding `contents`; returns its path.
std::string WriteTempFile(const std::string& name, const std::string& contents);

// "mpirun -np N --oversubscribe" with the settings the CPU tests need (see launch/README), and the
// Open MPI path the messages take: "copy" (shared memory without single-copy, the default: the
// slowest path on one host), "cma" (with single-copy) or "tcp" (as between hosts). An empty `path`
// takes $BIGMAC_TEST_MPI_PATH, so that a test target can run a whole test over another path.
std::string Mpirun(int ranks, const std::string& path = "");

// Token shards of `text` made by `bigmac data prep` under the test's temporary directory, once per
// `name` and test binary; returns their directory.
std::string PrepareShards(const std::string& name, const std::string& text);

// The whole file at `path` as bytes ("" when it cannot be read).
std::string ReadFile(const std::string& path);

// Slurm and munge processes still alive, one "STAT COMM" line each ("" when none; zombies, the
// VM's init reaping late, are not counted): what a Slurm test must leave behind.
std::string LiveSlurmDaemons();

// Number of (possibly overlapping) occurrences of `needle` in `text`.
int CountOccurrences(const std::string& text, const std::string& needle);

}  // namespace bigmac::testutil

#endif  // BIGMAC_TESTS_TESTING_RUN_H_
