#include "core/metrics/event_writer.h"

#include <isa-l/crc.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/metrics/events.pb.h"
#include "core/util/process.h"

namespace bigmac::metrics {
namespace {

double WallTime() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void AppendLittleEndian(std::string* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t Crc32c(const void* data, size_t size) {
  // ISA-L's crc32_iscsi takes an int length (and a non-const pointer it only reads), and leaves
  // the final inversion to the caller.
  uint32_t crc = 0xffffffffu;
  const auto* bytes = static_cast<const unsigned char*>(data);
  while (size > 0) {
    const int chunk = static_cast<int>(std::min<size_t>(size, std::numeric_limits<int>::max()));
    crc = crc32_iscsi(const_cast<unsigned char*>(bytes), chunk, crc);
    bytes += chunk;
    size -= chunk;
  }
  return crc ^ 0xffffffffu;
}

uint32_t MaskedCrc32c(const void* data, size_t size) {
  const uint32_t crc = Crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string TfRecord(const std::string& payload) {
  std::string record;
  record.reserve(payload.size() + 16);
  AppendLittleEndian(&record, payload.size(), 8);
  AppendLittleEndian(&record, MaskedCrc32c(record.data(), 8), 4);
  record += payload;
  AppendLittleEndian(&record, MaskedCrc32c(payload.data(), payload.size()), 4);
  return record;
}

int RemoveEventFiles(const std::string& dir) {
  int removed = 0;
  std::error_code code;
  for (const auto& entry : std::filesystem::directory_iterator(dir, code)) {
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0 &&
        std::filesystem::remove(entry.path(), code)) {
      ++removed;
    }
  }
  return removed;
}

std::unique_ptr<EventWriter> EventWriter::Open(const std::string& dir, std::string* error) {
  std::error_code code;
  std::filesystem::create_directories(dir, code);
  const std::string host = util::HostName();
  const std::string path = dir + "/events.out.tfevents." +
                           std::to_string(static_cast<int64_t>(WallTime())) + "." + host + "." +
                           std::to_string(getpid());
  std::unique_ptr<util::RecordFile> file = util::RecordFile::Create(path, error);
  if (!file) return nullptr;
  std::unique_ptr<EventWriter> writer(new EventWriter(std::move(file)));
  tensorboard::Event event;
  event.set_wall_time(WallTime());
  event.set_file_version("brain.Event:2");
  writer->Write(event.SerializeAsString());
  return writer;
}

void EventWriter::AddScalar(const std::string& tag, int64_t step, double value) {
  tensorboard::Event event;
  event.set_wall_time(WallTime());
  event.set_step(step);
  tensorboard::Summary::Value* summary = event.mutable_summary()->add_value();
  summary->set_tag(tag);
  summary->set_simple_value(static_cast<float>(value));
  Write(event.SerializeAsString());
}

void EventWriter::AddText(const std::string& tag, int64_t step, const std::string& text) {
  tensorboard::Event event;
  event.set_wall_time(WallTime());
  event.set_step(step);
  tensorboard::Summary::Value* summary = event.mutable_summary()->add_value();
  summary->set_tag(tag);
  tensorboard::SummaryMetadata* metadata = summary->mutable_metadata();
  metadata->mutable_plugin_data()->set_plugin_name("text");
  metadata->set_data_class(tensorboard::DATA_CLASS_TENSOR);
  tensorboard::TensorProto* tensor = summary->mutable_tensor();
  tensor->set_dtype(tensorboard::DT_STRING);
  tensor->mutable_tensor_shape()->add_dim()->set_size(1);
  tensor->add_string_val(text);
  Write(event.SerializeAsString());
}

void EventWriter::Write(const std::string& event_bytes) { file_->Append(TfRecord(event_bytes)); }

}  // namespace bigmac::metrics
