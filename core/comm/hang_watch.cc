#include "core/comm/hang_watch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <mpi.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "core/comm/hang_report.h"
#include "core/comm/progress.h"
#include "core/util/format.h"
#include "core/util/output_file.h"
#include "nlohmann/json.hpp"

namespace bigmac::comm {
namespace progress {

// The records as the responders send them.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ExpectedReceive, tag, label, action)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Snapshot, world_rank, pid, step, flush, flushes, action, label,
                                   receives, since_progress_s, wait, wait_what, wait_group,
                                   wait_expect, wait_tag, wait_peers, waited_s, torn)

}  // namespace progress
namespace {

using Clock = std::chrono::steady_clock;
using Contact = RankStatus::Contact;
using nlohmann::json;
using util::Format;

// Bounds of the diagnosis, so that the job ends within the deadline plus 10 s.
constexpr double kClaimTimeout = 1.5;     // one candidate's answer to a claim
constexpr double kClaimBudget = 3.0;      // all claims together; then the rank reports itself
constexpr double kStatusTimeout = 2.0;    // every rank's status, asked all at once
constexpr double kPeekTimeout = 1.5;      // a mute rank's record, read by a rank on its node
constexpr double kConnectTimeout = 1.0;   // one address
constexpr double kWaitForReporter = 7.0;  // a later claimant, before it stops the job itself
constexpr double kRequestTimeout = 1.0;   // the responder reading a request, writing its answer
constexpr int kMaxAddresses = 4;
constexpr size_t kMaxAnswerBytes = 1 << 20;

// What each rank publishes at start-up (MPI_Allgather of the raw bytes).
struct Endpoint {
  int32_t port = 0;  // 0: no responder
  int32_t pid = 0;
  int32_t progress_fd = -1;
  int32_t num_addresses = 0;
  int64_t start_time = 0;
  uint64_t token = 0;
  char host[64] = {};
  char addresses[kMaxAddresses][48] = {};
};

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// This node's IPv4 addresses other than loopback, those its host name resolves to first.
std::vector<std::string> LocalAddresses(const std::string& host) {
  std::vector<std::string> interfaces;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* it = list; it; it = it->ifa_next) {
      if (!it->ifa_addr || it->ifa_addr->sa_family != AF_INET) continue;
      if (!(it->ifa_flags & IFF_UP) || (it->ifa_flags & IFF_LOOPBACK)) continue;
      char text[INET_ADDRSTRLEN] = {};
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr, text,
                sizeof(text));
      interfaces.push_back(text);
    }
    freeifaddrs(list);
  }
  std::vector<std::string> ordered;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* resolved = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &resolved) == 0) {
    for (addrinfo* it = resolved; it; it = it->ai_next) {
      char text[INET_ADDRSTRLEN] = {};
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(it->ai_addr)->sin_addr, text,
                sizeof(text));
      if (std::find(interfaces.begin(), interfaces.end(), text) != interfaces.end() &&
          std::find(ordered.begin(), ordered.end(), text) == ordered.end())
        ordered.push_back(text);
    }
    freeaddrinfo(resolved);
  }
  for (const std::string& address : interfaces) {
    if (std::find(ordered.begin(), ordered.end(), address) == ordered.end())
      ordered.push_back(address);
  }
  return ordered;
}

// Reads a line (the request) from `fd` within the timeout; false if none came.
bool ReadLine(int fd, double timeout, std::string* line) {
  const auto start = Clock::now();
  char buffer[4096];
  while (line->find('\n') == std::string::npos && line->size() < 65536) {
    const int left_ms = static_cast<int>((timeout - Since(start)) * 1000);
    if (left_ms <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, left_ms) <= 0) continue;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) return false;
    line->append(buffer, n);
  }
  line->resize(line->find('\n') == std::string::npos ? line->size() : line->find('\n'));
  return true;
}

void WriteAll(int fd, const std::string& text, double timeout) {
  const auto start = Clock::now();
  for (size_t done = 0; done < text.size();) {
    const int left_ms = static_cast<int>((timeout - Since(start)) * 1000);
    if (left_ms <= 0) return;
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, left_ms) <= 0) continue;
    const ssize_t n = send(fd, text.data() + done, text.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return;
    done += n;
  }
}

class HangWatchImpl : public HangWatch {
 public:
  HangWatchImpl(const Topology& topology, int rank, const std::string& host, double deadline)
      : topology_(topology), rank_(rank), host_(host), deadline_(deadline) {}

  ~HangWatchImpl() override {
    progress::SetDeadlineHandler(nullptr);
    if (responder_.joinable()) {
      const char byte = 0;
      if (write(wake_[1], &byte, 1) < 0) {
      }
      responder_.join();
    }
    for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
      if (fd >= 0) close(fd);
    }
  }

  void Publish() {
    progress::SetRank(rank_);
    Endpoint mine;
    mine.pid = static_cast<int32_t>(getpid());
    mine.progress_fd = progress::SharedFd();
    mine.start_time = progress::StartTime(mine.pid);
    std::snprintf(mine.host, sizeof(mine.host), "%s", host_.c_str());
    const std::vector<std::string> addresses = LocalAddresses(host_);
    for (const std::string& address : addresses) {
      if (mine.num_addresses == kMaxAddresses) break;
      std::snprintf(mine.addresses[mine.num_addresses++], sizeof(mine.addresses[0]), "%s",
                    address.c_str());
    }
    mine.port = OpenListener();
    std::random_device random;
    mine.token = (uint64_t{random()} << 32) ^ random() ^ uint64_t(mine.pid);
    endpoints_.resize(topology_.world_size());
    MPI_Allgather(&mine, sizeof(Endpoint), MPI_BYTE, endpoints_.data(), sizeof(Endpoint), MPI_BYTE,
                  MPI_COMM_WORLD);
    token_ = endpoints_[0].token;  // one job, one token: rank 0's
    if (mine.port > 0 && pipe2(wake_, O_CLOEXEC) == 0) {
      responder_ = std::thread([this] { Serve(); });
    }
    progress::SetDeadlineHandler([this](const std::string& message) { return Diagnose(message); });
  }

 private:
  struct Answer {
    Contact contact = Contact::kNoConnection;
    std::string detail;
    json reply;
  };

  // A listening socket on every interface, on a port the kernel picks; 0 if none.
  int OpenListener() {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) return 0;
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    address.sin_port = 0;
    socklen_t length = sizeof(address);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        listen(listen_fd_, 128) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      close(listen_fd_);
      listen_fd_ = -1;
      return 0;
    }
    return ntohs(address.sin_port);
  }

  // The status responder: one request per connection, answered at once.
  void Serve() {
    for (;;) {
      pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      if (poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents) return;
      if (!(fds[0].revents & POLLIN)) continue;
      const int connection = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (connection < 0) continue;
      std::string request;
      if (ReadLine(connection, kRequestTimeout, &request))
        WriteAll(connection, Respond(request) + "\n", kRequestTimeout);
      close(connection);
    }
  }

  std::string Respond(const std::string& text) {
    json request = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!request.is_object() || request.value("token", uint64_t{0}) != token_)
      return json{{"error", "not this job"}}.dump();
    json reply = {{"token", token_}, {"rank", rank_}};
    const std::string ask = request.value("ask", "");
    if (ask == "status") {
      // The rank asking is writing the report: a deadline that passes here later leaves it to it.
      if (request.contains("reporter")) Claim(request.value("reporter", -1));
      reply["record"] = json(progress::Read());
    } else if (ask == "claim") {
      reply["holder"] = Claim(request.value("from", -1));
    } else if (ask == "peek") {
      const int pid = request.value("pid", 0);
      reply["state"] = progress::ProcessState(pid, request.value("start_time", 0LL));
      std::string error;
      if (auto record = progress::Peek(pid, request.value("fd", -1), &error)) {
        reply["record"] = json(*record);
      } else {
        reply["error"] = error;
      }
    } else {
      reply["error"] = "unknown request";
    }
    return reply.dump();
  }

  // The first claimant holds the report; every later one learns who.
  int Claim(int from) {
    std::lock_guard<std::mutex> lock(claim_mutex_);
    if (holder_ < 0) holder_ = from;
    return holder_;
  }

  // The request to each rank of `asks`, all at once, with non-blocking sockets; each answer
  // within `timeout` seconds.
  std::vector<Answer> AskAll(const std::vector<std::pair<int, json>>& asks, double timeout) {
    struct Connection {
      int rank = 0;
      std::vector<std::string> addresses;
      size_t next = 0;
      int fd = -1;
      enum Phase { kConnect, kSend, kReceive, kDone } phase = kConnect;
      Clock::time_point connect_start;
      int error = 0;
      std::string out, in;
    };
    const auto start = Clock::now();
    std::vector<Answer> answers(asks.size());
    std::vector<Connection> connections(asks.size());
    auto finish = [&](size_t i, Contact contact, const std::string& detail) {
      Connection& c = connections[i];
      if (c.fd >= 0) close(c.fd);
      c.fd = -1;
      c.phase = Connection::kDone;
      answers[i].contact = contact;
      answers[i].detail = detail;
    };
    // Connects to the next address of `i`; finishes it when none is left.
    auto connect_next = [&](size_t i) {
      Connection& c = connections[i];
      if (c.fd >= 0) close(c.fd);
      c.fd = -1;
      while (c.next < c.addresses.size()) {
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_port = htons(static_cast<uint16_t>(endpoints_[c.rank].port));
        if (inet_pton(AF_INET, c.addresses[c.next++].c_str(), &address.sin_addr) != 1) continue;
        c.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (c.fd < 0) break;
        c.connect_start = Clock::now();
        if (connect(c.fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
          c.phase = Connection::kSend;
          return;
        }
        if (errno == EINPROGRESS) {
          c.phase = Connection::kConnect;
          return;
        }
        c.error = errno;
        close(c.fd);
        c.fd = -1;
      }
      if (c.error == ECONNREFUSED) {
        finish(i, Contact::kRefused, "connection refused: nothing listens on its status port");
      } else {
        finish(i, Contact::kNoConnection,
               std::string("no connection to its status port") +
                   (c.error ? std::string(": ") + std::strerror(c.error) : ""));
      }
    };
    for (size_t i = 0; i < asks.size(); ++i) {
      Connection& c = connections[i];
      c.rank = asks[i].first;
      const Endpoint& e = endpoints_[c.rank];
      c.out = asks[i].second.dump() + "\n";
      if (e.port <= 0) {
        finish(i, Contact::kNoChannel, "it has no status channel (none could be opened)");
        continue;
      }
      if (std::string(e.host) == host_) c.addresses.push_back("127.0.0.1");
      for (int a = 0; a < std::min<int>(e.num_addresses, kMaxAddresses); ++a)
        c.addresses.push_back(e.addresses[a]);
      connect_next(i);
    }
    for (;;) {
      std::vector<pollfd> fds;
      std::vector<size_t> which;
      for (size_t i = 0; i < connections.size(); ++i) {
        Connection& c = connections[i];
        if (c.phase == Connection::kDone) continue;
        if (c.phase == Connection::kConnect && Since(c.connect_start) > kConnectTimeout &&
            c.next < c.addresses.size()) {
          c.error = ETIMEDOUT;
          connect_next(i);
          if (c.phase == Connection::kDone) continue;
        }
        fds.push_back(
            {c.fd, static_cast<short>(c.phase == Connection::kReceive ? POLLIN : POLLOUT), 0});
        which.push_back(i);
      }
      const double left = timeout - Since(start);
      if (fds.empty() || left <= 0) break;
      if (poll(fds.data(), fds.size(), std::max(1, std::min(100, int(left * 1000)))) < 0 &&
          errno != EINTR)
        break;
      for (size_t k = 0; k < fds.size(); ++k) {
        const size_t i = which[k];
        Connection& c = connections[i];
        if (!fds[k].revents) continue;
        if (c.phase == Connection::kConnect) {
          int error = 0;
          socklen_t length = sizeof(error);
          getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &error, &length);
          if (error != 0) {
            c.error = error;
            connect_next(i);
            continue;
          }
          c.phase = Connection::kSend;
        }
        if (c.phase == Connection::kSend) {
          const ssize_t n = send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
          if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            finish(i, Contact::kNoAnswer,
                   std::string("the connection failed: ") + std::strerror(errno));
            continue;
          }
          if (n > 0) c.out.erase(0, n);
          if (c.out.empty()) c.phase = Connection::kReceive;
          continue;
        }
        char buffer[8192];
        const ssize_t n = recv(c.fd, buffer, sizeof(buffer), 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (n <= 0) {
          finish(i, Contact::kNoAnswer, "it closed the connection without answering");
          continue;
        }
        c.in.append(buffer, n);
        if (c.in.size() > kMaxAnswerBytes) {
          finish(i, Contact::kNoAnswer, "its answer is too long");
          continue;
        }
        const size_t end = c.in.find('\n');
        if (end == std::string::npos) continue;
        json reply = json::parse(c.in.substr(0, end), nullptr, false);
        if (!reply.is_object() || reply.value("token", uint64_t{0}) != token_ ||
            reply.value("rank", -1) != c.rank) {
          finish(i, Contact::kNoAnswer, "something else answered on its status port");
          continue;
        }
        finish(i, Contact::kAnswered, "");
        answers[i].reply = std::move(reply);
      }
    }
    for (size_t i = 0; i < connections.size(); ++i) {
      const Connection& c = connections[i];
      if (c.phase == Connection::kDone) continue;
      if (c.phase == Connection::kConnect) {
        finish(i, Contact::kNoConnection,
               Format("no connection to its status port within %.1f s", timeout));
      } else {
        finish(i, Contact::kNoAnswer,
               Format("it accepted the connection but did not answer within %.1f s", timeout));
      }
    }
    return answers;
  }

  // The rank that writes the report: this one, unless a lower rank that answers was claimed
  // already.
  int ClaimReport() {
    {
      std::lock_guard<std::mutex> lock(claim_mutex_);
      if (holder_ >= 0) return holder_;  // another rank asked this one for its status already
    }
    const auto start = Clock::now();
    for (int candidate = 0; candidate < rank_; ++candidate) {
      const double left = kClaimBudget - Since(start);
      if (left <= 0.1) break;
      const Answer answer =
          AskAll({{candidate, {{"token", token_}, {"ask", "claim"}, {"from", rank_}}}},
                 std::min(kClaimTimeout, left))
              .front();
      if (answer.contact != Contact::kAnswered) continue;
      const int holder = answer.reply.value("holder", rank_);
      if (holder == rank_) Claim(rank_);  // later claimants that cannot reach `candidate`
      return holder;
    }
    return Claim(rank_);
  }

  std::vector<RankStatus> Collect() {
    const int world = topology_.world_size();
    std::vector<RankStatus> statuses(world);
    std::vector<std::pair<int, json>> asks;
    for (int r = 0; r < world; ++r) {
      statuses[r].rank = r;
      statuses[r].host = endpoints_[r].host;
      statuses[r].pid = endpoints_[r].pid;
      if (r != rank_)
        asks.push_back({r, {{"token", token_}, {"ask", "status"}, {"reporter", rank_}}});
    }
    statuses[rank_].contact = Contact::kSelf;
    statuses[rank_].record = progress::Read();
    const std::vector<Answer> answers = AskAll(asks, kStatusTimeout);
    for (size_t i = 0; i < asks.size(); ++i) {
      RankStatus& s = statuses[asks[i].first];
      s.contact = answers[i].contact;
      s.contact_detail = answers[i].detail;
      if (s.contact != Contact::kAnswered) continue;
      try {
        s.record = answers[i].reply.at("record").get<progress::Snapshot>();
      } catch (const std::exception& error) {
        s.contact = Contact::kNoAnswer;
        s.contact_detail = std::string("its answer cannot be read: ") + error.what();
      }
    }
    // A rank that cannot answer: its process state and record, read on its node (here, or by a
    // rank of that node that answered).
    std::vector<std::pair<int, json>> peeks;
    std::vector<int> peeked;
    for (RankStatus& s : statuses) {
      if (s.contact == Contact::kSelf || s.contact == Contact::kAnswered) continue;
      const Endpoint& e = endpoints_[s.rank];
      if (s.host == host_) {
        s.process_state = progress::ProcessState(e.pid, e.start_time);
        std::string error;
        if (auto record = progress::Peek(e.pid, e.progress_fd, &error)) {
          s.record = std::move(record);
          s.record_from_node = true;
        }
        continue;
      }
      for (const RankStatus& other : statuses) {
        if (other.host == s.host && other.contact == Contact::kAnswered) {
          peeks.push_back({other.rank,
                           {{"token", token_},
                            {"ask", "peek"},
                            {"pid", e.pid},
                            {"fd", e.progress_fd},
                            {"start_time", e.start_time}}});
          peeked.push_back(s.rank);
          break;
        }
      }
    }
    if (!peeks.empty()) {
      const std::vector<Answer> answers = AskAll(peeks, kPeekTimeout);
      for (size_t i = 0; i < peeks.size(); ++i) {
        if (answers[i].contact != Contact::kAnswered) continue;
        RankStatus& s = statuses[peeked[i]];
        s.process_state = answers[i].reply.value("state", "");
        if (answers[i].reply.contains("record")) {
          try {
            s.record = answers[i].reply.at("record").get<progress::Snapshot>();
            s.record_from_node = true;
          } catch (const std::exception&) {
          }
        }
      }
    }
    return statuses;
  }

  std::vector<int> Members(int rank, const std::string& group) const {
    if (group == "pp") return topology_.PpGroup(rank);
    if (group == "dp") return topology_.DpGroup(rank);
    if (group == "tp") return topology_.TpGroup(rank);
    if (group == "tied") return topology_.TiedGroup(rank);
    if (group == "world") {
      std::vector<int> all(topology_.world_size());
      for (int r = 0; r < topology_.world_size(); ++r) all[r] = r;
      return all;
    }
    return {};
  }

  // The deadline handler: runs on the thread whose wait passed its deadline.
  std::string Diagnose(const std::string&) {
    {
      std::lock_guard<std::mutex> lock(claim_mutex_);
      if (diagnosed_) return "";
      diagnosed_ = true;
    }
    try {
      const auto start = Clock::now();
      const int holder = ClaimReport();
      if (holder != rank_) {
        std::fprintf(stderr,
                     "bigmac: [hang] rank %d: its wait passed the deadline too; rank %d writes "
                     "the hang report\n",
                     rank_, holder);
        std::fflush(stderr);
        std::this_thread::sleep_for(std::chrono::duration<double>(kWaitForReporter));
        return Format(" (rank %d was to write the hang report, but the job did not stop)", holder);
      }
      const std::vector<RankStatus> statuses = Collect();
      const HangReport report =
          ExplainHang(statuses, rank_,
                      [this](int rank, const std::string& group) { return Members(rank, group); });
      std::string text = Format(
          "bigmac: [hang] a wait of rank %d ran out of time (train.comm_timeout_seconds=%g); "
          "the state of all %d ranks, collected in %.1f s:\n",
          rank_, deadline_, topology_.world_size(), Since(start));
      for (const std::string& line : report.ranks) text += "bigmac: [hang]   " + line + "\n";
      text += "bigmac: hang: " + report.summary + "\n";
      if (!report.lost_hosts_line.empty()) text += "bigmac: hang: " + report.lost_hosts_line + "\n";
      std::fputs(text.c_str(), stderr);
      std::fflush(stderr);
      // After the report: a shared filesystem whose server was on the lost node may block.
      if (const std::string problem = RecordLostHosts(report.lost_hosts); !problem.empty()) {
        std::fputs(problem.c_str(), stderr);
        std::fflush(stderr);
      }
      return " (the hang report above explains it)";
    } catch (const std::exception& error) {
      return std::string(" (no hang report: ") + error.what() + ")";
    }
  }

  // The lost hosts, a line each, into the file BIGMAC_LOST_HOSTS_FILE names (the sbatch scripts
  // set it, and requeue the job without them when the partition has a spare node:
  // launch/slurm/common.sh). Returns "" or a report line saying why it could not be written.
  static std::string RecordLostHosts(const std::vector<std::string>& hosts) {
    const char* path = std::getenv("BIGMAC_LOST_HOSTS_FILE");
    if (hosts.empty() || path == nullptr || *path == '\0') return "";
    std::string problem;
    std::unique_ptr<util::OutputFile> file = util::OutputFile::Open(path, &problem);
    if (file) {
      for (const std::string& host : hosts) file->Write(host + "\n");
      problem = file->Commit();
    }
    return problem.empty() ? "" : "bigmac: hang: BIGMAC_LOST_HOSTS_FILE: " + problem + "\n";
  }

  const Topology topology_;
  const int rank_;
  const std::string host_;
  const double deadline_;
  std::vector<Endpoint> endpoints_;
  uint64_t token_ = 0;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::thread responder_;
  std::mutex claim_mutex_;
  int holder_ = -1;
  bool diagnosed_ = false;
};

}  // namespace

std::unique_ptr<HangWatch> HangWatch::Start(const Topology& topology, int world_rank,
                                            const std::string& host, double deadline_seconds) {
  auto watch = std::make_unique<HangWatchImpl>(topology, world_rank, host, deadline_seconds);
  watch->Publish();
  return watch;
}

}  // namespace bigmac::comm
