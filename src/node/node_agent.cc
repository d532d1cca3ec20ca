#include "node/node_agent.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <list>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "common/log.h"
#include "common/mutex.h"
#include "node/node_protocol.h"

namespace tensorhub::node {
namespace {

using Json = nlohmann::json;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string Name(const std::string& model, Version v) {
  return model + "@" + std::to_string(v.value());
}

// The host copy of one version: shared memory (a memfd) the agent fetched
// into and serves from, and the read-only descriptor engines get. Freed
// (unmapped, closed) with the last reference; engines' mappings keep the
// pages alive after that.
struct Copy {
  Copy(std::string m, Version v) : model(std::move(m)), version(v) {}
  ~Copy() {
    if (base != nullptr) munmap(base, map_bytes);
    if (ro_fd >= 0) close(ro_fd);
    if (fd >= 0) close(fd);
  }
  Copy(const Copy&) = delete;
  Copy& operator=(const Copy&) = delete;

  const std::string model;
  const Version version;
  enum class Phase { kFetching, kReady, kFailed } phase = Phase::kFetching;
  Status error;           // kFailed
  uint32_t sessions = 0;  // engines holding it
  bool superseded = false;
  bool served = false;  // registered with the hub by its fetch
  int fd = -1;
  int ro_fd = -1;
  void* base = nullptr;
  size_t map_bytes = 0;
  AcquireReply reply;  // what engines are told (tensors, metadata)
};

// Read-only descriptor of the same memory: an engine cannot write through
// it, nor map it writable and shared (a private mapping's writes stay in
// the engine).
Result<int> ReopenReadOnly(int fd) {
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  const int ro = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (ro < 0) {
    return Internal("node agent: reopen " + path +
                    " read-only: " + strerror(errno));
  }
  return ro;
}

}  // namespace

class NodeAgent::Impl {
 public:
  Impl(NodeAgentOptions options, std::unique_ptr<Client> client, int listen_fd,
       int stop_read, int stop_write)
      : options_(std::move(options)),
        client_(std::move(client)),
        listen_fd_(listen_fd),
        stop_read_(stop_read),
        stop_write_(stop_write) {
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }

  ~Impl() {
    Stop();
    close(listen_fd_);
    close(stop_read_);
    close(stop_write_);
  }

  void Stop() {
    {
      MutexLock lock(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    char b = 1;
    ssize_t ignored = write(stop_write_, &b, 1);  // wakes every poll
    (void)ignored;
    cv_.notify_all();
    if (accept_thread_.joinable()) accept_thread_.join();
    std::list<std::thread> threads;
    {
      MutexLock lock(mu_);
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
    // Withdraw the copies (drains reads from other hosts); engines keep
    // what they mapped.
    std::map<std::string, std::shared_ptr<Copy>> copies;
    {
      MutexLock lock(mu_);
      copies.swap(copies_);
    }
    for (auto& [model, c] : copies) {
      if (c != nullptr) Withdraw(*c);
    }
  }

  NodeAgentStats stats() const {
    MutexLock lock(mu_);
    NodeAgentStats s = stats_;
    s.sessions = sessions_;
    for (const auto& [model, c] : copies_) {
      if (c == nullptr) continue;
      NodeCopyStatus cs;
      cs.model = model;
      cs.version = c->version;
      cs.state = c->phase == Copy::Phase::kReady ? "ready" : "fetching";
      cs.bytes = c->reply.bytes;
      cs.sessions = c->sessions;
      cs.superseded = c->superseded;
      s.copies.push_back(cs);
    }
    return s;
  }

  const std::string& socket() const { return options_.socket; }
  const WorkerId& worker() const { return client_->id(); }
  std::string data_address() const { return client_->data_address(); }

 private:
  // One engine connection: the copy it holds, if any.
  struct Session {
    int sock;
    std::shared_ptr<Copy> held;
  };

  void AcceptLoop() {
    for (;;) {
      struct pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_read_, POLLIN, 0}};
      if (poll(p, 2, -1) < 0) {
        if (errno == EINTR) continue;
        TH_LOG(ERROR) << "node agent: poll: " << strerror(errno);
        return;
      }
      if (p[1].revents != 0) return;
      const int sock = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (sock < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) {
          continue;
        }
        TH_LOG(WARN) << "node agent: accept: " << strerror(errno);
        continue;
      }
      if (Status s = CheckPeer(sock); !s.ok()) {
        TH_LOG(WARN) << "node agent: " << s.message();
        (void)SendMessage(sock, EncodeError(s, true), -1, 1000);
        close(sock);
        continue;
      }
      MutexLock lock(mu_);
      ReapLocked();
      if (sessions_ >= options_.max_sessions) {
        ++stats_.refused;
        lock.Unlock();
        (void)SendMessage(
            sock,
            EncodeError(
                ResourceExhausted(
                    "node agent: " + std::to_string(options_.max_sessions) +
                    " sessions open; fetch it yourself"),
                true),
            -1, 1000);
        close(sock);
        continue;
      }
      ++sessions_;
      auto done = std::make_shared<std::atomic<bool>>(false);
      threads_.emplace_back([this, sock, done] {
        Serve(sock);
        close(sock);
        {
          MutexLock l(mu_);
          --sessions_;
        }
        done->store(true);
      });
      done_flags_.push_back(done);
    }
  }

  // Joins the session threads that ended (their flags are set last).
  void ReapLocked() TH_REQUIRES(mu_) {
    auto t = threads_.begin();
    auto d = done_flags_.begin();
    while (t != threads_.end()) {
      if ((*d)->load()) {
        t->join();
        t = threads_.erase(t);
        d = done_flags_.erase(d);
      } else {
        ++t;
        ++d;
      }
    }
  }

  // Only this user's processes (or root's) may read the host copy: an
  // abstract socket has no file permissions of its own.
  static Status CheckPeer(int sock) {
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      return PermissionDenied(std::string("SO_PEERCRED: ") + strerror(errno));
    }
    if (cred.uid != geteuid() && cred.uid != 0) {
      return PermissionDenied("a process of uid " + std::to_string(cred.uid) +
                              " (pid " + std::to_string(cred.pid) +
                              ") asked; only uid " + std::to_string(geteuid()) +
                              " and root may read this agent's copies");
    }
    return Status();
  }

  void Serve(int sock) {
    Session session{sock, nullptr};
    for (;;) {
      Result<std::string> msg =
          ReceiveMessage(sock, kMaxRequestBytes, -1, stop_read_, nullptr);
      if (!msg.ok()) break;  // closed, stopping, or malformed framing
      Result<Request> req = ParseRequest(*msg);
      if (!req.ok()) {
        (void)SendMessage(sock, EncodeError(req.status(), false), -1, 5000);
        break;
      }
      bool keep = true;
      switch (req->op) {
        case Op::kStatus:
          keep = Reply(sock, EncodeOk(StatusJson()));
          break;
        case Op::kRelease:
          Release(session);
          keep = Reply(sock, EncodeOk());
          break;
        case Op::kStage:
          keep = Stage(session, *req);
          break;
        case Op::kAcquire:
          keep = Acquire(session, *req);
          break;
      }
      if (!keep) break;
    }
    Release(session);
  }

  static bool Reply(int sock, const std::string& json, int fd = -1) {
    return SendMessage(sock, json, fd, 30000).ok();
  }

  void Release(Session& s) {
    if (s.held == nullptr) return;
    MutexLock lock(mu_);
    --s.held->sessions;
    s.held.reset();
    cv_.notify_all();
  }

  // The version a request names: an explicit one as is, `latest` (in a
  // reader group, its pinned one) asked of the hub. Also its manifest,
  // when asked (unless the agent holds it ready).
  Result<VersionInfo> Resolve(const Request& r) {
    if (!r.group.empty() && r.version.is_latest()) {
      return client_->Describe(r.model, r.version, r.group, r.step);
    }
    return client_->Describe(r.model, r.version);
  }

  enum class Next { kServe, kFetch, kError, kMiss };
  struct Plan {
    Next next = Next::kError;
    std::shared_ptr<Copy> copy;
    std::shared_ptr<Copy> evict;  // kFetch: withdraw and free this first
    Status error;
    bool fallback = false;
  };

  // What a request for `v` of `model` does, waiting (until `deadline_ms`)
  // while the copy is being fetched or an older one still has sessions.
  // kServe counts a session on the copy when `count_session`. Where the
  // request would have to fetch and `may_fetch` is false: kMiss, nothing
  // changed.
  Plan Decide(const std::string& model, Version v, int64_t deadline_ms,
              bool count_session, bool may_fetch = true) {
    MutexLock lock(mu_);
    const int64_t replace_deadline_ms =
        std::min(deadline_ms, NowMs() + options_.replace_wait_ms);
    std::shared_ptr<Copy> waiting_on;
    for (;;) {
      Plan p;
      if (stopped_) {
        p.error = Unavailable("node agent: stopping");
        p.fallback = true;
        return p;
      }
      if (waiting_on != nullptr && waiting_on->phase == Copy::Phase::kFailed) {
        p.error = waiting_on->error;
        return p;
      }
      std::shared_ptr<Copy>& cur = copies_[model];
      if (cur != nullptr && cur->version == v) {
        if (cur->phase == Copy::Phase::kReady) {
          if (cur->superseded) {
            ++stats_.refused;
            p.error = FailedPrecondition(
                "node agent: " + Name(model, v) +
                " is being replaced by a newer version; fetch it yourself");
            p.fallback = true;
            return p;
          }
          if (count_session) {
            ++cur->sessions;
            ++stats_.acquired;
          }
          p.next = Next::kServe;
          p.copy = cur;
          return p;
        }
        waiting_on = cur;  // being fetched
        if (!WaitLocked(lock, deadline_ms)) {
          p.error = DeadlineExceeded("node agent: " + Name(model, v) +
                                     " is still being fetched");
          return p;
        }
        continue;
      }
      if (cur != nullptr && cur->version > v) {
        ++stats_.refused;
        p.error = FailedPrecondition(
            "node agent: holds " + Name(model, cur->version) + ", newer than " +
            Name(model, v) + "; fetch it yourself");
        p.fallback = true;
        return p;
      }
      if (cur != nullptr &&
          (cur->sessions > 0 || cur->phase == Copy::Phase::kFetching)) {
        // Older, and still read or fetched: wait for it to be free. New
        // sessions on it are refused meanwhile, so this ends.
        cur->superseded = true;
        if (!WaitLocked(lock, replace_deadline_ms)) {
          ++stats_.refused;
          p.error = Unavailable(
              "node agent: its copy of " + Name(model, cur->version) +
              " is still held by " + std::to_string(cur->sessions) +
              " session(s); fetch " + Name(model, v) + " yourself");
          p.fallback = true;
          return p;
        }
        continue;
      }
      // Nothing held, or an older copy no one holds: this request fetches.
      if (!may_fetch) {
        p.next = Next::kMiss;
        return p;
      }
      p.next = Next::kFetch;
      p.evict = std::move(cur);
      cur = std::make_shared<Copy>(model, v);
      p.copy = cur;
      ++stats_.fetches;
      return p;
    }
  }

  // False at the deadline (or when stopping).
  bool WaitLocked(MutexLock& lock, int64_t deadline_ms) TH_REQUIRES(mu_) {
    const int64_t left = deadline_ms - NowMs();
    if (left <= 0 || stopped_) return false;
    cv_.wait_for(lock.native(), std::chrono::milliseconds(left));
    return !stopped_;
  }

  // Withdraws a copy from the hub (its reads drained) before it is freed.
  void Withdraw(Copy& c) {
    if (!c.served) return;
    Status s = client_->Unpublish(c.model, c.version, 30000);
    if (s.code() == StatusCode::kFailedPrecondition) {
      // The last reliable copy of a retained version, and no keeper took
      // it within the timeout: the host needs the memory for the newer one.
      TH_LOG(WARN) << "node agent: " << Name(c.model, c.version) << ": "
                   << s.message() << "; dropping it anyway";
      s = client_->Unpublish(c.model, c.version, 30000, /*force=*/true);
    }
    if (!s.ok()) {
      TH_LOG(WARN) << "node agent: withdrawing " << Name(c.model, c.version)
                   << ": " << s.ToString();
    }
    c.served = false;
  }

  // Fills `c` (the table's entry, phase kFetching): memory, then the fetch.
  Status Fetch(Copy& c, const VersionInfo& info, int64_t deadline_ms) {
    if (info.state != VersionState::kCommitted) {
      return FailedPrecondition(Name(c.model, c.version) + " is " +
                                std::string(VersionStateName(info.state)) +
                                ", not fetchable");
    }
    AcquireReply& r = c.reply;
    r.model = c.model;
    r.version = c.version;
    r.holder = client_->id().value();
    for (const TensorInfo& t : info.tensors) {
      r.tensors.push_back(
          CopyTensor{t.spec.name, t.spec.dtype, t.spec.shape, 0, t.bytes});
    }
    r.metadata = info.metadata;
    r.bytes = LayOut(r.tensors);
    if (options_.memory_limit_bytes > 0 &&
        r.bytes > options_.memory_limit_bytes) {
      return ResourceExhausted("node agent: " + Name(c.model, c.version) +
                               " needs " + std::to_string(r.bytes) +
                               " bytes, over its memory limit of " +
                               std::to_string(options_.memory_limit_bytes));
    }
    const std::string label = "tensorhub " + Name(c.model, c.version);
    c.fd = memfd_create(label.c_str(), MFD_CLOEXEC);
    if (c.fd < 0) {
      return ResourceExhausted(std::string("node agent: memfd_create: ") +
                               strerror(errno));
    }
    c.map_bytes = std::max<uint64_t>(r.bytes, 1);
    if (ftruncate(c.fd, static_cast<off_t>(c.map_bytes)) != 0) {
      return ResourceExhausted(std::string("node agent: ftruncate: ") +
                               strerror(errno));
    }
    // Faulted in now, so that neither the zeroing nor the faults land in
    // the fetch; huge pages where the kernel's shmem setting allows.
    void* base = mmap(nullptr, c.map_bytes, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_POPULATE, c.fd, 0);
    if (base == MAP_FAILED) {
      return ResourceExhausted("node agent: mmap of " +
                               std::to_string(c.map_bytes) +
                               " bytes: " + strerror(errno));
    }
    c.base = base;
    (void)madvise(base, c.map_bytes, MADV_HUGEPAGE);
    TH_ASSIGN_OR_RETURN(c.ro_fd, ReopenReadOnly(c.fd));
    std::vector<TensorRef> dest;
    dest.reserve(r.tensors.size());
    for (const CopyTensor& t : r.tensors) {
      TensorRef ref;
      ref.spec = TensorSpec{t.name, t.dtype, t.shape};
      ref.data = static_cast<char*>(base) + t.offset;
      ref.bytes = t.bytes;
      dest.push_back(std::move(ref));
    }
    FetchOptions fo;
    fo.timeout_ms = std::max<int64_t>(1, deadline_ms - NowMs());
    fo.connections = options_.fetch_connections;
    fo.serve = true;  // a holder for the other hosts, as any reader
    const int64_t t0 = NowMs();
    Result<FetchStats> st = client_->Fetch(c.model, c.version, dest, fo);
    if (!st.ok()) return st.status();
    c.served = true;
    TH_LOG(INFO) << "node agent: fetched " << Name(c.model, c.version) << ", "
                 << st->bytes << " bytes in " << (NowMs() - t0) << " ms from "
                 << st->sources_used << " holder(s) (" << st->bytes_same_host
                 << " from this host)";
    return Status();
  }

  // Runs the fetch `p` planned and publishes its outcome to every waiter;
  // with `take_session`, the caller holds the copy from the moment it is
  // ready (before any newer version could evict it).
  Status RunFetch(Plan& p, const VersionInfo& info, int64_t deadline_ms,
                  bool take_session) {
    if (p.evict != nullptr) {
      Withdraw(*p.evict);
      TH_LOG(INFO) << "node agent: dropped "
                   << Name(p.evict->model, p.evict->version) << " for "
                   << Name(p.copy->model, p.copy->version);
      // The last reference: its memory goes now, before the newer version's
      // is allocated (what engines still map lives on with their mappings).
      p.evict.reset();
    }
    Status s = Fetch(*p.copy, info, deadline_ms);
    if (!s.ok() && p.copy->served) Withdraw(*p.copy);
    MutexLock lock(mu_);
    if (s.ok()) {
      p.copy->phase = Copy::Phase::kReady;
      if (take_session) {
        ++p.copy->sessions;
        ++stats_.acquired;
      }
    } else {
      p.copy->phase = Copy::Phase::kFailed;
      p.copy->error = s;
      ++stats_.fetch_failures;
      auto it = copies_.find(p.copy->model);
      if (it != copies_.end() && it->second == p.copy) copies_.erase(it);
      TH_LOG(WARN) << "node agent: fetching "
                   << Name(p.copy->model, p.copy->version) << ": "
                   << s.ToString();
    }
    cv_.notify_all();
    return s;
  }

  // Resolves the request's version and plans. For an explicit version the
  // agent already holds ready, the hub is not asked.
  Result<Plan> Prepare(const Request& r, int64_t deadline_ms,
                       bool count_session, VersionInfo* info) {
    Version v = r.version;
    if (!v.is_latest()) {
      MutexLock lock(mu_);
      auto it = copies_.find(r.model);
      if (it != copies_.end() && it->second != nullptr &&
          it->second->version == v &&
          it->second->phase == Copy::Phase::kReady) {
        lock.Unlock();
        Plan p = Decide(r.model, v, deadline_ms, count_session,
                        /*may_fetch=*/false);
        if (p.next != Next::kMiss) return p;
      }
    }
    TH_ASSIGN_OR_RETURN(*info, Resolve(r));
    if (info->state != VersionState::kCommitted) {
      return FailedPrecondition(Name(r.model, info->version) + " is " +
                                std::string(VersionStateName(info->state)) +
                                ", not fetchable");
    }
    return Decide(r.model, info->version, deadline_ms, count_session);
  }

  bool Stage(Session& s, const Request& r) {
    const int64_t deadline_ms = NowMs() + r.timeout_ms;
    VersionInfo info;
    Result<Plan> p = Prepare(r, deadline_ms, /*count_session=*/false, &info);
    if (!p.ok()) return Reply(s.sock, EncodeError(p.status(), false));
    if (p->next == Next::kError) {
      return Reply(s.sock, EncodeError(p->error, p->fallback));
    }
    Json j{{"model", r.model},
           {"version", p->copy->version.value()},
           {"state", p->next == Next::kServe ? "ready" : "fetching"}};
    const bool keep = Reply(s.sock, EncodeOk(j.dump()));
    // The stager fetches, after it answered; the engine need not wait.
    if (p->next == Next::kFetch) {
      (void)RunFetch(*p, info, deadline_ms, /*take_session=*/false);
    }
    return keep;
  }

  bool Acquire(Session& s, const Request& r) {
    if (s.held != nullptr) {
      return Reply(
          s.sock,
          EncodeError(FailedPrecondition("node agent: this session holds " +
                                         Name(s.held->model, s.held->version) +
                                         "; release it first"),
                      false));
    }
    const int64_t deadline_ms = NowMs() + r.timeout_ms;
    VersionInfo info;
    Result<Plan> p = Prepare(r, deadline_ms, /*count_session=*/true, &info);
    if (!p.ok()) return Reply(s.sock, EncodeError(p.status(), false));
    bool fetched_now = false;
    if (p->next == Next::kFetch) {
      Status f = RunFetch(*p, info, deadline_ms, /*take_session=*/true);
      if (!f.ok()) return Reply(s.sock, EncodeError(f, false));
      fetched_now = true;
      p->next = Next::kServe;
    }
    if (p->next != Next::kServe) {
      return Reply(s.sock, EncodeError(p->error, p->fallback));
    }
    s.held = p->copy;
    AcquireReply reply = p->copy->reply;  // immutable once ready
    reply.fetched_now = fetched_now;
    return Reply(s.sock, EncodeAcquireReply(reply), p->copy->ro_fd);
  }

  std::string StatusJson() const {
    NodeAgentStats st = stats();
    Json copies = Json::array();
    for (const NodeCopyStatus& c : st.copies) {
      copies.push_back(Json{{"model", c.model},
                            {"version", c.version.value()},
                            {"state", c.state},
                            {"bytes", c.bytes},
                            {"sessions", c.sessions},
                            {"superseded", c.superseded}});
    }
    Json j{{"worker", client_->id().value()},
           {"data_address", client_->data_address()},
           {"socket", options_.socket},
           {"fetches", st.fetches},
           {"fetch_failures", st.fetch_failures},
           {"acquired", st.acquired},
           {"refused", st.refused},
           {"sessions", st.sessions},
           {"copies", copies}};
    return j.dump(-1, ' ', false, Json::error_handler_t::replace);
  }

  const NodeAgentOptions options_;
  const std::unique_ptr<Client> client_;
  const int listen_fd_;
  const int stop_read_;
  const int stop_write_;
  std::thread accept_thread_;

  mutable Mutex mu_;
  std::condition_variable cv_;  // a copy changed phase or lost a session
  bool stopped_ TH_GUARDED_BY(mu_) = false;
  std::map<std::string, std::shared_ptr<Copy>> copies_ TH_GUARDED_BY(mu_);
  std::list<std::thread> threads_ TH_GUARDED_BY(mu_);
  std::list<std::shared_ptr<std::atomic<bool>>> done_flags_ TH_GUARDED_BY(mu_);
  size_t sessions_ TH_GUARDED_BY(mu_) = 0;
  NodeAgentStats stats_ TH_GUARDED_BY(mu_);
};

Result<std::unique_ptr<NodeAgent>> NodeAgent::Start(NodeAgentOptions options) {
  TH_RETURN_IF_ERROR(CheckSocketName(options.socket));
  if (options.max_sessions == 0) {
    return InvalidArgument("node agent: max_sessions must be at least 1");
  }
  TH_ASSIGN_OR_RETURN(int listen_fd, Listen(options.socket, 128));
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    close(listen_fd);
    return Internal(std::string("node agent: pipe: ") + strerror(errno));
  }
  Result<std::unique_ptr<Client>> client = Client::Connect(options.client);
  if (!client.ok()) {
    close(listen_fd);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    if (options.socket[0] != '@') unlink(options.socket.c_str());
    return client.status();
  }
  auto impl = std::make_unique<Impl>(std::move(options), std::move(*client),
                                     listen_fd, pipe_fds[0], pipe_fds[1]);
  return std::unique_ptr<NodeAgent>(new NodeAgent(std::move(impl)));
}

NodeAgent::NodeAgent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NodeAgent::~NodeAgent() {
  const std::string path = impl_->socket();
  impl_.reset();
  if (!path.empty() && path[0] != '@') unlink(path.c_str());
}
void NodeAgent::Stop() { impl_->Stop(); }
NodeAgentStats NodeAgent::stats() const { return impl_->stats(); }
const std::string& NodeAgent::socket() const { return impl_->socket(); }
const WorkerId& NodeAgent::worker() const { return impl_->worker(); }
std::string NodeAgent::data_address() const { return impl_->data_address(); }

}  // namespace tensorhub::node
