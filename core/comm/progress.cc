#include "core/comm/progress.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <new>
#include <sstream>
#include <type_traits>

namespace bigmac::comm::progress {
namespace {

constexpr uint32_t kMagic = 0x42505247;  // "BPRG"
constexpr uint32_t kVersion = 1;
constexpr int kMaxReceives = 4;
constexpr int kMaxPeers = 8;

struct FixedReceive {
  int32_t tag;
  char label[32];
  char action[40];
};

// The record as it lies in shared memory: plain data behind a seqlock (odd while written).
struct Record {
  uint32_t magic;
  uint32_t version;
  uint32_t size;
  std::atomic<uint32_t> sequence;
  int32_t world_rank;
  int32_t pid;
  int32_t step;
  int32_t flush;
  int32_t flushes;
  int64_t progress_ns;
  char action[96];
  char label[96];
  int32_t num_receives;
  FixedReceive receives[kMaxReceives];
  int32_t wait_kind;
  int32_t wait_tag;
  int64_t wait_ns;
  char wait_what[192];
  char wait_group[16];
  char wait_expect[64];
  int32_t num_peers;
  int32_t peers[kMaxPeers];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "the seqlock must work across processes");
static_assert(std::is_standard_layout_v<Record>);

int64_t NowNs() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return int64_t{now.tv_sec} * 1000000000 + now.tv_nsec;
}

template <size_t N>
void CopyText(char (&to)[N], std::string_view from) {
  const size_t n = std::min(from.size(), N - 1);
  std::memcpy(to, from.data(), n);
  to[n] = '\0';
}

template <size_t N>
std::string Text(const char (&from)[N]) {
  return std::string(from, strnlen(from, N));
}

struct Board {
  Record* record = nullptr;
  int fd = -1;
  std::mutex mutex;
  std::mutex handler_mutex;
  DeadlineHandler handler;
};

Board& TheBoard() {
  static Board* board = [] {
    auto* b = new Board;
    void* memory = nullptr;
    b->fd = memfd_create("bigmac-progress", MFD_CLOEXEC);
    if (b->fd >= 0 && ftruncate(b->fd, sizeof(Record)) == 0) {
      memory = mmap(nullptr, sizeof(Record), PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
      if (memory == MAP_FAILED) memory = nullptr;
    }
    if (memory == nullptr) {
      // Without memfd the record is private: the responder still reads it, other processes not.
      if (b->fd >= 0) close(b->fd);
      b->fd = -1;
      memory = ::operator new(sizeof(Record));
    }
    std::memset(memory, 0, sizeof(Record));
    b->record = new (memory) Record{};
    b->record->magic = kMagic;
    b->record->version = kVersion;
    b->record->size = sizeof(Record);
    b->record->world_rank = -1;
    b->record->pid = static_cast<int32_t>(getpid());
    b->record->progress_ns = NowNs();
    return b;
  }();
  return *board;
}

// Runs `write` on the record inside the seqlock.
template <typename Write>
void Update(Write write) {
  Board& board = TheBoard();
  std::lock_guard<std::mutex> lock(board.mutex);
  Record& record = *board.record;
  const uint32_t sequence = record.sequence.load(std::memory_order_relaxed);
  record.sequence.store(sequence + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  write(record);
  record.sequence.store(sequence + 2, std::memory_order_release);
}

// A consistent copy of `shared` (retrying while a write is in progress), as a Snapshot.
Snapshot Copy(const Record& shared) {
  Record copy;
  bool torn = true;
  for (int attempt = 0; attempt < 1000 && torn; ++attempt) {
    const uint32_t before = shared.sequence.load(std::memory_order_acquire);
    std::memcpy(static_cast<void*>(&copy), &shared, sizeof(Record));
    std::atomic_thread_fence(std::memory_order_acquire);
    const uint32_t after = shared.sequence.load(std::memory_order_relaxed);
    torn = before != after || (before & 1) != 0;
    if (torn) sched_yield();
  }
  const int64_t now = NowNs();
  Snapshot s;
  s.torn = torn;
  s.world_rank = copy.world_rank;
  s.pid = copy.pid;
  s.step = copy.step;
  s.flush = copy.flush;
  s.flushes = copy.flushes;
  s.action = Text(copy.action);
  s.label = Text(copy.label);
  for (int i = 0; i < std::min(copy.num_receives, kMaxReceives); ++i) {
    s.receives.push_back(
        {copy.receives[i].tag, Text(copy.receives[i].label), Text(copy.receives[i].action)});
  }
  s.since_progress_s = double(now - copy.progress_ns) * 1e-9;
  s.wait = static_cast<WaitKind>(copy.wait_kind);
  if (s.wait != WaitKind::kNone) {
    s.wait_what = Text(copy.wait_what);
    s.wait_group = Text(copy.wait_group);
    s.wait_expect = Text(copy.wait_expect);
    s.wait_tag = copy.wait_tag;
    s.wait_peers.assign(copy.peers, copy.peers + std::min(copy.num_peers, kMaxPeers));
    s.waited_s = double(now - copy.wait_ns) * 1e-9;
  }
  return s;
}

// The fields of /proc/<pid>/stat after the command name: [0] is the state (field 3).
std::vector<std::string> StatFields(int pid) {
  std::ifstream file("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(file, text);
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream rest(text.substr(close + 1));
  std::vector<std::string> fields;
  for (std::string field; rest >> field;) fields.push_back(field);
  return fields;
}

}  // namespace

void SetRank(int world_rank) {
  Update([&](Record& r) { r.world_rank = world_rank; });
}

void SetStep(int step, int flush, int flushes) {
  Update([&](Record& r) {
    r.step = step;
    r.flush = flush;
    r.flushes = flushes;
    r.action[0] = '\0';
    r.label[0] = '\0';
    r.num_receives = 0;
    r.progress_ns = NowNs();
  });
}

void SetAction(std::string_view action, std::string_view label,
               const std::vector<ExpectedReceive>& receives) {
  Update([&](Record& r) {
    CopyText(r.action, action);
    CopyText(r.label, label);
    r.num_receives = static_cast<int32_t>(std::min<size_t>(receives.size(), kMaxReceives));
    for (int i = 0; i < r.num_receives; ++i) {
      r.receives[i].tag = receives[i].tag;
      CopyText(r.receives[i].label, receives[i].label);
      CopyText(r.receives[i].action, receives[i].action);
    }
    r.progress_ns = NowNs();
  });
}

WaitScope::WaitScope(const Wait& wait) {
  Update([&](Record& r) {
    if (r.wait_kind != static_cast<int32_t>(WaitKind::kNone)) return;
    owner_ = true;
    r.wait_kind = static_cast<int32_t>(wait.kind);
    r.wait_tag = wait.tag;
    r.wait_ns = NowNs();
    CopyText(r.wait_what, wait.what);
    CopyText(r.wait_group, wait.group);
    CopyText(r.wait_expect, wait.expect);
    r.num_peers = static_cast<int32_t>(std::min<size_t>(wait.peers.size(), kMaxPeers));
    for (int i = 0; i < r.num_peers; ++i) r.peers[i] = wait.peers[i];
  });
}

WaitScope::~WaitScope() {
  if (!owner_) return;
  Update([](Record& r) {
    r.wait_kind = static_cast<int32_t>(WaitKind::kNone);
    r.progress_ns = NowNs();
  });
}

Snapshot Read() { return Copy(*TheBoard().record); }

int SharedFd() { return TheBoard().fd; }

long long StartTime(int pid) {
  const std::vector<std::string> fields = StatFields(pid);
  return fields.size() > 19 ? std::atoll(fields[19].c_str()) : 0;
}

std::optional<Snapshot> Peek(int pid, int fd, std::string* error) {
  if (fd < 0) {
    *error = "its record is not shared (no memfd)";
    return std::nullopt;
  }
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  const int handle = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (handle < 0) {
    *error = "cannot open " + path + ": " + std::strerror(errno);
    return std::nullopt;
  }
  struct stat info {};
  void* memory = MAP_FAILED;
  if (fstat(handle, &info) == 0 && info.st_size >= static_cast<off_t>(sizeof(Record)))
    memory = mmap(nullptr, sizeof(Record), PROT_READ, MAP_SHARED, handle, 0);
  close(handle);
  if (memory == MAP_FAILED) {
    *error = path + " is not a progress record";
    return std::nullopt;
  }
  const auto* record = static_cast<const Record*>(memory);
  std::optional<Snapshot> snapshot;
  if (record->magic == kMagic && record->version == kVersion && record->size == sizeof(Record) &&
      record->pid == pid) {
    snapshot = Copy(*record);
  } else {
    *error = path + " is not process " + std::to_string(pid) + "'s progress record";
  }
  munmap(memory, sizeof(Record));
  return snapshot;
}

std::string ProcessState(int pid, long long start_time) {
  const std::vector<std::string> fields = StatFields(pid);
  if (fields.empty()) return "gone";
  if (start_time != 0 && fields.size() > 19 && std::atoll(fields[19].c_str()) != start_time)
    return "gone (its pid now belongs to another process)";
  const std::string& state = fields[0];
  if (state == "R") return "R (running)";
  if (state == "S") return "S (sleeping)";
  if (state == "D") return "D (uninterruptible sleep: I/O or a driver)";
  if (state == "T") return "T (stopped by a signal)";
  if (state == "t") return "t (stopped by a debugger)";
  if (state == "Z") return "Z (dead, not yet reaped)";
  if (state == "X") return "X (dead)";
  return state;
}

void SetDeadlineHandler(DeadlineHandler handler) {
  Board& board = TheBoard();
  std::lock_guard<std::mutex> lock(board.handler_mutex);
  board.handler = std::move(handler);
}

std::string OnDeadline(const std::string& message) {
  DeadlineHandler handler;
  {
    Board& board = TheBoard();
    std::lock_guard<std::mutex> lock(board.handler_mutex);
    handler = board.handler;
  }
  return handler ? handler(message) : std::string();
}

}  // namespace bigmac::comm::progress
