#ifndef BIGMAC_CORE_UTIL_DIR_LOCK_H_
#define BIGMAC_CORE_UTIL_DIR_LOCK_H_

#include <memory>
#include <string>
#include <vector>

namespace bigmac::util {

// The lock file every directory a run writes carries (checkpoint.dir, train.output_dir,
// `ckpt import --output`).
inline constexpr char kLockFileName[] = ".bigmac.lock";

// One run's claim on an output directory, so that two runs sharing it fail at start-up instead of
// replacing each other's steps and `latest` (docs/reliability.md, "One run per directory").
//
// It is an open-file-description lock (F_OFD_SETLK) on <dir>/.bigmac.lock: the kernel drops it
// when the holder exits, however it exits, so a lock left by a dead process is stale by
// construction and is taken over with a note. The file's text names the holder (host, pid, start
// time, command) for the message the next run prints. NFSv4, Lustre (mounted with `flock`) and
// GPFS carry the lock across nodes; a filesystem without locks costs a warning, not the run.
//
// Owned by the command that writes the directory, for as long as it writes it; destroying it
// removes the file (while still holding it) and the directories Acquire created if they are
// empty, so a run that stops at start-up leaves nothing behind. Acquire checks that the file it
// locked is still the one at the path, so a file removed under a waiting process cannot give
// two holders. Not copyable.
class DirectoryLock {
 public:
  // Creates `dir` (and its parents, with the umask's modes) if needed, and takes the lock.
  // Returns null and sets *problem when another process holds it ("<label>: <dir> is in use by
  // bigmac train on host h (pid 12, started 2026-12-02 17:40:01 UTC)...") or when the lock file
  // cannot be made. *note is set to a line worth printing (a stale lock taken over, a filesystem
  // without locks), or cleared. `label` names the option ("checkpoint.dir (config.yaml:4)").
  static std::unique_ptr<DirectoryLock> Acquire(const std::string& dir, const std::string& label,
                                                const std::string& command, std::string* problem,
                                                std::string* note);

  // Without taking the lock or creating anything (--dry-run): "" when no live process holds it,
  // or the same problem Acquire would give.
  static std::string Probe(const std::string& dir, const std::string& label);

  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  ~DirectoryLock();

  const std::string& path() const { return path_; }

 private:
  DirectoryLock(std::string path, int fd, std::vector<std::string> created)
      : path_(std::move(path)), fd_(fd), created_(std::move(created)) {}

  std::string path_;                  // <dir>/.bigmac.lock
  int fd_;                            // holds the lock; -1 on a filesystem without locks
  std::vector<std::string> created_;  // directories Acquire made, innermost first
};

}  // namespace bigmac::util

#endif  // BIGMAC_CORE_UTIL_DIR_LOCK_H_
