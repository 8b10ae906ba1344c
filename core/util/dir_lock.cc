#include "core/util/dir_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <filesystem>
#include <system_error>

#include "core/util/files.h"
#include "core/util/process.h"

namespace bigmac::util {
namespace {

// The holder's line: "bigmac train on host h (pid 12, started 2026-12-02 17:40:01 UTC)".
std::string HolderLine(const std::string& command) {
  const std::string host = HostName();
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char started[32];
  std::strftime(started, sizeof(started), "%Y-%m-%d %H:%M:%S UTC", &utc);
  return "bigmac " + command + " on host " + host + " (pid " + std::to_string(getpid()) +
         ", started " + started + ")";
}

// The first line of the lock file (at most 512 bytes): who holds, or held, the lock.
std::string ReadHolder(int fd) {
  char buffer[512];
  const ssize_t n = pread(fd, buffer, sizeof(buffer), 0);
  if (n <= 0) return "";
  std::string text(buffer, static_cast<size_t>(n));
  if (const size_t end = text.find('\n'); end != std::string::npos) text.resize(end);
  return text;
}

std::string InUse(const std::string& label, const std::string& dir, const std::string& lock_path,
                  const std::string& holder) {
  return label + ": " + dir + " is in use by " +
         (holder.empty()
              ? "another process (it has not written its name into " + lock_path + " yet)"
              : holder) +
         ": two runs writing one directory replace each other's files; wait for that run to end, "
         "stop it, or choose another directory";
}

// Errors that mean "this filesystem has no locks", not "someone holds it".
bool LocksUnsupported(int error) {
  return error == ENOLCK || error == EOPNOTSUPP || error == ENOSYS || error == EINVAL;
}

struct flock WholeFile(short type) {
  struct flock lock {};
  lock.l_type = type;
  lock.l_whence = SEEK_SET;
  return lock;  // l_start = l_len = 0: the whole file; l_pid must be 0 for OFD locks
}

// Whether `fd` is still the file at `path`: a holder that releases removes the file, so a
// process that opened it just before must not keep a lock on a file nobody else can see.
bool StillAtPath(int fd, const std::string& path) {
  struct stat held, named;
  return fstat(fd, &held) == 0 && stat(path.c_str(), &named) == 0 && held.st_nlink > 0 &&
         held.st_dev == named.st_dev && held.st_ino == named.st_ino;
}

}  // namespace

std::unique_ptr<DirectoryLock> DirectoryLock::Acquire(const std::string& dir,
                                                      const std::string& label,
                                                      const std::string& command,
                                                      std::string* problem, std::string* note) {
  problem->clear();
  note->clear();
  std::string created_problem;
  std::vector<std::string> created = CreateDirectories(dir, &created_problem);
  if (!created_problem.empty()) {
    *problem = label + ": " + created_problem;
    return nullptr;
  }
  const std::string path = dir + "/" + kLockFileName;
  for (int attempt = 0; attempt < 100; ++attempt) {
    // O_NOFOLLOW: a link planted in the directory must not make us truncate another file.
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0666);
    if (fd < 0) {
      *problem = label + ": cannot create the lock file " + path + ": " + OsReason(errno);
      RemoveCreatedDirectories(created);
      return nullptr;
    }
    struct stat info;
    if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
      close(fd);
      *problem = label + ": " + path + " is not a regular file; remove it";
      return nullptr;
    }
    struct flock lock = WholeFile(F_WRLCK);
    if (fcntl(fd, F_OFD_SETLK, &lock) != 0) {
      const int why = errno;
      if (LocksUnsupported(why)) {
        close(fd);
        unlink(path.c_str());
        *note = "[lock] warning: " + label + ": the filesystem of " + dir + " cannot lock files (" +
                OsReason(why) + "); a second run writing this directory would not be noticed";
        return std::unique_ptr<DirectoryLock>(new DirectoryLock(path, -1, std::move(created)));
      }
      *problem = InUse(label, dir, path, ReadHolder(fd));
      close(fd);
      return nullptr;
    }
    if (!StillAtPath(fd, path)) {  // removed by the holder we waited on: try the new file
      close(fd);
      continue;
    }
    // Ours now. A name still in the file belongs to a process that ended without releasing it.
    if (const std::string stale = ReadHolder(fd); !stale.empty()) {
      *note =
          "[lock] " + label + ": took over the stale lock of " + stale + ", which no longer runs";
    }
    const std::string holder = HolderLine(command) + "\n";
    // The name is for the next run's message only: a full disk here does not stop the run.
    if (ftruncate(fd, 0) == 0) {
      [[maybe_unused]] const ssize_t n = pwrite(fd, holder.data(), holder.size(), 0);
    }
    return std::unique_ptr<DirectoryLock>(new DirectoryLock(path, fd, std::move(created)));
  }
  *problem = label + ": " + path + " keeps being replaced; another process is racing for it";
  return nullptr;
}

std::string DirectoryLock::Probe(const std::string& dir, const std::string& label) {
  const std::string path = dir + "/" + kLockFileName;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return "";  // no lock file: nobody has claimed the directory
  struct flock lock = WholeFile(F_WRLCK);
  std::string problem;
  if (fcntl(fd, F_OFD_GETLK, &lock) == 0 && lock.l_type != F_UNLCK) {
    problem = InUse(label, dir, path, ReadHolder(fd));
  }
  close(fd);
  return problem;
}

DirectoryLock::~DirectoryLock() {
  // Removed while still held (a process waiting on it then finds it gone: StillAtPath), so a
  // name left in a lock file always means a holder that died.
  if (fd_ >= 0) {
    unlink(path_.c_str());
    close(fd_);
  }
  RemoveCreatedDirectories(created_);  // those the run wrote in stay
}

}  // namespace bigmac::util
