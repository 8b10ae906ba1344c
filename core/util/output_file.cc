#include "core/util/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <utility>

#include "core/util/files.h"

namespace bigmac::util {
namespace {

// Writes all of `bytes` at the descriptor's offset: false with errno set on failure. A write that
// makes no progress is a full device, as the kernel would say on the next try.
bool WriteAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = ENOSPC;
      return false;
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

OutputFile::OutputFile(std::string path, std::string target, std::string temporary, int fd,
                       std::vector<std::string> created)
    : path_(std::move(path)),
      target_(std::move(target)),
      temporary_(std::move(temporary)),
      fd_(fd),
      created_(std::move(created)) {}

std::unique_ptr<OutputFile> OutputFile::Open(const std::string& path, std::string* problem) {
  std::string target;
  if (*problem = WrittenPath(path, &target); !problem->empty()) return nullptr;
  // As CheckOutputFile allows: a missing directory is created (mkdir -p, the umask's modes),
  // and removed again if the file does not end in place.
  std::string ignored;  // open() below names the problem
  std::vector<std::string> created = CreateDirectories(DirectoryOf(target), &ignored);
  static std::atomic<int> counter{0};
  const std::string temporary = DirectoryOf(target) + "/." + BaseName(target) + ".tmp." +
                                std::to_string(getpid()) + "." + std::to_string(counter++);
  // 0666 less the umask, as any tool's new file; a file it replaces lends its mode instead.
  const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) {
    *problem = path + ": cannot create " + temporary + ": " + OsReason(errno);
    RemoveCreatedDirectories(created);
    return nullptr;
  }
  struct stat old;
  if (stat(target.c_str(), &old) == 0 && S_ISREG(old.st_mode)) fchmod(fd, old.st_mode & 07777);
  return std::unique_ptr<OutputFile>(
      new OutputFile(path, target, temporary, fd, std::move(created)));
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) close(fd_);
  if (!temporary_.empty()) {  // not committed
    unlink(temporary_.c_str());
    RemoveCreatedDirectories(created_);
  }
}

void OutputFile::Fail(const std::string& what, int error) {
  if (problem_.empty()) problem_ = path_ + ": " + what + ": " + OsReason(error);
}

void OutputFile::Write(std::string_view bytes) {
  if (!problem_.empty()) return;
  if (!WriteAll(fd_, bytes)) {
    Fail("write failed after " + std::to_string(written_) + " bytes", errno);
    return;
  }
  written_ += bytes.size();
}

OutputFileBuffer::OutputFileBuffer(OutputFile* file) : file_(file), buffer_(size_t{1} << 20) {
  setp(buffer_.data(), buffer_.data() + buffer_.size());
}

void OutputFileBuffer::WriteBuffered() {
  if (pptr() > pbase()) file_->Write(std::string_view(pbase(), pptr() - pbase()));
  setp(buffer_.data(), buffer_.data() + buffer_.size());
}

OutputFileBuffer::int_type OutputFileBuffer::overflow(int_type c) {
  WriteBuffered();
  if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
  *pptr() = traits_type::to_char_type(c);
  pbump(1);
  return c;
}

int OutputFileBuffer::sync() {
  WriteBuffered();
  return 0;
}

std::string OutputFile::Commit() {
  // A full disk can show first at fsync or close (delayed allocation, NFS): both are checked.
  if (problem_.empty() && fsync(fd_) != 0) Fail("fsync failed", errno);
  const int fd = fd_;
  fd_ = -1;
  if (close(fd) != 0) Fail("close failed", errno);
  if (problem_.empty() && rename(temporary_.c_str(), target_.c_str()) != 0)
    Fail("cannot rename " + temporary_ + " onto it", errno);
  if (problem_.empty()) temporary_.clear();  // in place: nothing to remove
  if (!problem_.empty()) problem_ += " (nothing was written; an earlier file there is untouched)";
  return problem_;
}

std::string WriteWholeFile(const std::string& path, std::string_view contents) {
  std::string problem;
  std::unique_ptr<OutputFile> file = OutputFile::Open(path, &problem);
  if (!file) return problem;
  file->Write(contents);
  return file->Commit();
}

std::unique_ptr<RecordFile> RecordFile::Create(const std::string& path, std::string* problem) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) {
    *problem = path + ": cannot create: " + OsReason(errno);
    return nullptr;
  }
  return std::unique_ptr<RecordFile>(new RecordFile(path, fd));
}

RecordFile::~RecordFile() {
  if (fd_ >= 0) close(fd_);
}

void RecordFile::Fail(const std::string& what, int error) {
  if (!problem_.empty()) return;
  // Cut back to whole records (this frees space, so it works on a full disk), then rename, so
  // that no reader takes the file for a complete one.
  const bool cut = ftruncate(fd_, static_cast<off_t>(whole_bytes_)) == 0 &&
                   lseek(fd_, static_cast<off_t>(whole_bytes_), SEEK_SET) >= 0;
  const std::string incomplete = path_ + ".incomplete";
  const bool renamed = std::rename(path_.c_str(), incomplete.c_str()) == 0;
  problem_ = path_ + ": " + what + " after " + std::to_string(records_) +
             " whole records: " + OsReason(error) + "; " +
             (cut ? "cut back to those records" : "could not cut back to those records") +
             (renamed ? " and renamed " + incomplete : ", and could not rename it") +
             "; later records are not written";
}

bool RecordFile::Append(std::string_view record) {
  if (!problem_.empty()) return false;
  if (!WriteAll(fd_, record)) {
    Fail("write failed", errno);
    return false;
  }
  whole_bytes_ += record.size();
  ++records_;
  return true;
}

bool RecordFile::Close() {
  if (fd_ < 0) return problem_.empty();
  if (problem_.empty() && fsync(fd_) != 0) Fail("fsync failed", errno);
  const int fd = std::exchange(fd_, -1);
  if (close(fd) != 0 && problem_.empty()) {
    const std::string incomplete = path_ + ".incomplete";
    problem_ =
        path_ + ": close failed: " + OsReason(errno) +
        (std::rename(path_.c_str(), incomplete.c_str()) == 0 ? "; renamed " + incomplete : "");
  }
  return problem_.empty();
}

}  // namespace bigmac::util
