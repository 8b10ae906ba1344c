#ifndef BIGMAC_CORE_METRICS_EVENT_WRITER_H_
#define BIGMAC_CORE_METRICS_EVENT_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/util/output_file.h"

namespace bigmac::metrics {

// CRC-32C (Castagnoli, as iSCSI and TFRecord use), from Intel's ISA-L.
uint32_t Crc32c(const void* data, size_t size);
// TFRecord's masked CRC-32C: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t MaskedCrc32c(const void* data, size_t size);
// One TFRecord: uint64 length, uint32 masked CRC of the length, the payload, uint32 masked CRC of
// the payload (all little-endian).
std::string TfRecord(const std::string& payload);

// Deletes the events.out.tfevents.* files in `dir` (an earlier run's, which a new run replaces as
// it replaces metrics.jsonl); returns how many. Errors are ignored: the files are a convenience.
int RemoveEventFiles(const std::string& dir);

// A TensorBoard event file, events.out.tfevents.<seconds>.<host>.<pid>, in one directory: scalars
// and text summaries as TensorBoard's Event protos (core/metrics/events.proto) in TFRecord framing.
// Each Add* appends one record whole (util::RecordFile), so a reader (or a crash) sees whole
// records; a failed write leaves the file at its last whole record, renamed .incomplete, and
// problem() says so. Owns the file; one writer per process (rank 0 of a training run).
class EventWriter {
 public:
  // Creates `dir` if needed and the file in it, with the file_version record. Returns null and
  // sets `error` (naming the file and the OS's reason) when the file cannot be written.
  static std::unique_ptr<EventWriter> Open(const std::string& dir, std::string* error);

  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  const std::string& path() const { return file_->path(); }
  // "" while every record was written, else what failed (util::RecordFile::problem).
  const std::string& problem() const { return file_->problem(); }
  // fsync and close, checked: false (and problem()) on failure.
  bool Close() { return file_->Close(); }
  // A scalar (TensorBoard's Scalars tab) at `step`; stored as float32, as TensorBoard does.
  void AddScalar(const std::string& tag, int64_t step, double value);
  // A text summary (the Text tab) at `step`, rendered as Markdown by TensorBoard.
  void AddText(const std::string& tag, int64_t step, const std::string& text);

 private:
  explicit EventWriter(std::unique_ptr<util::RecordFile> file) : file_(std::move(file)) {}
  void Write(const std::string& event_bytes);

  std::unique_ptr<util::RecordFile> file_;
};

}  // namespace bigmac::metrics

#endif  // BIGMAC_CORE_METRICS_EVENT_WRITER_H_
