#include "core/util/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/util/format.h"

namespace bigmac::util {
namespace {

const char* KindOf(mode_t mode) {
  if (S_ISFIFO(mode)) return "a fifo";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISDIR(mode)) return "a directory";
  return "not a regular file";
}

std::string NotRegular(const std::string& path, mode_t mode, const std::string& what) {
  if (S_ISDIR(mode)) return path + ": is a directory, not a " + what;
  return path + ": not a regular file (" + KindOf(mode) + "); a " + what +
         " must be a regular file";
}

std::string TooLarge(const std::string& path, const std::string& what, uint64_t size,
                     uint64_t max_bytes, bool at_least) {
  return path + ": " + what + " is too large: " + (at_least ? "over " : "") +
         std::to_string(at_least ? max_bytes : size) + " bytes, the limit is " +
         std::to_string(max_bytes);
}

// Every name in `path` fits NAME_MAX and the whole fits PATH_MAX; the OS says the same with
// ENAMETOOLONG, but only for the parts that exist.
std::string CheckNameLengths(const std::string& path) {
  if (path.size() >= PATH_MAX) {
    return path.substr(0, 64) + "...: the path is " + std::to_string(path.size()) +
           " bytes, the limit is " + std::to_string(PATH_MAX - 1) + ": " + OsReason(ENAMETOOLONG);
  }
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    if (end - start > NAME_MAX) {
      return path.substr(0, 64) + "...: a name in the path is " + std::to_string(end - start) +
             " bytes, the limit is " + std::to_string(NAME_MAX) + ": " + OsReason(ENAMETOOLONG);
    }
    start = end + 1;
  }
  return "";
}

// As the kernel's limit on links followed in one lookup (ELOOP).
constexpr int kMaxLinkHops = 40;

std::string Parent(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Whether this process can create entries in `dir`: tried, since permission bits do not stop
// root and a read-only mount or /proc only shows when something is created.
std::string ProbeWritable(const std::string& dir, const std::string& target) {
  std::string probe = dir + "/.bigmac_probe_XXXXXX";
  if (mkdtemp(probe.data()) == nullptr) {
    const int error = errno;
    return target + ": cannot create anything in " + dir + ": " + OsReason(error);
  }
  rmdir(probe.c_str());
  return "";
}

// "" unless `part` (a part of `path` that stat() does not find) is a symbolic link to nothing:
// stat() then says ENOENT as for a free name, but mkdir() of it fails with EEXIST at the first
// write, so the check names the link and where it leads instead of passing.
std::string DanglingLink(const std::string& path, const std::string& part) {
  struct stat info;
  if (lstat(part.c_str(), &info) != 0 || !S_ISLNK(info.st_mode)) return "";
  char target[PATH_MAX];
  const ssize_t n = readlink(part.c_str(), target, sizeof(target) - 1);
  const std::string leads = n < 0 ? "" : std::string(target, static_cast<size_t>(n));
  return path + ": " + (part == path ? "" : part + " ") + "is a symbolic link to " +
         (leads.empty() ? "a name that cannot be read" : leads) +
         ", which does not exist; a directory cannot be created through it (create its "
         "target, or name another path)";
}

}  // namespace

std::string OsReason(int error) { return std::strerror(error); }

std::string OpenUserFile(const std::string& path, uint64_t max_bytes, const std::string& what,
                         int* fd, uint64_t* size) {
  *fd = -1;
  const int opened = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (opened < 0) return path + ": cannot open the " + what + ": " + OsReason(errno);
  struct stat info;
  std::string problem;
  if (fstat(opened, &info) != 0) {
    problem = path + ": cannot read the " + what + ": " + OsReason(errno);
  } else if (!S_ISREG(info.st_mode)) {
    problem = NotRegular(path, info.st_mode, what);
  } else if (static_cast<uint64_t>(info.st_size) > max_bytes) {
    problem = TooLarge(path, what, info.st_size, max_bytes, false);
  } else if (fcntl(opened, F_SETFL, fcntl(opened, F_GETFL) & ~O_NONBLOCK) != 0) {
    problem = path + ": cannot read the " + what + ": " + OsReason(errno);
  }
  if (!problem.empty()) {
    close(opened);
    return problem;
  }
  *fd = opened;
  *size = static_cast<uint64_t>(info.st_size);
  return "";
}

std::string ReadUserFile(const std::string& path, uint64_t max_bytes, const std::string& what,
                         std::string* contents) {
  int fd = -1;
  uint64_t size = 0;
  std::string problem = OpenUserFile(path, max_bytes, what, &fd, &size);
  if (!problem.empty()) return problem;
  // The size fstat gave is read straight into the result in large reads (a checkpoint's layer
  // file is hundreds of MB); whatever follows, if the file grew, in small ones.
  contents->resize(size);
  size_t have = 0;
  char buffer[65536];
  while (true) {
    const bool sized = have < size;
    char* into = sized ? contents->data() + have : buffer;
    const size_t want = sized ? std::min<size_t>(size - have, size_t{1} << 30) : sizeof(buffer);
    const ssize_t n = read(fd, into, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      problem = path + ": cannot read the " + what + ": " + OsReason(errno);
      break;
    }
    if (n == 0) break;
    // A file that grows while it is read (or lies about its size) is still bounded.
    if (have + static_cast<size_t>(n) > max_bytes) {
      problem = TooLarge(path, what, 0, max_bytes, true);
      break;
    }
    if (!sized) contents->append(buffer, static_cast<size_t>(n));
    have += static_cast<size_t>(n);
  }
  contents->resize(std::min<size_t>(have, contents->size()));  // a file that shrank
  close(fd);
  if (!problem.empty()) contents->clear();
  return problem;
}

std::string CheckUserFile(const std::string& path, const std::string& what) {
  int fd = -1;
  uint64_t size = 0;
  const std::string problem =
      OpenUserFile(path, std::numeric_limits<uint64_t>::max(), what, &fd, &size);
  if (fd >= 0) close(fd);
  return problem;
}

std::string ResolveInside(const std::string& dir, const std::string& name, std::string* resolved) {
  const std::string quoted = "'" + Printable(name) + "'";
  if (name.empty()) return "an empty name";
  if (name.find('\0') != std::string::npos) return quoted + " holds a NUL byte";
  if (name.front() == '/') {
    return quoted + " is an absolute path; only a path inside " + dir + " is accepted";
  }
  char base[PATH_MAX];
  if (realpath(dir.c_str(), base) == nullptr) return dir + ": " + OsReason(errno);
  char target[PATH_MAX];
  if (realpath((dir + "/" + name).c_str(), target) == nullptr) {
    const int error = errno;
    if (error == ENOENT) return quoted + " is not in " + dir;
    return quoted + " in " + dir + ": " + OsReason(error);
  }
  const std::string root = base;
  const std::string path = target;
  const bool inside =
      root == "/" || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                      path[root.size()] == '/');
  if (!inside) {
    return quoted + " resolves to " + Printable(path) + ", outside " + dir + " (" + root + ")";
  }
  *resolved = path;
  return "";
}

std::string CheckOutputDir(const std::string& path) {
  if (path.empty()) return "an empty path is not a directory";
  if (std::string problem = CheckNameLengths(path); !problem.empty()) return problem;
  // The nearest part of the path that exists decides: it must be a directory we can write.
  std::string existing = path;
  while (true) {
    struct stat info;
    if (stat(existing.c_str(), &info) == 0) {
      if (!S_ISDIR(info.st_mode)) {
        return existing == path
                   ? path + ": is " + (S_ISREG(info.st_mode) ? "a file" : KindOf(info.st_mode)) +
                         ", not a directory"
                   : path + ": cannot be created: " + existing + " is not a directory";
      }
      return ProbeWritable(existing, path);
    }
    if (errno != ENOENT && errno != ENOTDIR) {
      return path + ": " + (existing == path ? "" : existing + ": ") + OsReason(errno);
    }
    if (std::string problem = DanglingLink(path, existing); !problem.empty()) return problem;
    const std::string parent = Parent(existing);
    if (parent == existing) return path + ": no part of the path exists";
    existing = parent;
  }
}

std::string CheckOutputFile(const std::string& path) {
  if (path.empty()) return "an empty path is not a file";
  if (std::string problem = CheckNameLengths(path); !problem.empty()) return problem;
  // A write goes where a symbolic link leads (WrittenPath): check that file and its directory.
  std::string target;
  if (std::string problem = WrittenPath(path, &target); !problem.empty()) return problem;
  const std::string shown = target == path ? path : path + " (a link to " + target + ")";
  struct stat info;
  if (stat(target.c_str(), &info) == 0) {
    if (S_ISDIR(info.st_mode)) return shown + ": is a directory, not a file";
    if (!S_ISREG(info.st_mode))
      return shown + ": is " + std::string(KindOf(info.st_mode)) + ", not a regular file";
    if (access(target.c_str(), W_OK) != 0) return shown + ": cannot be written: " + OsReason(errno);
  } else if (errno != ENOENT && errno != ENOTDIR) {
    return shown + ": " + OsReason(errno);
  }
  if (std::string problem = CheckOutputDir(Parent(target)); !problem.empty()) {
    return "cannot write " + shown + ": " + problem;
  }
  return "";
}

std::vector<std::string> CreateDirectories(const std::string& dir, std::string* problem) {
  std::vector<std::string> created;
  std::error_code error;
  // "a/b/" is "a/b": its parent must be "a", or "a/b" would be counted twice.
  std::filesystem::path normal = std::filesystem::path(dir).lexically_normal();
  if (!normal.has_filename() && normal.has_parent_path()) normal = normal.parent_path();
  for (std::filesystem::path part = normal; !part.empty() && !std::filesystem::exists(part, error);
       part = part.parent_path()) {
    created.push_back(part.string());
    if (part == part.parent_path()) break;
  }
  std::filesystem::create_directories(dir, error);
  if (error) {
    *problem = dir + ": cannot create: " + error.message();
    RemoveCreatedDirectories(created);
    return {};
  }
  return created;
}

void RemoveCreatedDirectories(const std::vector<std::string>& created) {
  for (const std::string& dir : created) {
    if (rmdir(dir.c_str()) != 0) break;
  }
}

std::string WrittenPath(const std::string& path, std::string* target) {
  *target = path;
  for (int hops = 0; hops < kMaxLinkHops; ++hops) {
    struct stat info;
    if (lstat(target->c_str(), &info) != 0 || !S_ISLNK(info.st_mode)) return "";
    char buffer[PATH_MAX];
    const ssize_t n = readlink(target->c_str(), buffer, sizeof(buffer) - 1);
    if (n < 0) return path + ": cannot read the symbolic link " + *target + ": " + OsReason(errno);
    const std::string leads(buffer, static_cast<size_t>(n));
    // A relative link is relative to the directory that holds it.
    *target = leads.front() == '/' ? leads : Parent(*target) + "/" + leads;
  }
  return path + ": " + OsReason(ELOOP);
}

}  // namespace bigmac::util
