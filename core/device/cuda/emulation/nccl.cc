// The emulated CUDA device's stand-in for NCCL (libnccl), test-only: the NCCL calls BigMac makes,
// with nccl.h's signatures, between real processes on one machine.
//
// Emulated: unique ids and the bootstrap (ncclGetUniqueId starts a root, as NCCL does, on a
// Unix-domain socket in the abstract namespace; its name is the id); communicators, blocking and
// non-blocking (ncclInProgress, polled with ncclCommGetAsyncError), created alone or in a group;
// ncclSend/ncclRecv with NCCL's rendezvous (a send completes only once its receive is posted,
// matched in order per pair); ncclAllReduce, ncclReduceScatter, ncclAllGather (every rank gets
// every contribution and reduces in rank order, so results are bitwise equal on every rank and
// from run to run; bf16 and half are summed in float and rounded once); groups (their calls are
// posted together, so a pair's send and receive in one group never deadlock); asynchronous errors
// (a peer that exits or aborts gives ncclRemoteError); ncclCommAbort (unblocks what waits on a
// peer; the streams drain); ncclCommFinalize/ncclCommDestroy; the error strings.
//
// Buffers must be device memory (cudaMalloc): any other pointer faults the device
// (cudaErrorIllegalAddress) when the op runs, as a kernel would, and the op is skipped.
//
// Not emulated: CUDA devices (device pointers are host pointers; the device a communicator is
// created on is ignored), ranks on other machines, the other collectives (broadcast, reduce,
// all-to-all, ...), user-defined reduction ops, fp8 reductions, split/shrink, buffer
// registration, NCCL's tuning and environment variables (NCCL_DEBUG set prints warnings only).
// Performance is not NCCL's: each rank sends its whole contribution to every other rank.
//
// Threads: each stream op (runtime.h's Enqueue) posts its transfers and waits for them on the
// stream's worker thread; each connection to a peer has a reader and a writer thread, as NCCL has
// a proxy thread, so grouped and concurrent operations progress together and a peer's exit is
// seen even while nothing waits on it.

#include <errno.h>
#include <nccl.h>
#include <poll.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/device/cuda/emulation/runtime.h"

namespace bigmac::device::cuda::emulation {
namespace {

// ---------------------------------------------------------------------------------------------
// Errors

struct Status {
  ncclResult_t code = ncclSuccess;
  std::string message;
};

// NCCL's last error is process-wide; never destroyed, since detached threads may set it at exit.
std::mutex& LastErrorMutex() {
  static std::mutex* mutex = new std::mutex;
  return *mutex;
}
std::string& LastError() {
  static std::string* text = new std::string;
  return *text;
}

void Warn(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(LastErrorMutex());
    LastError() = message;
  }
  if (std::getenv("NCCL_DEBUG") != nullptr) {
    std::fprintf(stderr, "[pid %d] NCCL WARN (emulated) %s\n", static_cast<int>(getpid()),
                 message.c_str());
  }
}

std::string SystemText(int error) { return std::string(std::strerror(error)); }

// ---------------------------------------------------------------------------------------------
// Sockets: Unix-domain, stream, in the abstract namespace (nothing on disk to clean up).

constexpr size_t kAddressBytes = 64;  // a listening socket's name, NUL-padded
constexpr char kIdMagic[8] = "BMNCCL1";
constexpr int kPollMs = 50;  // how often a bootstrap wait looks at the abort flag

struct IdLayout {
  char magic[8];
  char address[kAddressBytes];
};
static_assert(sizeof(IdLayout) <= NCCL_UNIQUE_ID_BYTES);

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    reset(other.release());
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

socklen_t AbstractAddress(const std::string& name, sockaddr_un* address) {
  std::memset(address, 0, sizeof(*address));
  address->sun_family = AF_UNIX;
  // sun_path[0] == '\0' puts the name in the abstract namespace.
  std::memcpy(address->sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

std::string RandomName() {
  std::random_device device;
  const uint64_t bits = (static_cast<uint64_t>(device()) << 32) ^ device();
  char text[kAddressBytes];
  std::snprintf(text, sizeof(text), "bigmac-nccl-%d-%016llx", static_cast<int>(getpid()),
                static_cast<unsigned long long>(bits));
  return text;
}

Status Listen(Fd* listener, std::string* name) {
  for (int attempt = 0; attempt < 16; ++attempt) {
    Fd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) return {ncclSystemError, "socket(AF_UNIX): " + SystemText(errno)};
    *name = RandomName();
    sockaddr_un address;
    const socklen_t length = AbstractAddress(*name, &address);
    if (bind(fd.get(), reinterpret_cast<sockaddr*>(&address), length) != 0) {
      if (errno == EADDRINUSE) continue;
      return {ncclSystemError, "bind(" + *name + "): " + SystemText(errno)};
    }
    if (listen(fd.get(), 128) != 0) return {ncclSystemError, "listen: " + SystemText(errno)};
    *listener = std::move(fd);
    return {};
  }
  return {ncclSystemError, "no free socket name"};
}

Status Connect(const std::string& name, Fd* out) {
  Fd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return {ncclSystemError, "socket(AF_UNIX): " + SystemText(errno)};
  sockaddr_un address;
  const socklen_t length = AbstractAddress(name, &address);
  while (connect(fd.get(), reinterpret_cast<sockaddr*>(&address), length) != 0) {
    if (errno == EINTR) continue;
    // Refused: nobody listens there any more (its process exited).
    return {errno == ECONNREFUSED ? ncclRemoteError : ncclSystemError,
            "connecting to " + name + ": " + SystemText(errno)};
  }
  *out = std::move(fd);
  return {};
}

enum class Io { kOk, kClosed, kFailed, kStopped };

// Waits for `fd` to be ready; false once *stop is set (looked at every kPollMs). Without `stop`,
// the read or write that follows blocks instead.
bool Await(int fd, short events, const std::atomic<bool>* stop) {
  if (stop == nullptr) return true;
  while (!stop->load()) {
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, kPollMs);
    if (n > 0 || (n < 0 && errno != EINTR)) return true;
  }
  return false;
}

Io ReadFully(int fd, void* data, size_t bytes, const std::atomic<bool>* stop, int* error) {
  char* at = static_cast<char*>(data);
  while (bytes > 0) {
    if (!Await(fd, POLLIN, stop)) return Io::kStopped;
    const ssize_t n = recv(fd, at, std::min<size_t>(bytes, size_t{1} << 30), 0);
    if (n == 0) return Io::kClosed;
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      *error = errno;
      return errno == ECONNRESET ? Io::kClosed : Io::kFailed;
    }
    at += n;
    bytes -= static_cast<size_t>(n);
  }
  return Io::kOk;
}

Io WriteFully(int fd, const void* data, size_t bytes, const std::atomic<bool>* stop, int* error) {
  const char* at = static_cast<const char*>(data);
  while (bytes > 0) {
    if (!Await(fd, POLLOUT, stop)) return Io::kStopped;
    // MSG_NOSIGNAL: a peer that is gone is an error to report, not a SIGPIPE.
    const ssize_t n = send(fd, at, std::min<size_t>(bytes, size_t{1} << 30), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      *error = errno;
      return errno == EPIPE || errno == ECONNRESET ? Io::kClosed : Io::kFailed;
    }
    at += n;
    bytes -= static_cast<size_t>(n);
  }
  return Io::kOk;
}

// ---------------------------------------------------------------------------------------------
// The bootstrap root: collects every rank's listening address and hands everyone the table.

struct RootHello {
  char magic[8];
  int32_t nranks;
  int32_t rank;
  char address[kAddressBytes];
};

struct RootReply {
  int32_t status;  // ncclResult_t
  int32_t nranks;
  char message[192];
  // Followed, on success, by nranks addresses of kAddressBytes.
};

void SendRootError(int fd, ncclResult_t status, const std::string& message) {
  RootReply reply{};
  reply.status = status;
  std::snprintf(reply.message, sizeof(reply.message), "%s", message.c_str());
  int error = 0;
  WriteFully(fd, &reply, sizeof(reply), nullptr, &error);
}

// Runs on a detached thread of the process that made the id, until every rank has joined (it
// waits for ever on ranks that never come, as NCCL's root does).
void RunRoot(int listen_fd) {
  Fd listener(listen_fd);
  int nranks = -1;
  std::map<int, std::pair<Fd, std::string>> joined;  // by rank
  while (nranks < 0 || static_cast<int>(joined.size()) < nranks) {
    Fd fd(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;
    }
    RootHello hello;
    int error = 0;
    if (ReadFully(fd.get(), &hello, sizeof(hello), nullptr, &error) != Io::kOk) continue;
    hello.address[kAddressBytes - 1] = '\0';
    if (std::memcmp(hello.magic, kIdMagic, sizeof(kIdMagic)) != 0) continue;
    if (nranks < 0) nranks = hello.nranks;
    if (hello.nranks != nranks) {
      SendRootError(fd.get(), ncclInvalidUsage,
                    "rank " + std::to_string(hello.rank) + " joined with nranks " +
                        std::to_string(hello.nranks) + ", others with " + std::to_string(nranks));
      continue;
    }
    if (hello.rank < 0 || hello.rank >= nranks || joined.count(hello.rank) != 0) {
      SendRootError(fd.get(), ncclInvalidUsage,
                    "rank " + std::to_string(hello.rank) + " joined twice or is out of range");
      continue;
    }
    joined[hello.rank] = {std::move(fd), hello.address};
  }
  std::vector<char> table(static_cast<size_t>(nranks) * kAddressBytes, '\0');
  for (const auto& [rank, entry] : joined) {
    std::memcpy(table.data() + rank * kAddressBytes, entry.second.data(), entry.second.size());
  }
  RootReply reply{};
  reply.status = ncclSuccess;
  reply.nranks = nranks;
  for (auto& [rank, entry] : joined) {
    int error = 0;
    // A rank that died meanwhile fails its write; the others are not held up by it.
    if (WriteFully(entry.first.get(), &reply, sizeof(reply), nullptr, &error) == Io::kOk) {
      WriteFully(entry.first.get(), table.data(), table.size(), nullptr, &error);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Communicators

// One posted send or receive on a connection.
struct Transfer {
  const void* source = nullptr;  // a send's
  void* target = nullptr;        // a receive's
  size_t bytes = 0;
  bool done = false;
};

// The wire, each way: a 16-byte message, then (kData) the payload.
enum MessageType : uint32_t {
  kClearToSend = 0x53544331,  // the receiver posted a receive of `bytes`
  kData = 0x41544144,         // `bytes` of payload follow, for the oldest clear-to-send
  kBye = 0x45594221,          // the sender finalized: its end closes, not an error
};
struct Message {
  uint32_t type;
  uint32_t unused;
  uint64_t bytes;
};

struct PeerHello {
  char magic[8];
  int32_t nranks;
  int32_t rank;
};

// This rank's link to one peer (or to itself: matched in memory, no socket).
struct Connection {
  int peer = -1;
  int fd = -1;  // -1 for the link to oneself
  std::thread reader;
  std::thread writer;
  // Guarded by Comm::mu.
  std::deque<Transfer*> sends;         // posted, in order; each waits for a clear-to-send
  std::deque<uint64_t> clear_to_send;  // the peer's posted receives, in order: their sizes
  std::deque<Transfer*> receives;      // posted, in order; each waits for its data
  std::deque<uint64_t> to_announce;    // clear-to-sends not yet written
  bool used = false;                   // a non-blocking comm's first operation with the peer
  bool say_bye = false;                // finalizing: write kBye once idle
  bool bye_written = false;
  bool peer_said_bye = false;
  bool broken = false;
};

struct Comm {
  int nranks = 0;
  int rank = 0;
  bool blocking = true;
  std::atomic<bool> aborted{false};  // also read, without `mu`, by the bootstrap's polls
  std::mutex mu;
  std::condition_variable cv;
  // Guarded by mu.
  ncclResult_t state = ncclInProgress;  // ncclCommGetAsyncError's answer
  std::string last_error;
  std::vector<std::unique_ptr<Connection>> connections;  // by peer rank, once initialized
  bool stop_io = false;     // destroying or aborting: the I/O threads stop
  bool io_stopped = false;  // they have stopped (joined): no transfer is touched any more
  bool finalize_called = false;
  bool collectives_used = false;
  int helpers = 0;   // init or finalize threads running
  int enqueued = 0;  // stream ops enqueued and not yet ended
  int running = 0;   // stream ops between their start and their end
};

// The first asynchronous error sticks, as in NCCL. Needs comm->mu.
void FailLocked(Comm* comm, ncclResult_t code, const std::string& message) {
  const std::string text =
      "rank " + std::to_string(comm->rank) + " of " + std::to_string(comm->nranks) + ": " + message;
  if (comm->state == ncclSuccess || comm->state == ncclInProgress) {
    comm->state = code;
    comm->last_error = text;
  }
  Warn(text);
  comm->cv.notify_all();
}

// The peer went away (or the link failed): the comm reports it; what waits on the peer still
// waits, as NCCL's kernels do, until ncclCommAbort. Needs comm->mu.
void BreakLocked(Comm* comm, Connection* link, Io io, int error, const char* doing) {
  if (comm->stop_io || link->broken) return;
  link->broken = true;
  if (link->peer_said_bye && io == Io::kClosed) return;  // it finalized and closed: expected
  std::string what = std::string(doing) + " peer rank " + std::to_string(link->peer) + ": ";
  if (io == Io::kClosed) {
    what += "the connection was closed (the peer exited or aborted its communicator)";
  } else {
    what += SystemText(error);
  }
  FailLocked(comm, io == Io::kClosed ? ncclRemoteError : ncclSystemError, what);
}

void ReadLoop(Comm* comm, Connection* link) {
  std::vector<char> scratch;
  while (true) {
    Message message;
    int error = 0;
    Io io = ReadFully(link->fd, &message, sizeof(message), nullptr, &error);
    std::unique_lock<std::mutex> lock(comm->mu);
    if (io != Io::kOk) {
      BreakLocked(comm, link, io, error, "reading from");
      return;
    }
    if (message.type == kClearToSend) {
      link->clear_to_send.push_back(message.bytes);
      comm->cv.notify_all();
    } else if (message.type == kBye) {
      link->peer_said_bye = true;
      if (!link->sends.empty() || !link->receives.empty()) {
        FailLocked(comm, ncclRemoteError,
                   "peer rank " + std::to_string(link->peer) +
                       " finalized its communicator while operations with it were pending here");
      }
    } else if (message.type == kData && !link->receives.empty()) {
      Transfer* transfer = link->receives.front();
      lock.unlock();
      // Into the posted buffer directly; more than it holds is read and dropped.
      const size_t kept = std::min<size_t>(message.bytes, transfer->bytes);
      io = ReadFully(link->fd, transfer->target, kept, nullptr, &error);
      for (uint64_t left = message.bytes - kept; io == Io::kOk && left > 0;) {
        scratch.resize(std::min<uint64_t>(left, 1 << 16));
        io = ReadFully(link->fd, scratch.data(), scratch.size(), nullptr, &error);
        left -= scratch.size();
      }
      lock.lock();
      if (io != Io::kOk) {
        BreakLocked(comm, link, io, error, "reading from");
        return;
      }
      if (message.bytes != transfer->bytes) {
        FailLocked(comm, ncclInvalidUsage,
                   "a receive of " + std::to_string(transfer->bytes) + " bytes from peer rank " +
                       std::to_string(link->peer) + " was matched by a send of " +
                       std::to_string(message.bytes) + " bytes");
      }
      link->receives.pop_front();
      transfer->done = true;
      comm->cv.notify_all();
    } else {
      FailLocked(comm, ncclInternalError,
                 "unexpected message " + std::to_string(message.type) + " from peer rank " +
                     std::to_string(link->peer));
      link->broken = true;
      return;
    }
  }
}

void WriteLoop(Comm* comm, Connection* link) {
  std::unique_lock<std::mutex> lock(comm->mu);
  while (true) {
    comm->cv.wait(lock, [&] {
      return comm->stop_io || !link->to_announce.empty() ||
             (!link->sends.empty() && !link->clear_to_send.empty()) || link->say_bye;
    });
    if (comm->stop_io) return;
    Io io = Io::kOk;
    int error = 0;
    if (!link->to_announce.empty()) {
      const Message message{kClearToSend, 0, link->to_announce.front()};
      link->to_announce.pop_front();
      lock.unlock();
      io = WriteFully(link->fd, &message, sizeof(message), nullptr, &error);
      lock.lock();
    } else if (!link->sends.empty() && !link->clear_to_send.empty()) {
      // Rendezvous: the payload goes only once the peer has posted its receive.
      Transfer* transfer = link->sends.front();
      link->sends.pop_front();
      link->clear_to_send.pop_front();
      const Message message{kData, 0, transfer->bytes};
      lock.unlock();
      io = WriteFully(link->fd, &message, sizeof(message), nullptr, &error);
      if (io == Io::kOk)
        io = WriteFully(link->fd, transfer->source, transfer->bytes, nullptr, &error);
      lock.lock();
      if (io == Io::kOk) {
        transfer->done = true;
        comm->cv.notify_all();
      }
    } else {
      const Message message{kBye, 0, 0};
      lock.unlock();
      io = WriteFully(link->fd, &message, sizeof(message), nullptr, &error);
      lock.lock();
      link->bye_written = true;
      comm->cv.notify_all();
      if (io == Io::kOk) return;
    }
    if (io == Io::kClosed) return;  // the reader sees the EOF too, after any kBye: it decides
    if (io != Io::kOk) {
      BreakLocked(comm, link, io, error, "writing to");
      return;
    }
  }
}

// Sends and receives to oneself match in memory, in order. Needs comm->mu.
void MatchSelfLocked(Comm* comm, Connection* link) {
  while (!link->sends.empty() && !link->receives.empty()) {
    Transfer* send = link->sends.front();
    Transfer* receive = link->receives.front();
    link->sends.pop_front();
    link->receives.pop_front();
    if (send->bytes != receive->bytes) {
      FailLocked(comm, ncclInvalidUsage,
                 "a receive of " + std::to_string(receive->bytes) +
                     " bytes from this rank was matched by a send of " +
                     std::to_string(send->bytes) + " bytes");
    }
    const size_t bytes = std::min(send->bytes, receive->bytes);
    if (bytes > 0) std::memmove(receive->target, send->source, bytes);
    send->done = receive->done = true;
  }
  comm->cv.notify_all();
}

// Needs comm->mu.
void PostSendLocked(Comm* comm, int peer, Transfer* transfer) {
  Connection* link = comm->connections[peer].get();
  if (link->peer_said_bye) {
    FailLocked(
        comm, ncclRemoteError,
        "a send to peer rank " + std::to_string(peer) + ", which finalized its communicator");
  }
  link->sends.push_back(transfer);
  if (link->fd < 0) MatchSelfLocked(comm, link);
  comm->cv.notify_all();
}

// Needs comm->mu. The receive is queued before its clear-to-send, so its data finds it.
void PostReceiveLocked(Comm* comm, int peer, Transfer* transfer) {
  Connection* link = comm->connections[peer].get();
  if (link->peer_said_bye) {
    FailLocked(
        comm, ncclRemoteError,
        "a receive from peer rank " + std::to_string(peer) + ", which finalized its communicator");
  }
  link->receives.push_back(transfer);
  if (link->fd < 0) {
    MatchSelfLocked(comm, link);
  } else {
    link->to_announce.push_back(transfer->bytes);
  }
  comm->cv.notify_all();
}

// Stops the I/O threads (closing this rank's ends: peers see EOF) and waits until no stream op
// touches a buffer any more. The stream ops still queued return at once when they run.
void StopIo(Comm* comm) {
  std::vector<Connection*> links;
  {
    std::lock_guard<std::mutex> lock(comm->mu);
    comm->stop_io = true;
    comm->cv.notify_all();
    for (auto& link : comm->connections) links.push_back(link.get());
  }
  for (Connection* link : links) {
    if (link->fd >= 0) shutdown(link->fd, SHUT_RDWR);  // unblocks the reader's and writer's I/O
  }
  for (Connection* link : links) {
    if (link->reader.joinable()) link->reader.join();
    if (link->writer.joinable()) link->writer.join();
    if (link->fd >= 0) close(link->fd);
    link->fd = -1;
  }
  std::unique_lock<std::mutex> lock(comm->mu);
  comm->io_stopped = true;
  comm->cv.notify_all();
  comm->cv.wait(lock, [&] { return comm->running == 0; });
}

// ---------------------------------------------------------------------------------------------
// Initialization

Status Bootstrap(Comm* comm, const ncclUniqueId& id,
                 std::vector<std::unique_ptr<Connection>>* connections) {
  IdLayout layout;
  std::memcpy(&layout, id.internal, sizeof(layout));
  if (std::memcmp(layout.magic, kIdMagic, sizeof(kIdMagic)) != 0) {
    return {ncclInvalidArgument, "the ncclUniqueId was not made by ncclGetUniqueId"};
  }
  layout.address[kAddressBytes - 1] = '\0';
  const std::atomic<bool>* stop = &comm->aborted;
  const int me = comm->rank;
  const int n = comm->nranks;
  // This rank's listener exists before the root publishes its address, so peers' connects
  // succeed whenever they come.
  Fd listener;
  std::string name;
  if (Status s = Listen(&listener, &name); s.code != ncclSuccess) return s;
  Fd root;
  if (Status s = Connect(layout.address, &root); s.code != ncclSuccess) {
    s.message = "bootstrap: the root (the process that called ncclGetUniqueId): " + s.message;
    return s;
  }
  RootHello hello{};
  std::memcpy(hello.magic, kIdMagic, sizeof(kIdMagic));
  hello.nranks = n;
  hello.rank = me;
  std::memcpy(hello.address, name.data(), name.size());
  int error = 0;
  RootReply reply;
  Io io = WriteFully(root.get(), &hello, sizeof(hello), stop, &error);
  if (io == Io::kOk) io = ReadFully(root.get(), &reply, sizeof(reply), stop, &error);
  if (io == Io::kStopped) return {ncclInvalidUsage, "aborted during initialization"};
  if (io != Io::kOk) {
    return {ncclRemoteError, "bootstrap: the root closed the connection (its process exited?)"};
  }
  if (reply.status != ncclSuccess) {
    reply.message[sizeof(reply.message) - 1] = '\0';
    return {static_cast<ncclResult_t>(reply.status), std::string("bootstrap: ") + reply.message};
  }
  std::vector<char> table(static_cast<size_t>(n) * kAddressBytes);
  io = ReadFully(root.get(), table.data(), table.size(), stop, &error);
  if (io == Io::kStopped) return {ncclInvalidUsage, "aborted during initialization"};
  if (io != Io::kOk) return {ncclRemoteError, "bootstrap: the root closed the connection"};
  root.reset();

  connections->clear();
  for (int peer = 0; peer < n; ++peer) {
    connections->push_back(std::make_unique<Connection>());
    (*connections)[peer]->peer = peer;
  }
  std::vector<Fd> fds(n);
  // The higher rank of each pair connects; connects queue on the listener's backlog, so doing
  // them all before accepting cannot deadlock.
  for (int peer = 0; peer < me; ++peer) {
    const std::string address(table.data() + peer * kAddressBytes);
    if (Status s = Connect(address, &fds[peer]); s.code != ncclSuccess) {
      s.message = "connecting to peer rank " + std::to_string(peer) + ": " + s.message;
      return s;
    }
    PeerHello mine{};
    std::memcpy(mine.magic, kIdMagic, sizeof(kIdMagic));
    mine.nranks = n;
    mine.rank = me;
    io = WriteFully(fds[peer].get(), &mine, sizeof(mine), stop, &error);
    if (io == Io::kStopped) return {ncclInvalidUsage, "aborted during initialization"};
    if (io != Io::kOk) {
      return {ncclRemoteError, "connecting to peer rank " + std::to_string(peer) + ": closed"};
    }
  }
  for (int accepted = 0; accepted < n - 1 - me;) {
    if (!Await(listener.get(), POLLIN, stop)) {
      return {ncclInvalidUsage, "aborted during initialization"};
    }
    Fd fd(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      return {ncclSystemError, "accept: " + SystemText(errno)};
    }
    PeerHello theirs;
    io = ReadFully(fd.get(), &theirs, sizeof(theirs), stop, &error);
    if (io == Io::kStopped) return {ncclInvalidUsage, "aborted during initialization"};
    if (io != Io::kOk) continue;  // a peer that died while connecting: it is waited for again
    if (std::memcmp(theirs.magic, kIdMagic, sizeof(kIdMagic)) != 0 || theirs.nranks != n ||
        theirs.rank <= me || theirs.rank >= n || fds[theirs.rank].get() >= 0) {
      return {ncclInternalError,
              "bootstrap: an unexpected connection (rank " + std::to_string(theirs.rank) + ")"};
    }
    fds[theirs.rank] = std::move(fd);
    ++accepted;
  }
  for (int peer = 0; peer < n; ++peer) (*connections)[peer]->fd = fds[peer].release();
  return {};
}

// Bootstraps `comm` and starts its I/O threads; the comm's state becomes ncclSuccess or the
// error. Runs on the caller's thread (blocking) or a helper thread (non-blocking, groups).
void RunInit(Comm* comm, const ncclUniqueId& id) {
  std::vector<std::unique_ptr<Connection>> connections;
  const Status status = Bootstrap(comm, id, &connections);
  std::lock_guard<std::mutex> lock(comm->mu);
  if (comm->aborted || status.code != ncclSuccess) {
    for (auto& link : connections) {
      if (link->fd >= 0) close(link->fd);
    }
    if (!comm->aborted) FailLocked(comm, status.code, status.message);
    return;
  }
  comm->connections = std::move(connections);
  for (auto& link : comm->connections) {
    if (link->fd < 0) continue;
    link->reader = std::thread(ReadLoop, comm, link.get());
    link->writer = std::thread(WriteLoop, comm, link.get());
  }
  comm->state = ncclSuccess;
  comm->cv.notify_all();
}

// A helper thread, detached: it holds the comm alive; abort and destroy wait for it to end.
void StartHelper(const std::shared_ptr<Comm>& comm, std::function<void(Comm*)> work) {
  {
    std::lock_guard<std::mutex> lock(comm->mu);
    ++comm->helpers;
  }
  std::thread([comm, work = std::move(work)] {
    work(comm.get());
    std::lock_guard<std::mutex> lock(comm->mu);
    --comm->helpers;
    comm->cv.notify_all();
  }).detach();
}

void WaitHelpers(Comm* comm) {
  std::unique_lock<std::mutex> lock(comm->mu);
  comm->cv.wait(lock, [&] { return comm->helpers == 0; });
}

// Waits for the comm's stream ops to end, then says goodbye to every peer (their EOF is then no
// error). Returns the comm's state.
ncclResult_t FinalizeNow(Comm* comm) {
  std::unique_lock<std::mutex> lock(comm->mu);
  const auto failed = [&] { return comm->state != ncclSuccess && comm->state != ncclInProgress; };
  comm->cv.wait(lock, [&] { return comm->aborted || failed() || comm->enqueued == 0; });
  if (comm->aborted || failed()) return comm->state;
  for (auto& link : comm->connections) {
    if (link->fd >= 0) link->say_bye = true;
  }
  comm->cv.notify_all();
  comm->cv.wait(lock, [&] {
    if (comm->aborted) return true;
    for (auto& link : comm->connections) {
      if (link->fd >= 0 && !link->bye_written && !link->broken) return false;
    }
    return true;
  });
  if (comm->state == ncclInProgress) comm->state = ncclSuccess;
  comm->cv.notify_all();
  return comm->state;
}

// ---------------------------------------------------------------------------------------------
// Calls

size_t TypeSize(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

float Bits32ToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}
uint32_t FloatToBits32(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return bits;
}

uint16_t FloatToBf16(float value) {  // round to nearest even, as the GPU's conversion does
  const uint32_t bits = FloatToBits32(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1)) >> 16);
}

float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000) << 16;
  const uint32_t exponent = (half >> 10) & 0x1f;
  const uint32_t mantissa = half & 0x3ff;
  if (exponent == 0x1f) return Bits32ToFloat(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  return Bits32ToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t FloatToHalf(float value) {  // round to nearest even
  uint32_t bits = FloatToBits32(value);
  const uint32_t sign = (bits >> 16) & 0x8000;
  bits &= 0x7fffffffu;
  if (bits > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00);   // NaN
  if (bits >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00);  // rounds past 65504
  if (bits < 0x38800000u) {  // below 2^-14: subnormal; the float add rounds to nearest even
    const float magic = Bits32ToFloat(126u << 23);  // 0.5: aligns the 10 mantissa bits at 2^-24
    return static_cast<uint16_t>(
        sign | (FloatToBits32(Bits32ToFloat(bits) + magic) - FloatToBits32(magic)));
  }
  const uint32_t odd = (bits >> 13) & 1;
  bits += (static_cast<uint32_t>(15 - 127) << 23) + 0xfff + odd;
  return static_cast<uint16_t>(sign | (bits >> 13));
}

template <typename T>
struct PlainType {
  using Acc = T;
  static Acc Load(const char* at) {
    T value;
    std::memcpy(&value, at, sizeof(T));
    return value;
  }
  static void Store(char* at, Acc value) { std::memcpy(at, &value, sizeof(T)); }
};
struct Bf16Type {
  using Acc = float;
  static Acc Load(const char* at) {
    uint16_t bits;
    std::memcpy(&bits, at, 2);
    return Bits32ToFloat(static_cast<uint32_t>(bits) << 16);
  }
  static void Store(char* at, Acc value) {
    const uint16_t bits = FloatToBf16(value);
    std::memcpy(at, &bits, 2);
  }
};
struct HalfType {
  using Acc = float;
  static Acc Load(const char* at) {
    uint16_t bits;
    std::memcpy(&bits, at, 2);
    return HalfToFloat(bits);
  }
  static void Store(char* at, Acc value) {
    const uint16_t bits = FloatToHalf(value);
    std::memcpy(at, &bits, 2);
  }
};

template <typename Acc>
Acc Combine(Acc a, Acc b, ncclRedOp_t op) {
  if constexpr (std::is_integral_v<Acc>) {
    using U = std::make_unsigned_t<Acc>;  // wraps, as the GPU's integers do
    if (op == ncclSum || op == ncclAvg)
      return static_cast<Acc>(static_cast<U>(a) + static_cast<U>(b));
    if (op == ncclProd) return static_cast<Acc>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    if (op == ncclSum || op == ncclAvg) return a + b;
    if (op == ncclProd) return a * b;
  }
  if (op == ncclMax) return a < b ? b : a;
  return b < a ? b : a;
}

// out[i] = parts[0][i] op parts[1][i] op ... in rank order, accumulated in Acc (float for the
// 16-bit floats) and stored once. Element-wise, so `out` may alias a part.
template <typename Type>
void ReduceInOrder(const std::vector<const char*>& parts, size_t count, size_t size, char* out,
                   ncclRedOp_t op) {
  using Acc = typename Type::Acc;
  for (size_t i = 0; i < count; ++i) {
    Acc acc = Type::Load(parts[0] + i * size);
    for (size_t p = 1; p < parts.size(); ++p)
      acc = Combine(acc, Type::Load(parts[p] + i * size), op);
    if (op == ncclAvg) acc = static_cast<Acc>(acc / static_cast<Acc>(parts.size()));
    Type::Store(out + i * size, acc);
  }
}

void Reduce(ncclDataType_t type, const std::vector<const char*>& parts, size_t count, char* out,
            ncclRedOp_t op) {
  const size_t size = TypeSize(type);
  switch (type) {
    case ncclInt8:
      return ReduceInOrder<PlainType<int8_t>>(parts, count, size, out, op);
    case ncclUint8:
      return ReduceInOrder<PlainType<uint8_t>>(parts, count, size, out, op);
    case ncclInt32:
      return ReduceInOrder<PlainType<int32_t>>(parts, count, size, out, op);
    case ncclUint32:
      return ReduceInOrder<PlainType<uint32_t>>(parts, count, size, out, op);
    case ncclInt64:
      return ReduceInOrder<PlainType<int64_t>>(parts, count, size, out, op);
    case ncclUint64:
      return ReduceInOrder<PlainType<uint64_t>>(parts, count, size, out, op);
    case ncclFloat16:
      return ReduceInOrder<HalfType>(parts, count, size, out, op);
    case ncclFloat32:
      return ReduceInOrder<PlainType<float>>(parts, count, size, out, op);
    case ncclFloat64:
      return ReduceInOrder<PlainType<double>>(parts, count, size, out, op);
    case ncclBfloat16:
      return ReduceInOrder<Bf16Type>(parts, count, size, out, op);
    default:
      return;  // refused when enqueued
  }
}

enum class Kind { kSend, kRecv, kAllReduce, kReduceScatter, kAllGather };

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kSend:
      return "ncclSend";
    case Kind::kRecv:
      return "ncclRecv";
    case Kind::kAllReduce:
      return "ncclAllReduce";
    case Kind::kReduceScatter:
      return "ncclReduceScatter";
    case Kind::kAllGather:
      return "ncclAllGather";
  }
  return "nccl";
}

// One NCCL call, as enqueued.
struct Call {
  Kind kind = Kind::kSend;
  std::shared_ptr<Comm> comm;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // ncclReduceScatter: per rank (recvcount); ncclAllGather: sendcount
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  int peer = -1;
  cudaStream_t stream = nullptr;
};

// A call while its stream op runs: its transfers (stable addresses) and collective scratch.
struct Running {
  bool posted = false;   // counted in Comm::running
  bool skipped = false;  // not run (fault, abort, destroy): its buffers are not touched
  std::deque<Transfer> transfers;
  std::vector<std::vector<char>> parts;
};

// What a GPU would touch: device memory only (a host pointer would fault in the kernel).
bool OnDevice(const Call& call, std::string* what) {
  const size_t size = TypeSize(call.type);
  const int n = call.comm->nranks;
  const auto check = [&](const void* at, size_t bytes, const char* name) {
    if (bytes == 0 || IsDeviceRange(at, bytes)) return true;
    char text[160];
    std::snprintf(text, sizeof(text), "%s: %s [%p, +%zu bytes) is not device memory",
                  KindName(call.kind), name, at, bytes);
    *what = text;
    return false;
  };
  const size_t bytes = call.count * size;
  switch (call.kind) {
    case Kind::kSend:
      return check(call.send, bytes, "sendbuff");
    case Kind::kRecv:
      return check(call.recv, bytes, "recvbuff");
    case Kind::kAllReduce:
      return check(call.send, bytes, "sendbuff") && check(call.recv, bytes, "recvbuff");
    case Kind::kReduceScatter:
      return check(call.send, bytes * n, "sendbuff") && check(call.recv, bytes, "recvbuff");
    case Kind::kAllGather:
      return check(call.send, bytes, "sendbuff") && check(call.recv, bytes * n, "recvbuff");
  }
  return true;
}

// Needs comm->mu.
void PostLocked(const Call& call, Running* run) {
  Comm* comm = call.comm.get();
  const size_t size = TypeSize(call.type);
  const size_t bytes = call.count * size;
  const int n = comm->nranks;
  const int me = comm->rank;
  const auto add = [&](const void* source, void* target) {
    run->transfers.push_back(Transfer{source, target, bytes, false});
    return &run->transfers.back();
  };
  switch (call.kind) {
    case Kind::kSend:
      PostSendLocked(comm, call.peer, add(call.send, nullptr));
      return;
    case Kind::kRecv:
      PostReceiveLocked(comm, call.peer, add(nullptr, call.recv));
      return;
    case Kind::kAllReduce: {
      // Own contribution copied first: in place, recvbuff is sendbuff.
      run->parts.assign(n, std::vector<char>(bytes));
      if (bytes > 0) std::memcpy(run->parts[me].data(), call.send, bytes);
      for (int peer = 0; peer < n; ++peer) {
        if (peer == me) continue;
        PostReceiveLocked(comm, peer, add(nullptr, run->parts[peer].data()));
        PostSendLocked(comm, peer, add(run->parts[me].data(), nullptr));
      }
      return;
    }
    case Kind::kReduceScatter: {
      run->parts.assign(n, std::vector<char>(bytes));
      const char* send = static_cast<const char*>(call.send);
      if (bytes > 0) std::memcpy(run->parts[me].data(), send + me * bytes, bytes);
      for (int peer = 0; peer < n; ++peer) {
        if (peer == me) continue;
        PostReceiveLocked(comm, peer, add(nullptr, run->parts[peer].data()));
        PostSendLocked(comm, peer, add(send + peer * bytes, nullptr));
      }
      return;
    }
    case Kind::kAllGather: {
      char* recv = static_cast<char*>(call.recv);
      for (int peer = 0; peer < n; ++peer) {
        if (peer == me) continue;
        PostReceiveLocked(comm, peer, add(nullptr, recv + peer * bytes));
        PostSendLocked(comm, peer, add(call.send, nullptr));
      }
      return;
    }
  }
}

void FinishCall(const Call& call, Running* run) {
  const size_t bytes = call.count * TypeSize(call.type);
  switch (call.kind) {
    case Kind::kAllReduce:
    case Kind::kReduceScatter: {
      std::vector<const char*> parts;
      for (const auto& part : run->parts) parts.push_back(part.data());
      Reduce(call.type, parts, call.count, static_cast<char*>(call.recv), call.op);
      return;
    }
    case Kind::kAllGather: {
      char* own = static_cast<char*>(call.recv) + call.comm->rank * bytes;
      if (bytes > 0 && own != call.send) std::memmove(own, call.send, bytes);
      return;
    }
    default:
      return;
  }
}

// The body of a stream op: the calls are posted together (as a group's are issued together),
// then waited for. Until abort, a call whose peer never answers waits, as NCCL's kernel does.
void RunCalls(const std::vector<Call>& calls) {
  std::vector<Running> runs(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    Comm* comm = calls[i].comm.get();
    std::string what;
    if (!OnDevice(calls[i], &what)) {
      Fault(cudaErrorIllegalAddress, what + " (an illegal address on a GPU)");
      runs[i].skipped = true;
      continue;
    }
    std::lock_guard<std::mutex> lock(comm->mu);
    if (comm->stop_io) {
      runs[i].skipped = true;
      continue;
    }
    ++comm->running;
    runs[i].posted = true;
    PostLocked(calls[i], &runs[i]);
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    if (runs[i].skipped) continue;
    Comm* comm = calls[i].comm.get();
    std::unique_lock<std::mutex> lock(comm->mu);
    comm->cv.wait(lock, [&] {
      if (comm->io_stopped) return true;
      for (const Transfer& t : runs[i].transfers) {
        if (!t.done) return false;
      }
      return true;
    });
    if (comm->io_stopped) runs[i].skipped = true;
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    if (!runs[i].skipped) FinishCall(calls[i], &runs[i]);
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    Comm* comm = calls[i].comm.get();
    std::lock_guard<std::mutex> lock(comm->mu);
    if (runs[i].posted) --comm->running;
    --comm->enqueued;
    comm->cv.notify_all();
  }
}

// Enqueues `calls` (a lone call or a group's) on their streams. Calls on several streams make
// those streams wait for each other, as a group's launch does on a GPU: the last stream to get
// there runs them all; the others wait for it.
void EnqueueCalls(std::vector<Call> calls) {
  if (calls.empty()) return;
  for (const Call& call : calls) {
    std::lock_guard<std::mutex> lock(call.comm->mu);
    ++call.comm->enqueued;
  }
  std::vector<cudaStream_t> streams;
  for (const Call& call : calls) {
    if (std::find(streams.begin(), streams.end(), call.stream) == streams.end()) {
      streams.push_back(call.stream);
    }
  }
  const std::string name = calls.size() == 1 ? KindName(calls[0].kind) : "ncclGroupEnd";
  auto shared = std::make_shared<const std::vector<Call>>(std::move(calls));
  if (streams.size() == 1) {
    Enqueue(streams[0], name, [shared] { RunCalls(*shared); });
    return;
  }
  struct Join {
    std::mutex mu;
    std::condition_variable cv;
    size_t arrived = 0;
    bool done = false;
  };
  auto join = std::make_shared<Join>();
  const size_t count = streams.size();
  for (cudaStream_t stream : streams) {
    Enqueue(stream, name, [shared, join, count] {
      std::unique_lock<std::mutex> lock(join->mu);
      if (++join->arrived == count) {
        lock.unlock();
        RunCalls(*shared);
        lock.lock();
        join->done = true;
        join->cv.notify_all();
        return;
      }
      // Another stream may be held up for ever; an abort of one of the comms releases this one.
      while (!join->cv.wait_for(lock, std::chrono::milliseconds(20), [&] { return join->done; })) {
        for (const Call& call : *shared) {
          if (call.comm->aborted) return;
        }
      }
    });
  }
}

// ---------------------------------------------------------------------------------------------
// Groups: per thread, as NCCL's.

struct PendingInit {
  std::shared_ptr<Comm> comm;
  ncclUniqueId id;
};

struct GroupState {
  int depth = 0;
  std::vector<PendingInit> inits;
  std::vector<Call> calls;
  ncclResult_t error = ncclSuccess;
};

GroupState& Group() {
  thread_local GroupState state;
  return state;
}

ncclResult_t Refuse(ncclResult_t code, const std::string& message) {
  Warn(message);
  if (Group().depth > 0 && Group().error == ncclSuccess) Group().error = code;
  return code;
}

}  // namespace
}  // namespace bigmac::device::cuda::emulation

// The opaque handle of nccl.h. The state is shared with the stream ops and helper threads, which
// may outlive the handle (ncclCommAbort returns before queued ops have run).
struct ncclComm {
  std::shared_ptr<bigmac::device::cuda::emulation::Comm> state;
};

namespace bigmac::device::cuda::emulation {
namespace {

// The checks NCCL makes before enqueueing a call (ncclCommEnsureReady and ArgsCheck).
ncclResult_t CheckCall(ncclComm_t handle, const Call& call, const char* name) {
  if (handle == nullptr) return Refuse(ncclInvalidArgument, std::string(name) + ": comm is NULL");
  Comm* comm = handle->state.get();
  {
    std::lock_guard<std::mutex> lock(comm->mu);
    if (comm->state == ncclInProgress) {
      return Refuse(ncclInvalidArgument, std::string(name) +
                                             ": the communicator is used before its previous "
                                             "operation returned ncclSuccess");
    }
    if (comm->state != ncclSuccess) return comm->state;
    if (comm->finalize_called) {
      return Refuse(ncclInvalidUsage, std::string(name) + ": the communicator is finalized");
    }
  }
  const size_t size = TypeSize(call.type);
  if (size == 0 || call.type < 0 || call.type >= ncclNumTypes) {
    return Refuse(ncclInvalidArgument, std::string(name) + ": invalid datatype " +
                                           std::to_string(static_cast<int>(call.type)));
  }
  const bool reduces = call.kind == Kind::kAllReduce || call.kind == Kind::kReduceScatter;
  if (reduces && (call.type == ncclFloat8e4m3 || call.type == ncclFloat8e5m2 || call.op < 0 ||
                  call.op >= ncclNumOps)) {
    return Refuse(ncclInvalidArgument,
                  std::string(name) + ": unsupported reduction (op " +
                      std::to_string(static_cast<int>(call.op)) + ", datatype " +
                      std::to_string(static_cast<int>(call.type)) + ") in the emulation");
  }
  if ((call.kind == Kind::kSend || call.kind == Kind::kRecv) &&
      (call.peer < 0 || call.peer >= comm->nranks)) {
    return Refuse(ncclInvalidArgument,
                  std::string(name) + ": peer " + std::to_string(call.peer) + " is out of range");
  }
  if (call.count > 0) {
    const bool needs_send = call.kind != Kind::kRecv;
    const bool needs_recv = call.kind != Kind::kSend;
    if ((needs_send && call.send == nullptr) || (needs_recv && call.recv == nullptr)) {
      return Refuse(ncclInvalidArgument, std::string(name) + ": a buffer is NULL");
    }
  }
  return ncclSuccess;
}

// A call outside a group is enqueued at once. A non-blocking communicator's first operation with
// a peer (or first collective) answers ncclInProgress, as NCCL's runtime connection does, so the
// caller's polling is exercised; the call is enqueued by then.
ncclResult_t Issue(ncclComm_t handle, Call call) {
  const char* name = KindName(call.kind);
  call.comm = handle == nullptr ? nullptr : handle->state;
  GroupState& group = Group();
  if (const ncclResult_t status = CheckCall(handle, call, name); status != ncclSuccess) {
    if (group.depth > 0 && group.error == ncclSuccess) group.error = status;  // as NCCL's group
    return status;
  }
  if (group.depth > 0) {
    group.calls.push_back(std::move(call));
    return ncclSuccess;
  }
  if ((call.kind == Kind::kAllReduce || call.kind == Kind::kReduceScatter ||
       call.kind == Kind::kAllGather) &&
      call.count == 0) {
    return ncclSuccess;  // NCCL skips empty collectives
  }
  bool first = false;
  Comm* comm = call.comm.get();
  {
    std::lock_guard<std::mutex> lock(comm->mu);
    if (!comm->blocking) {
      if (call.kind == Kind::kSend || call.kind == Kind::kRecv) {
        first = !std::exchange(comm->connections[call.peer]->used, true);
      } else {
        first = !std::exchange(comm->collectives_used, true);
      }
    }
  }
  EnqueueCalls({std::move(call)});
  return first ? ncclInProgress : ncclSuccess;
}

}  // namespace
}  // namespace bigmac::device::cuda::emulation

namespace emu = bigmac::device::cuda::emulation;

// ---------------------------------------------------------------------------------------------
// The C API (nccl.h declares these extern "C").

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  // A copy per thread: the pointer stays valid while another thread records a newer error.
  thread_local std::string copy;
  if (comm != nullptr) {
    std::lock_guard<std::mutex> lock(comm->state->mu);
    if (!comm->state->last_error.empty()) {
      copy = comm->state->last_error;
      return copy.c_str();
    }
  }
  std::lock_guard<std::mutex> lock(emu::LastErrorMutex());
  copy = emu::LastError();
  return copy.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id) {
  if (unique_id == nullptr) return emu::Refuse(ncclInvalidArgument, "ncclGetUniqueId: NULL id");
  emu::Fd listener;
  std::string name;
  if (const emu::Status s = emu::Listen(&listener, &name); s.code != ncclSuccess) {
    return emu::Refuse(s.code, "ncclGetUniqueId: " + s.message);
  }
  emu::IdLayout layout{};
  std::memcpy(layout.magic, emu::kIdMagic, sizeof(emu::kIdMagic));
  std::memcpy(layout.address, name.data(), name.size());
  std::memset(unique_id->internal, 0, sizeof(unique_id->internal));
  std::memcpy(unique_id->internal, &layout, sizeof(layout));
  std::thread(emu::RunRoot, listener.release()).detach();
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank,
                                    ncclConfig_t* config) {
  if (comm == nullptr) return emu::Refuse(ncclInvalidArgument, "ncclCommInitRankConfig: NULL comm");
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return emu::Refuse(ncclInvalidArgument, "ncclCommInitRankConfig: rank " + std::to_string(rank) +
                                                " of " + std::to_string(nranks) + " is invalid");
  }
  if (config != nullptr &&
      (config->magic != 0xcafebeef || config->size < offsetof(ncclConfig_t, cgaClusterSize))) {
    return emu::Refuse(ncclInvalidArgument,
                       "ncclCommInitRankConfig: config was not set from NCCL_CONFIG_INITIALIZER");
  }
  auto state = std::make_shared<emu::Comm>();
  state->nranks = nranks;
  state->rank = rank;
  // NCCL_CONFIG_UNDEF_INT means NCCL's default, blocking.
  state->blocking = config == nullptr || config->blocking != 0;
  *comm = new ncclComm{state};
  emu::GroupState& group = emu::Group();
  if (group.depth > 0) {
    group.inits.push_back({state, comm_id});  // started by ncclGroupEnd, together
    return state->blocking ? ncclSuccess : ncclInProgress;
  }
  if (!state->blocking) {
    emu::StartHelper(state, [comm_id](emu::Comm* c) { emu::RunInit(c, comm_id); });
    return ncclInProgress;
  }
  emu::RunInit(state.get(), comm_id);
  ncclResult_t result;
  {
    std::lock_guard<std::mutex> lock(state->mu);  // the I/O threads may record an error already
    result = state->state;
  }
  if (result != ncclSuccess) {
    delete *comm;
    *comm = nullptr;
  }
  return result;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, comm_id, rank, nullptr);
}

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  (void)devlist;  // no devices to choose from
  if (comms == nullptr || ndev < 1) {
    return emu::Refuse(ncclInvalidArgument, "ncclCommInitAll: no communicators asked for");
  }
  ncclUniqueId id;
  if (const ncclResult_t status = ncclGetUniqueId(&id); status != ncclSuccess) return status;
  std::vector<ncclResult_t> results(ndev, ncclSuccess);
  std::vector<std::thread> threads;
  for (int i = 0; i < ndev; ++i) {
    threads.emplace_back(
        [&, i] { results[i] = ncclCommInitRankConfig(&comms[i], ndev, id, i, nullptr); });
  }
  for (std::thread& thread : threads) thread.join();
  for (ncclResult_t result : results) {
    if (result != ncclSuccess) return result;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (comm == nullptr || async_error == nullptr) {
    return emu::Refuse(ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
  }
  std::lock_guard<std::mutex> lock(comm->state->mu);
  *async_error = comm->state->state;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return ncclInvalidArgument;
  *count = comm->state->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return ncclInvalidArgument;
  *rank = comm->state->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (comm == nullptr) return emu::Refuse(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
  std::shared_ptr<emu::Comm> state = comm->state;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    if (state->finalize_called) {
      return emu::Refuse(ncclInvalidUsage, "ncclCommFinalize: called twice");
    }
    if (state->state != ncclSuccess) return state->state;  // an error, or not initialized yet
    state->finalize_called = true;
    if (!state->blocking) state->state = ncclInProgress;  // until the flush is done
  }
  if (state->blocking) return emu::FinalizeNow(state.get());
  emu::StartHelper(state, [](emu::Comm* c) { emu::FinalizeNow(c); });
  return ncclInProgress;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  std::shared_ptr<emu::Comm> state = comm->state;
  bool finalize = false;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    finalize = !state->finalize_called && state->state == ncclSuccess;
    state->finalize_called = true;
  }
  emu::WaitHelpers(state.get());  // an init or a non-blocking finalize
  // Unfinalized: flushed first (blocking, as NCCL's destroy is); one with an error is not.
  if (finalize) emu::FinalizeNow(state.get());
  emu::StopIo(state.get());
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  std::shared_ptr<emu::Comm> state = comm->state;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    state->aborted = true;
    state->cv.notify_all();
  }
  emu::WaitHelpers(state.get());  // they look at the abort flag every few milliseconds
  emu::StopIo(state.get());       // every wait on a peer ends; the streams drain
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  emu::Call call;
  call.kind = emu::Kind::kSend;
  call.send = sendbuff;
  call.count = count;
  call.type = datatype;
  call.peer = peer;
  call.stream = stream;
  return emu::Issue(comm, std::move(call));
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  emu::Call call;
  call.kind = emu::Kind::kRecv;
  call.recv = recvbuff;
  call.count = count;
  call.type = datatype;
  call.peer = peer;
  call.stream = stream;
  return emu::Issue(comm, std::move(call));
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  emu::Call call;
  call.kind = emu::Kind::kAllReduce;
  call.send = sendbuff;
  call.recv = recvbuff;
  call.count = count;
  call.type = datatype;
  call.op = op;
  call.stream = stream;
  return emu::Issue(comm, std::move(call));
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  emu::Call call;
  call.kind = emu::Kind::kReduceScatter;
  call.send = sendbuff;
  call.recv = recvbuff;
  call.count = recvcount;
  call.type = datatype;
  call.op = op;
  call.stream = stream;
  return emu::Issue(comm, std::move(call));
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  emu::Call call;
  call.kind = emu::Kind::kAllGather;
  call.send = sendbuff;
  call.recv = recvbuff;
  call.count = sendcount;
  call.type = datatype;
  call.stream = stream;
  return emu::Issue(comm, std::move(call));
}

ncclResult_t ncclGroupStart() {
  ++emu::Group().depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  emu::GroupState& group = emu::Group();
  if (group.depth == 0) {
    emu::Warn("ncclGroupEnd: no ncclGroupStart");
    return ncclInvalidUsage;
  }
  if (--group.depth > 0) return ncclSuccess;
  std::vector<emu::PendingInit> inits = std::move(group.inits);
  std::vector<emu::Call> calls = std::move(group.calls);
  const ncclResult_t error = std::exchange(group.error, ncclSuccess);
  group.inits.clear();
  group.calls.clear();
  const auto fail_inits = [&](ncclResult_t code, const std::string& message) {
    for (emu::PendingInit& init : inits) {
      std::lock_guard<std::mutex> lock(init.comm->mu);
      emu::FailLocked(init.comm.get(), code, message);
    }
    return code;
  };
  if (error != ncclSuccess) return fail_inits(error, "an earlier call of the group failed");
  if (!inits.empty() && !calls.empty()) {
    emu::Warn("ncclGroupEnd: communicator creation and operations in one group");
    return fail_inits(ncclInvalidUsage, "communicator creation and operations in one group");
  }
  bool blocking = false;
  bool non_blocking = false;
  for (const emu::PendingInit& init : inits) (init.comm->blocking ? blocking : non_blocking) = true;
  for (const emu::Call& call : calls) (call.comm->blocking ? blocking : non_blocking) = true;
  if (blocking && non_blocking) {
    emu::Warn("ncclGroupEnd: blocking and non-blocking communicators in one group");
    return fail_inits(ncclInvalidUsage, "blocking and non-blocking communicators in one group");
  }
  // Every creation runs at once: each needs its peers', which may come in another order.
  for (emu::PendingInit& init : inits) {
    const ncclUniqueId id = init.id;
    emu::StartHelper(init.comm, [id](emu::Comm* c) { emu::RunInit(c, id); });
  }
  if (blocking) {
    for (emu::PendingInit& init : inits) emu::WaitHelpers(init.comm.get());
  }
  std::vector<emu::Call> enqueued;
  for (emu::Call& call : calls) {
    const bool empty_collective =
        call.kind != emu::Kind::kSend && call.kind != emu::Kind::kRecv && call.count == 0;
    if (!empty_collective) enqueued.push_back(std::move(call));
  }
  emu::EnqueueCalls(std::move(enqueued));
  if (non_blocking) return ncclInProgress;
  for (emu::PendingInit& init : inits) {
    std::lock_guard<std::mutex> lock(init.comm->mu);
    if (init.comm->state != ncclSuccess) return init.comm->state;
  }
  return ncclSuccess;
}
