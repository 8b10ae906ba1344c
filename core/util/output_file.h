#ifndef BIGMAC_CORE_UTIL_OUTPUT_FILE_H_
#define BIGMAC_CORE_UTIL_OUTPUT_FILE_H_

#include <memory>
#include <stdexcept>
#include <streambuf>
#include <string>
#include <string_view>
#include <vector>

namespace bigmac::util {

// The checked writers every output of every command goes through (checkpoints have their own,
// core/checkpoint, with the same rules). Every write, fsync, close and rename is checked, and a
// file is never left looking complete when it is not (docs/reliability.md, "Outputs"):
//  - OutputFile: a file written whole (trace.json, --dump, reports, safetensors, batches): the
//    bytes go to a temporary file beside it, and one rename puts them in place once all are on
//    disk. On failure the temporary is removed and an earlier file at the path is untouched.
//  - RecordFile: a file that grows while a run goes (metrics.jsonl, TensorBoard events): each
//    record is written whole or not at all; after a failure the file is cut back to its last
//    whole record and renamed <path>.incomplete.
// New files get 0666 less the umask; a replaced file keeps its mode. A symbolic link is written
// through, where it leads (WrittenPath). Problems name the path and the OS's reason.

// An output that could not be written (exit 8, docs/exit_codes.md): the message names the path and
// the OS's reason. Thrown by writers that report by exception (shards, the tokenizer manifest,
// safetensors); the commands map it to kExitOutput.
class OutputError : public std::runtime_error {
 public:
  explicit OutputError(const std::string& problem) : std::runtime_error(problem) {}
};

// Owns its temporary file until Commit; destroying it uncommitted removes the temporary.
class OutputFile {
 public:
  // Null and *problem when the temporary cannot be created.
  static std::unique_ptr<OutputFile> Open(const std::string& path, std::string* problem);

  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile();

  // Appends `bytes`. After a failure it does nothing more; Commit reports the failure.
  void Write(std::string_view bytes);
  // fsync, close, rename onto the path: "" or the problem (the path is then untouched).
  std::string Commit();

  const std::string& path() const { return path_; }

 private:
  OutputFile(std::string path, std::string target, std::string temporary, int fd,
             std::vector<std::string> created);
  void Fail(const std::string& what, int error);

  std::string path_;       // as the user named it
  std::string target_;     // where a write lands (links followed)
  std::string temporary_;  // beside target_
  int fd_;
  std::vector<std::string> created_;  // directories Open made, removed if not committed
  size_t written_ = 0;
  std::string problem_;
};

// A std::streambuf over an OutputFile, for writers that stream into a std::ostream (the
// schedule's trace), writing in pieces of 1 MiB (unbuffered, the trace of `bigmac schedule --pp
// 1024 --microbatches 1024` took some 55 million write calls, 37 s in the kernel). Does not own the
// file, which must outlive it; flush the stream before the file's Commit (what is still buffered
// when it is destroyed is dropped). Failures show in the file's Commit.
class OutputFileBuffer : public std::streambuf {
 public:
  explicit OutputFileBuffer(OutputFile* file);
  OutputFileBuffer(const OutputFileBuffer&) = delete;
  OutputFileBuffer& operator=(const OutputFileBuffer&) = delete;

 protected:
  int_type overflow(int_type c) override;
  int sync() override;

 private:
  void WriteBuffered();

  OutputFile* file_;
  std::vector<char> buffer_;
};

// Writes `contents` to `path` whole or not at all (OutputFile): "" or the problem.
std::string WriteWholeFile(const std::string& path, std::string_view contents);

// Owns the open file. Records are appended and flushed to the OS one at a time, so a reader
// (tail -f, TensorBoard) sees whole records while the run goes.
class RecordFile {
 public:
  // Creates (or empties) `path`. Null and *problem when it cannot.
  static std::unique_ptr<RecordFile> Create(const std::string& path, std::string* problem);

  RecordFile(const RecordFile&) = delete;
  RecordFile& operator=(const RecordFile&) = delete;
  ~RecordFile();

  // Appends one record whole. False when it is not written (now, or after an earlier failure);
  // the first failure cuts the file back to its last whole record, renames it <path>.incomplete
  // and sets problem(). Later records are dropped.
  bool Append(std::string_view record);
  // fsync and close: false (and problem()) when that fails; the file is then renamed too.
  bool Close();

  bool failed() const { return !problem_.empty(); }
  const std::string& problem() const { return problem_; }
  const std::string& path() const { return path_; }

 private:
  RecordFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  void Fail(const std::string& what, int error);

  std::string path_;
  int fd_;
  size_t whole_bytes_ = 0;  // the end of the last whole record
  size_t records_ = 0;
  std::string problem_;
};

}  // namespace bigmac::util

#endif  // BIGMAC_CORE_UTIL_OUTPUT_FILE_H_
