#include "transport/ucx/ucx_transport.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "common/checksum.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/test_point.h"
#include "cuda/device.h"
#include "transport/tcp/acceptor.h"
#include "transport/tcp/auth.h"
#include "transport/tcp/socket_util.h"
#include "transport/ucx/ucx_reply.h"

namespace tensorhub::transport {
namespace {

std::atomic<uint64_t> g_live_mappings{0};

Status UcsError(ucs_status_t s, const std::string& what) {
  return Unavailable(what + ": " + ucs_status_string(s));
}

// UCX's own log. UCX prints its warnings and errors to stdout unless
// UCX_LOG_FILE names another place, where they mix with what the program
// that hosts a worker prints there (a CLI's result, the line protocol of
// the test and chaos workers): they go to TensorHub's log instead (stderr,
// at TENSORHUB_LOG's level), unless the user set UCX_LOG_FILE.
//
// A connection first asks for an endpoint that reports a dead peer, and on
// a wire that cannot (shared memory in UCX 1.13) asks again without:
// UCX reports the first refusal as an ERROR, which is expected there, so
// what it logs during that probe is debug.
thread_local bool t_probing_peer_errors = false;

ucs_log_func_rc_t LogUcxMessage(const char* file, unsigned line,
                                const char* /*function*/, ucs_log_level_t level,
                                const ucs_log_component_config_t* /*comp*/,
                                const char* format, va_list ap) {
  if (level == UCS_LOG_LEVEL_FATAL) return UCS_LOG_FUNC_RC_CONTINUE;
  LogLevel ours = level <= UCS_LOG_LEVEL_ERROR  ? LogLevel::kError
                  : level == UCS_LOG_LEVEL_WARN ? LogLevel::kWarn
                  : level <= UCS_LOG_LEVEL_INFO ? LogLevel::kInfo
                                                : LogLevel::kDebug;
  if (t_probing_peer_errors) ours = LogLevel::kDebug;
  if (!LogEnabled(ours)) return UCS_LOG_FUNC_RC_STOP;
  char text[1024];
  std::vsnprintf(text, sizeof(text), format, ap);
  LogLine(ours, file, static_cast<int>(line)).stream() << "UCX: " << text;
  return UCS_LOG_FUNC_RC_STOP;
}

void RouteUcxLogOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* file = std::getenv("UCX_LOG_FILE");
    if (file == nullptr || *file == '\0') ucs_log_push_handler(LogUcxMessage);
  });
}

// The UCX context: one per transport, shared by its server and connections
// (and by the registrations they made, which must be unmapped in it).
class Context {
 public:
  static Result<std::shared_ptr<Context>> Create() {
    RouteUcxLogOnce();
    ucp_config_t* config = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
    if (s != UCS_OK) return UcsError(s, "reading the UCX configuration");
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    // Tagged messages, not RMA: see the file comment of ucx_transport.h.
    p.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    // Each connection's worker is made and used on its own thread (the
    // reader's fetch thread, the holder's serving thread); memory maps are
    // shared between them.
    p.mt_workers_shared = 1;
    ucp_context_h ctx = nullptr;
    s = ucp_init(&p, config, &ctx);
    ucp_config_release(config);
    if (s != UCS_OK) return UcsError(s, "initialising UCX");
    return std::shared_ptr<Context>(new Context(ctx));
  }
  ~Context() { ucp_cleanup(ctx_); }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ucp_context_h get() const { return ctx_; }

 private:
  explicit Context(ucp_context_h ctx) : ctx_(ctx) {}
  ucp_context_h ctx_;
};

// One UCX worker and its wake-up descriptor. Progressed by one thread at a
// time; Signal() may be called from any thread.
class Worker {
 public:
  static Result<std::unique_ptr<Worker>> Create(std::shared_ptr<Context> ctx) {
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    ucp_worker_h w = nullptr;
    ucs_status_t s = ucp_worker_create(ctx->get(), &wp, &w);
    if (s != UCS_OK) return UcsError(s, "creating a UCX worker");
    int efd = -1;
    if (ucp_worker_get_efd(w, &efd) != UCS_OK) efd = -1;
    return std::unique_ptr<Worker>(new Worker(std::move(ctx), w, efd));
  }
  ~Worker() { ucp_worker_destroy(w_); }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  ucp_worker_h get() const { return w_; }
  void Signal() { (void)ucp_worker_signal(w_); }

  Result<std::string> Address() {
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    ucs_status_t s = ucp_worker_get_address(w_, &addr, &len);
    if (s != UCS_OK) return UcsError(s, "querying the UCX worker address");
    std::string out(reinterpret_cast<const char*>(addr), len);
    ucp_worker_release_address(w_, addr);
    return out;
  }

  // Progresses the worker until done() holds, the deadline passes or
  // *stop is set, or (watch_fd >= 0) watch_fd has something to read or was
  // closed: then *watch_ready is set and it returns OK. Between bursts of
  // progress it sleeps on the worker's event descriptor and watch_fd (at
  // most 50 ms at a time, so that a stop is seen even without a signal).
  template <typename Done>
  Status Wait(Done&& done, const Deadline& deadline,
              const std::atomic<bool>* stop, int watch_fd = -1,
              bool* watch_ready = nullptr) {
    for (;;) {
      while (ucp_worker_progress(w_) != 0) {
      }
      if (done()) return Status::Ok();
      if (stop != nullptr && stop->load()) return Unavailable("cancelled");
      if (deadline.expired()) {
        return DeadlineExceeded("UCX transfer did not finish in time");
      }
      if (watch_fd >= 0) {
        pollfd w{watch_fd, POLLIN | POLLRDHUP, 0};
        if (::poll(&w, 1, 0) != 0) {
          *watch_ready = true;
          return Status::Ok();
        }
      }
      if (efd_ < 0) {
        std::this_thread::yield();
        continue;
      }
      ucs_status_t s = ucp_worker_arm(w_);
      if (s == UCS_ERR_BUSY) continue;  // events arrived: progress again
      if (s != UCS_OK) {
        std::this_thread::yield();
        continue;
      }
      pollfd p[2] = {{efd_, POLLIN, 0}, {watch_fd, POLLIN | POLLRDHUP, 0}};
      (void)::poll(
          p, watch_fd >= 0 ? 2 : 1,
          static_cast<int>(std::min<int64_t>(deadline.remaining_ms(), 50)));
    }
  }

 private:
  Worker(std::shared_ptr<Context> ctx, ucp_worker_h w, int efd)
      : ctx_(std::move(ctx)), w_(w), efd_(efd) {}
  std::shared_ptr<Context> ctx_;  // outlives the worker
  ucp_worker_h w_;
  int efd_;  // owned by the worker
};

// One ucp_mem_map of contiguous memory, whose handle the holder's sends
// name, so that UCX does not register the memory per message. Unmapped on
// destruction.
class Mapping {
 public:
  static Result<std::unique_ptr<Mapping>> Create(std::shared_ptr<Context> ctx,
                                                 uint8_t* base, size_t len) {
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                    UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                    UCP_MEM_MAP_PARAM_FIELD_PROT;
    mp.address = base;
    mp.length = len;
    // Served memory is only ever read (it may be a read-only file map).
    mp.prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_REMOTE_READ;
    ucp_mem_h memh = nullptr;
    ucs_status_t s = ucp_mem_map(ctx->get(), &mp, &memh);
    if (s != UCS_OK) return UcsError(s, "registering served memory with UCX");
    g_live_mappings.fetch_add(1);
    return std::unique_ptr<Mapping>(
        new Mapping(std::move(ctx), memh, base, len));
  }
  ~Mapping() {
    ucp_mem_unmap(ctx_->get(), memh_);
    g_live_mappings.fetch_sub(1);
  }

  const uint8_t* base() const { return base_; }
  size_t length() const { return len_; }
  ucp_mem_h memh() const { return memh_; }

 private:
  Mapping(std::shared_ptr<Context> ctx, ucp_mem_h memh, uint8_t* base,
          size_t len)
      : ctx_(std::move(ctx)), memh_(memh), base_(base), len_(len) {}
  const std::shared_ptr<Context> ctx_;
  const ucp_mem_h memh_;
  uint8_t* const base_;
  const size_t len_;
};

// The mappings of a set of regions, adjacent regions merged into one.
class MappingSet {
 public:
  static Result<std::shared_ptr<MappingSet>> Create(
      const std::shared_ptr<Context>& ctx, std::span<const iovec> regions) {
    std::vector<std::pair<uint8_t*, size_t>> runs;
    for (const iovec& v : regions) {
      if (v.iov_len > 0) {
        runs.emplace_back(static_cast<uint8_t*>(v.iov_base), v.iov_len);
      }
    }
    std::sort(runs.begin(), runs.end());
    auto set = std::make_shared<MappingSet>();
    for (size_t i = 0; i < runs.size();) {
      uint8_t* begin = runs[i].first;
      uint8_t* end = begin + runs[i].second;
      for (++i; i < runs.size() && runs[i].first <= end; ++i) {
        end = std::max(end, runs[i].first + runs[i].second);
      }
      TH_ASSIGN_OR_RETURN(std::unique_ptr<Mapping> m,
                          Mapping::Create(ctx, begin, end - begin));
      set->maps_.push_back(std::move(m));
    }
    return set;
  }

  // The mapping that holds all of [p, p + n), or null.
  const Mapping* Find(const uint8_t* p, uint64_t n) const {
    auto it = std::upper_bound(
        maps_.begin(), maps_.end(), p,
        [](const uint8_t* a, const std::unique_ptr<Mapping>& m) {
          return a < m->base();
        });
    if (it == maps_.begin()) return nullptr;
    const Mapping* m = std::prev(it)->get();
    const uint64_t from = static_cast<uint64_t>(p - m->base());
    if (from > m->length() || n > m->length() - from) return nullptr;
    return m;
  }

 private:
  std::vector<std::unique_ptr<Mapping>> maps_;  // sorted by base
};

// Whether the TCP connection `fd` joins two addresses of this host (then
// UCX may use its shared-memory wires for it).
bool SameHost(int fd) {
  sockaddr_storage a{}, b{};
  socklen_t alen = sizeof(a), blen = sizeof(b);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &alen) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&b), &blen) != 0 ||
      a.ss_family != b.ss_family) {
    return false;
  }
  if (a.ss_family == AF_INET) {
    return reinterpret_cast<sockaddr_in*>(&a)->sin_addr.s_addr ==
           reinterpret_cast<sockaddr_in*>(&b)->sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    return std::memcmp(&reinterpret_cast<sockaddr_in6*>(&a)->sin6_addr,
                       &reinterpret_cast<sockaddr_in6*>(&b)->sin6_addr,
                       sizeof(in6_addr)) == 0;
  }
  return false;
}

// Creates an endpoint on `worker` to `remote_address`. Across hosts it
// asks UCX to report a peer that died (failing the messages on it at once
// instead of at their deadline). On one host it does not: UCX 1.13's
// shared-memory wires cannot report a dead peer, and an endpoint that asks
// for it is put on tcp instead (a fifth of the bandwidth; the cause of the
// old gap to ucx_perftest). The TCP connection beside the endpoint bounds
// those transfers: both ends watch it while messages are in flight.
Result<ucp_ep_h> CreateEndpoint(Worker& worker,
                                const std::string& remote_address,
                                bool same_host, std::atomic<bool>* failed) {
  ucp_ep_h ep = nullptr;
  ucs_status_t s = UCS_ERR_UNREACHABLE;
  for (ucp_err_handling_mode_t mode :
       {UCP_ERR_HANDLING_MODE_PEER, UCP_ERR_HANDLING_MODE_NONE}) {
    if (same_host && mode == UCP_ERR_HANDLING_MODE_PEER) continue;
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                   UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p.address = reinterpret_cast<const ucp_address_t*>(remote_address.data());
    p.err_mode = mode;
    if (mode == UCP_ERR_HANDLING_MODE_PEER) {
      p.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
      p.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t) {
        static_cast<std::atomic<bool>*>(arg)->store(true);
      };
      p.err_handler.arg = failed;
    }
    t_probing_peer_errors = mode == UCP_ERR_HANDLING_MODE_PEER;
    s = ucp_ep_create(worker.get(), &p, &ep);
    t_probing_peer_errors = false;
    if (s != UCS_ERR_UNREACHABLE) break;
  }
  if (s != UCS_OK) return UcsError(s, "connecting a UCX endpoint");
  return ep;
}

// Force-closes `ep` (its operations in flight complete as cancelled) and
// waits, bounded, for the close.
void CloseEndpoint(Worker& worker, ucp_ep_h ep) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &param);
  if (UCS_PTR_IS_PTR(r)) {
    (void)worker.Wait(
        [&] { return ucp_request_check_status(r) != UCS_INPROGRESS; },
        Deadline::AfterMs(2000), nullptr);
    ucp_request_free(r);
  }
}

// Frees requests once none can complete any more (their endpoint closed,
// or all complete).
void FreeRequests(std::vector<void*>& requests) {
  for (void* r : requests) ucp_request_free(r);
  requests.clear();
}

// A holder's side of one connection: its own worker (progressed only by
// the connection's serving thread) and an endpoint to the reader's worker.
// Closed in the destructor, endpoint first, so that nothing more is sent.
class ServingLink {
 public:
  ServingLink(std::unique_ptr<Worker> worker, ucp_ep_h ep,
              std::unique_ptr<std::atomic<bool>> failed)
      : worker_(std::move(worker)), ep_(ep), failed_(std::move(failed)) {}
  ~ServingLink() {
    CloseEndpoint(*worker_, ep_);
    FreeRequests(sends_);
  }
  ServingLink(const ServingLink&) = delete;
  ServingLink& operator=(const ServingLink&) = delete;

  Worker& worker() { return *worker_; }
  ucp_ep_h ep() const { return ep_; }
  bool failed() const { return failed_->load(); }
  std::vector<void*>& sends() { return sends_; }

 private:
  std::unique_ptr<Worker> worker_;
  ucp_ep_h ep_;
  std::unique_ptr<std::atomic<bool>> failed_;  // set by UCX's error callback
  std::vector<void*> sends_;                   // the read's messages
};

class UcxServer final : public Server {
 public:
  UcxServer(Fd listener, std::string address, ReadSource* source,
            ServerOptions options, std::shared_ptr<Context> ctx,
            std::string secret)
      : address_(std::move(address)),
        source_(source),
        options_(options),
        ctx_(std::move(ctx)),
        secret_(std::move(secret)),
        acceptor_(std::move(listener), options.max_connections,
                  "ucx data server " + address_) {
    acceptor_.Start([this](int fd) { Serve(fd); });
  }
  ~UcxServer() override { Stop(); }

  std::string address() const override { return address_; }
  uint64_t bytes_served() const override { return bytes_served_.load(); }
  uint64_t connections_refused() const override { return refused_.load(); }

  void Stop() override {
    MutexLock stop_lock(stop_mu_);
    stopping_ = true;
    // Shuts every connection down and waits for its serving thread, which
    // ends its lease and closes its worker: nothing is read any more.
    acceptor_.Stop();
  }

 private:
  // The reader's hello, then this connection's worker and an endpoint to
  // the reader's. Null (logged) when the connection is to be dropped.
  std::unique_ptr<ServingLink> Link(int fd, int64_t stall_ms) {
    const Deadline deadline = Deadline::AfterMs(stall_ms);
    uint8_t hello[ucx::kHelloHeaderBytes];
    if (!ReadExact(fd, hello, sizeof(hello), deadline, stall_ms).ok()) {
      return nullptr;
    }
    Result<uint32_t> len = ucx::DecodeHelloHeader(hello, sizeof(hello));
    if (!len.ok()) {
      TH_LOG(WARN) << "ucx data server " << address_
                   << ": dropping peer: " << len.status().ToString();
      return nullptr;
    }
    std::string remote(*len, '\0');
    if (!ReadExact(fd, remote.data(), remote.size(), deadline, stall_ms).ok()) {
      return nullptr;
    }
    Result<std::unique_ptr<Worker>> worker = Worker::Create(ctx_);
    if (!worker.ok()) {
      TH_LOG(WARN) << "ucx data server " << address_ << ": "
                   << worker.status().ToString();
      return nullptr;
    }
    auto failed = std::make_unique<std::atomic<bool>>(false);
    Result<ucp_ep_h> ep =
        CreateEndpoint(**worker, remote, SameHost(fd), failed.get());
    if (!ep.ok()) {
      TH_LOG(WARN) << "ucx data server " << address_
                   << ": dropping peer: " << ep.status().ToString();
      return nullptr;
    }
    auto link = std::make_unique<ServingLink>(std::move(worker).value(), *ep,
                                              std::move(failed));
    // Its own worker's address: the reader connects an endpoint of its own
    // to it, which UCX pairs with ours (one connection, an endpoint handle
    // at each end), so that either end can close it.
    Result<std::string> local = link->worker().Address();
    if (!local.ok() || local->empty() ||
        local->size() > ucx::kMaxWorkerAddressBytes) {
      TH_LOG(WARN) << "ucx data server " << address_
                   << ": no usable UCX worker address";
      return nullptr;
    }
    std::string ready = ucx::EncodeReady(static_cast<uint32_t>(local->size()));
    iovec rv[2] = {{ready.data(), ready.size()},
                   {local->data(), local->size()}};
    if (!WriteAll(fd, rv, deadline, stall_ms).ok()) return nullptr;
    return link;
  }

  // Serves one connection until the peer leaves, an I/O error, or Stop().
  // As in the TCP server, one request's whole life stays in one loop body:
  // the lease (and a per-read mapping) visibly ends at its bottom, after
  // the reader released it, or after the connection was shut down and the
  // read's messages were cancelled.
  void Serve(int fd) {
    const int64_t stall_ms = options_.io_stall_timeout_ms;
    Status auth = ServerHandshake(fd, secret_, Deadline::AfterMs(stall_ms));
    if (!auth.ok()) {
      TH_LOG(WARN) << "ucx data server " << address_
                   << ": refused a peer: " << auth.ToString();
      refused_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    // Only a peer that proved the secret gets an endpoint.
    std::unique_ptr<ServingLink> link = Link(fd, stall_ms);
    if (link == nullptr) return;
    uint64_t read_seq = 0;
    uint8_t header[wire::kRequestHeaderBytes];
    while (!stopping_.load()) {
      pollfd p{fd, POLLIN, 0};
      int rc = ::poll(&p, 1, 200);
      if (rc == 0) continue;
      if (rc < 0) return;
      Deadline deadline = Deadline::AfterMs(3600 * 1000);
      if (!ReadExact(fd, header, sizeof(header), deadline, stall_ms).ok()) {
        return;
      }
      wire::ReadRequest req;
      bool local = false, cuda_ipc = false, strided = false;
      Result<size_t> model_len = wire::DecodeReadRequestHeader(
          header, sizeof(header), &req, &local, &cuda_ipc, &strided);
      if (!model_len.ok() || local || cuda_ipc) {
        Status why = model_len.ok() ? InvalidArgument(
                                          "same-host reads are not offered "
                                          "on a UCX connection")
                                    : model_len.status();
        TH_LOG(WARN) << "ucx data server " << address_
                     << ": dropping peer: " << why.ToString();
        (void)SendError(fd, why, deadline);
        return;
      }
      req.model.resize(*model_len);
      if (!ReadExact(fd, req.model.data(), req.model.size(), deadline, stall_ms)
               .ok()) {
        return;
      }
      if (strided) {
        uint8_t st[wire::kStrideBytes];
        if (!ReadExact(fd, st, sizeof(st), deadline, stall_ms).ok()) return;
        Status bad = wire::DecodeStride(st, sizeof(st), &req);
        if (!bad.ok()) {
          (void)SendError(fd, bad, deadline);
          return;
        }
      }
      Result<ServeLease> lease = source_->BeginRead(req);
      if (!lease.ok()) {
        if (!SendError(fd, lease.status(), deadline).ok()) return;
        continue;
      }
      if (!lease->memory.is_host()) {
        Status no = FailedPrecondition(
            "the UCX transport serves host memory only (this UCX has no "
            "CUDA support); read " +
            MemoryLocationName(lease->memory) + " over tcp");
        if (!SendError(fd, no, deadline).ok()) return;
        continue;
      }
      Result<std::shared_ptr<MappingSet>> maps = Mappings(*lease);
      Result<std::vector<Message>> plan =
          maps.ok() ? Plan(**maps, lease->pieces) : maps.status();
      if (!plan.ok()) {
        if (!SendError(fd, plan.status(), deadline).ok()) return;
        continue;
      }
      if (!ServeMessages(fd, *link, read_seq++, req, *plan)) {
        // Shut down, and the messages cancelled (closing the link), before
        // the lease ends: a reader still reading sees the connection gone
        // when it finishes, and discards the bytes.
        ::shutdown(fd, SHUT_RDWR);
        link.reset();
        return;
      }
      // The lease (and a per-read mapping) ends here, after the release.
    }
  }

  // The mappings that hold a lease's pieces: its registration's, made on
  // its first read and kept until it is destroyed after the drain; or,
  // from a source without registrations, the pieces' own for this read.
  Result<std::shared_ptr<MappingSet>> Mappings(const ServeLease& lease) {
    if (lease.registration != nullptr) {
      Registration* reg = lease.registration;
      return reg->Attach<MappingSet>(
          ctx_.get(), [&]() -> Result<std::shared_ptr<MappingSet>> {
            return MappingSet::Create(ctx_, reg->regions());
          });
    }
    return MappingSet::Create(ctx_, lease.pieces);
  }

  // One tagged message of a read: contiguous, inside one mapping.
  struct Message {
    const uint8_t* data;
    uint64_t length;
    ucp_mem_h memh;
  };

  // The read's pieces as messages: adjacent pieces of one mapping merged,
  // then cut at kMaxMessageBytes.
  static Result<std::vector<Message>> Plan(const MappingSet& maps,
                                           const std::vector<iovec>& pieces) {
    std::vector<Message> runs;
    for (const iovec& v : pieces) {
      if (v.iov_len == 0) continue;
      const auto* p = static_cast<const uint8_t*>(v.iov_base);
      const Mapping* m = maps.Find(p, v.iov_len);
      if (m == nullptr) {
        return Internal("a served range lies outside its registered memory");
      }
      if (!runs.empty() && runs.back().memh == m->memh() &&
          runs.back().data + runs.back().length == p) {
        runs.back().length += v.iov_len;
      } else {
        runs.push_back({p, v.iov_len, m->memh()});
      }
    }
    std::vector<Message> out;
    for (const Message& r : runs) {
      for (uint64_t off = 0; off < r.length; off += ucx::kMaxMessageBytes) {
        if (out.size() == ucx::kMaxMessages) {
          return ResourceExhausted("read too scattered for one UCX plan");
        }
        out.push_back({r.data + off,
                       std::min(ucx::kMaxMessageBytes, r.length - off),
                       r.memh});
      }
    }
    if (out.empty()) return Internal("a read of no bytes");
    return out;
  }

  // Tells the reader how the range is split, sends the messages (the
  // reader pulls them by rendezvous), and waits, bounded, until they are
  // all sent and the reader released the lease. False: drop the
  // connection.
  bool ServeMessages(int fd, ServingLink& link, uint64_t read_seq,
                     const wire::ReadRequest& req,
                     const std::vector<Message>& plan) {
    std::vector<uint64_t> lengths;
    lengths.reserve(plan.size());
    for (const Message& m : plan) lengths.push_back(m.length);
    std::string body = ucx::EncodePlan(lengths);
    wire::ResponseHeader h;
    h.status = StatusCode::kOk;
    h.payload_len = body.size();
    auto hdr = wire::EncodeResponseHeader(h);
    iovec iov[2] = {{hdr.data(), hdr.size()}, {body.data(), body.size()}};
    if (!WriteAll(fd, iov, Deadline::AfterMs(options_.io_stall_timeout_ms),
                  options_.io_stall_timeout_ms)
             .ok()) {
      return false;
    }
    std::vector<void*>& sends = link.sends();
    for (uint32_t i = 0; i < plan.size(); ++i) {
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
      param.memh = plan[i].memh;
      ucs_status_ptr_t r =
          ucp_tag_send_nbx(link.ep(), plan[i].data, plan[i].length,
                           ucx::MessageTag(read_seq, i), &param);
      if (UCS_PTR_IS_ERR(r)) {
        TH_LOG(WARN) << "ucx data server " << address_
                     << ": UCX send: " << ucs_status_string(UCS_PTR_STATUS(r));
        return false;
      }
      if (r != nullptr) sends.push_back(r);
    }
    // The release may come over TCP before UCX tells this side that the
    // reader has pulled the last message: wait for both.
    const Deadline deadline =
        Deadline::AfterMs(options_.local_release_timeout_ms);
    bool released = false;
    size_t next = 0;  // sends[..next) are complete
    auto sent = [&] {
      while (next < sends.size() &&
             ucp_request_check_status(sends[next]) != UCS_INPROGRESS) {
        ++next;
      }
      return next == sends.size();
    };
    for (;;) {
      bool readable = false;
      Status s =
          link.worker().Wait([&] { return released && sent(); }, deadline,
                             &stopping_, released ? -1 : fd, &readable);
      if (!s.ok()) {
        if (s.code() == StatusCode::kDeadlineExceeded) {
          TH_LOG(WARN) << "ucx data server " << address_
                       << ": a reader did not take and release its read "
                       << "within " << options_.local_release_timeout_ms
                       << " ms; dropping it";
        }
        return false;
      }
      if (!readable) break;  // released and sent
      uint8_t release[wire::kReleaseBytes];
      if (!ReadExact(fd, release, sizeof(release), deadline,
                     options_.io_stall_timeout_ms)
               .ok()) {
        return false;
      }
      Result<wire::ReleaseOutcome> outcome =
          wire::DecodeRelease(release, sizeof(release));
      if (!outcome.ok()) {
        TH_LOG(WARN) << "ucx data server " << address_
                     << ": dropping peer: " << outcome.status().ToString();
        return false;
      }
      released = true;
      if (*outcome == wire::ReleaseOutcome::kCopied) {
        bytes_served_.fetch_add(req.length, std::memory_order_relaxed);
      }
    }
    bool ok = !link.failed();
    for (void* r : sends) ok = ok && ucp_request_check_status(r) == UCS_OK;
    FreeRequests(sends);
    return ok;
  }

  Status SendError(int fd, const Status& status, const Deadline& deadline) {
    std::string msg = status.message().substr(0, wire::kMaxMessageBytes);
    wire::ResponseHeader h;
    h.status = status.code();
    h.message_len = static_cast<uint16_t>(msg.size());
    auto hdr = wire::EncodeResponseHeader(h);
    iovec iov[2] = {{hdr.data(), hdr.size()}, {msg.data(), msg.size()}};
    return WriteAll(fd, iov, deadline, options_.io_stall_timeout_ms);
  }

  const std::string address_;
  ReadSource* const source_;
  const ServerOptions options_;
  const std::shared_ptr<Context> ctx_;
  const std::string secret_;
  std::atomic<uint64_t> refused_{0};
  Mutex stop_mu_;  // serialises Stop()
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> bytes_served_{0};
  // Last: its threads run Serve() on the members above.
  Acceptor acceptor_;
};

// Calls fn(address, length, done) for the runs of `pieces` that make up
// bytes [offset, offset + n) of their concatenation.
template <typename Fn>
Status ForRange(std::span<const iovec> pieces, uint64_t offset, uint64_t n,
                Fn&& fn) {
  uint64_t at = 0, done = 0;
  for (const iovec& v : pieces) {
    if (done == n) break;
    const uint64_t end = at + v.iov_len;
    if (end > offset) {
      const uint64_t from = std::max(at, offset) - at;
      const uint64_t len = std::min<uint64_t>(v.iov_len - from, n - done);
      TH_RETURN_IF_ERROR(
          fn(static_cast<uint8_t*>(v.iov_base) + from, len, done));
      done += len;
    }
    at = end;
  }
  if (done != n) return Internal("range past the end of its pieces");
  return Status::Ok();
}

class UcxConnection final : public Connection {
 public:
  UcxConnection(Fd fd, std::string peer, std::unique_ptr<Worker> worker,
                ucp_ep_h ep, std::unique_ptr<std::atomic<bool>> ep_failed)
      : fd_(std::move(fd)),
        peer_(std::move(peer)),
        worker_(std::move(worker)),
        ep_(ep),
        ep_failed_(std::move(ep_failed)) {}
  ~UcxConnection() override {
    for (auto& s : streams_) {
      if (s) (void)s->Synchronize();
    }
    Teardown();
  }

  Status Read(const wire::ReadRequest& req, std::span<const iovec> dest,
              const Deadline& deadline, uint64_t* xxh3) override {
    if (broken_) return Unavailable("connection to " + peer_ + " is broken");
    last_read_ = ReadInfo{};
    return Finish(DoRead(req, dest, -1, deadline, xxh3));
  }

  Status ReadDevice(const wire::ReadRequest& req, std::span<const iovec> dest,
                    int device, const Deadline& deadline,
                    uint64_t* xxh3) override {
    if (broken_) return Unavailable("connection to " + peer_ + " is broken");
    // A failure here is about this process's device, not the holder.
    for (auto& s : streams_) {
      if (!s || s->device() != device) {
        TH_ASSIGN_OR_RETURN(s, cuda::Stream::Create(device));
      }
    }
    last_read_ = ReadInfo{};
    return Finish(DoRead(req, dest, device, deadline, xxh3));
  }

  bool broken() const override { return broken_; }
  const std::string& peer() const override { return peer_; }
  ReadInfo last_read() const override { return last_read_; }
  void Cancel() override {
    MutexLock l(mu_);
    cancelled_.store(true);
    if (fd_.valid()) ::shutdown(fd_.get(), SHUT_RDWR);
    if (worker_) worker_->Signal();  // wakes a read waiting in UCX
  }

 private:
  Status Finish(Status s) {
    if (cancelled_.load()) {
      if (!broken_) Abandon();
      if (s.ok()) return s;  // it finished before the cancel landed
      return Unavailable("read from holder " + peer_ + " was cancelled (" +
                         s.message() + ")");
    }
    if (!s.ok() && s.code() != StatusCode::kNotFound &&
        s.code() != StatusCode::kAborted &&
        s.code() != StatusCode::kInvalidArgument &&
        s.code() != StatusCode::kResourceExhausted &&
        s.code() != StatusCode::kFailedPrecondition &&
        s.code() != StatusCode::kPermissionDenied) {
      if (!broken_) Abandon();  // the stream position is unknown now
    }
    return s;
  }

  // `device` < 0: `dest` is host memory; else memory of that CUDA device,
  // reached through pinned staging buffers.
  Status DoRead(const wire::ReadRequest& req, std::span<const iovec> dest,
                int device, const Deadline& deadline, uint64_t* xxh3) {
    uint64_t want = 0;
    for (const iovec& v : dest) want += v.iov_len;
    if (want != req.length) {
      return Internal("destination holds " + std::to_string(want) +
                      " bytes for a read of " + std::to_string(req.length));
    }
    cuda::PinnedPool::Lease bufs;
    if (device >= 0) {
      // Taken before asking, so that a busy pool refuses this read without
      // holding the holder's lease.
      TH_ASSIGN_OR_RETURN(bufs, cuda::StagingPool().Acquire(2, deadline));
    }
    std::string frame = wire::EncodeReadRequest(req, nullptr, false);
    iovec out{frame.data(), frame.size()};
    TH_RETURN_IF_ERROR(WriteAll(fd_.get(), {&out, 1}, deadline)
                           .WithContext("holder " + peer_));
    TH_ASSIGN_OR_RETURN(std::vector<uint64_t> plan, ReceivePlan(req, deadline));
    const uint64_t seq = read_seq_++;
    Xxh3Stream hash(/*timed=*/true);
    if (device < 0) {
      TH_RETURN_IF_ERROR(Receive(plan, seq, dest, deadline));
    } else {
      TH_RETURN_IF_ERROR(ReceiveStaged(plan, seq, dest, bufs, deadline,
                                       xxh3 != nullptr ? &hash : nullptr));
    }
    testpoint::Hit("ucx.read_landed", req.length);
    // The holder sends nothing until our release; anything to read now
    // means it gave up the lease, and its memory may have been reused
    // under the read.
    if (PeerClosed()) {
      Abandon();
      return Unavailable("holder " + peer_ +
                         " ended the lease before the read finished");
    }
    if (xxh3 != nullptr && device < 0) {
      for (const iovec& v : dest) hash.Update(v.iov_base, v.iov_len);
    }
    auto rel = wire::EncodeRelease(wire::ReleaseOutcome::kCopied);
    iovec rv{rel.data(), rel.size()};
    TH_RETURN_IF_ERROR(
        WriteAll(fd_.get(), {&rv, 1}, deadline).WithContext("holder " + peer_));
    if (xxh3 != nullptr) *xxh3 = hash.Digest();
    last_read_.verify_ns = hash.update_ns();
    return Status::Ok();
  }

  // The holder's answer: its refusal as a status, or the lengths of the
  // messages it is sending.
  Result<std::vector<uint64_t>> ReceivePlan(const wire::ReadRequest& req,
                                            const Deadline& deadline) {
    uint8_t hdr[wire::kResponseHeaderBytes];
    TH_RETURN_IF_ERROR(ReadExact(fd_.get(), hdr, sizeof(hdr), deadline)
                           .WithContext("holder " + peer_));
    Result<wire::ResponseHeader> h =
        wire::DecodeResponseHeader(hdr, sizeof(hdr));
    if (!h.ok()) {
      Abandon();
      return DataLoss("holder " + peer_ +
                      " sent a bad frame: " + h.status().message());
    }
    if (h->status != StatusCode::kOk) {
      std::string msg(h->message_len, '\0');
      TH_RETURN_IF_ERROR(ReadExact(fd_.get(), msg.data(), msg.size(), deadline)
                             .WithContext("holder " + peer_));
      return Status(h->status, "holder " + peer_ + " refused: " + msg);
    }
    if (h->local || h->cuda_ipc || h->payload_len > ucx::kMaxPlanBytes) {
      Abandon();
      return DataLoss("holder " + peer_ + " sent a reply UCX does not expect");
    }
    std::string body(h->payload_len, '\0');
    TH_RETURN_IF_ERROR(ReadExact(fd_.get(), body.data(), body.size(), deadline)
                           .WithContext("holder " + peer_));
    Result<std::vector<uint64_t>> plan = ucx::DecodePlan(
        reinterpret_cast<const uint8_t*>(body.data()), body.size(), req.length);
    if (!plan.ok()) {
      Abandon();  // closing the connection ends the holder's lease
      return DataLoss("holder " + peer_ +
                      " sent a bad UCX plan: " + plan.status().message());
    }
    return plan;
  }

  // Posts a receive of message `index` of read `seq` into `dst` (one or
  // more runs; an IOV receive when several). `iovs` keeps the runs alive
  // until the receive completes.
  Status PostReceive(uint64_t seq, uint32_t index, std::span<const iovec> dst,
                     uint64_t length, std::vector<ucp_dt_iov_t>& iovs) {
    ucp_request_param_t param{};
    // Always a request, whose length is checked once it completes.
    param.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    void* buffer = nullptr;
    size_t count = 0;
    if (dst.size() == 1) {
      buffer = dst[0].iov_base;
      count = dst[0].iov_len;
    } else {
      const size_t first = iovs.size();
      for (const iovec& v : dst) iovs.push_back({v.iov_base, v.iov_len});
      buffer = iovs.data() + first;
      count = dst.size();
      param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
      param.datatype = ucp_dt_make_iov();
    }
    ucs_status_ptr_t r =
        ucp_tag_recv_nbx(worker_->get(), buffer, count,
                         ucx::MessageTag(seq, index), ~ucp_tag_t{0}, &param);
    if (UCS_PTR_IS_ERR(r)) {
      return UcsError(UCS_PTR_STATUS(r), "UCX receive from holder " + peer_);
    }
    pending_.push_back({r, length});
    return Status::Ok();
  }

  // Receives the plan's messages into `dst` (their concatenation is the
  // read's range): all posted at once, then waited for. On any failure the
  // connection is abandoned before returning, so nothing lands in `dst`
  // afterwards.
  Status Receive(const std::vector<uint64_t>& plan, uint64_t seq,
                 std::span<const iovec> dst, const Deadline& deadline) {
    std::vector<ucp_dt_iov_t> iovs;
    // Reserved: an IOV receive points into it until it completes.
    uint64_t runs = 0, off = 0;
    for (uint64_t len : plan) {
      TH_RETURN_IF_ERROR(
          ForRange(dst, off, len, [&](uint8_t*, uint64_t, uint64_t) {
            ++runs;
            return Status::Ok();
          }));
      off += len;
    }
    iovs.reserve(runs);
    off = 0;
    Status posted = Status::Ok();
    std::vector<iovec> parts;
    for (uint32_t i = 0; i < plan.size() && posted.ok(); ++i) {
      parts.clear();
      posted =
          ForRange(dst, off, plan[i], [&](uint8_t* p, uint64_t l, uint64_t) {
            parts.push_back({p, l});
            return Status::Ok();
          });
      if (posted.ok()) posted = PostReceive(seq, i, parts, plan[i], iovs);
      off += plan[i];
    }
    if (!posted.ok()) {
      Abandon();
      return posted.WithContext("holder " + peer_);
    }
    return WaitReceives(deadline);
  }

  // Waits for every posted receive; checks each landed whole. Abandons the
  // connection on any failure, and when the holder sends or closes anything
  // on the TCP connection before they are in (it gave up the lease).
  Status WaitReceives(const Deadline& deadline) {
    size_t next = 0;  // pending_[..next) are complete
    bool holder_spoke = false;
    Status waited = worker_->Wait(
        [&] {
          while (next < pending_.size() &&
                 ucp_request_check_status(pending_[next].request) !=
                     UCS_INPROGRESS) {
            ++next;
          }
          return next == pending_.size();
        },
        deadline, &cancelled_, fd_.get(), &holder_spoke);
    if (waited.ok() && holder_spoke) {
      waited = Unavailable("holder ended the lease before the read finished");
    }
    if (!waited.ok()) {
      Abandon();
      return waited.WithContext("holder " + peer_);
    }
    Status result = Status::Ok();
    for (const Pending& p : pending_) {
      ucp_tag_recv_info_t info{};
      ucs_status_t s = ucp_tag_recv_request_test(p.request, &info);
      if (s != UCS_OK && result.ok()) {
        result = UcsError(s, "UCX receive from holder " + peer_);
      } else if (result.ok() && info.length != p.length) {
        result = DataLoss("holder " + peer_ + " sent a UCX message of " +
                          std::to_string(info.length) + " bytes for one of " +
                          std::to_string(p.length));
      }
      ucp_request_free(p.request);
    }
    pending_.clear();
    if (!result.ok()) Abandon();
    return result;
  }

  // Device destination: each message is received into one of two pinned
  // buffers, hashed there, and copied to the device while the next one is
  // received into the other buffer.
  Status ReceiveStaged(const std::vector<uint64_t>& plan, uint64_t seq,
                       std::span<const iovec> dest,
                       cuda::PinnedPool::Lease& bufs, const Deadline& deadline,
                       Xxh3Stream* hash) {
    const uint64_t seg = cuda::StagingPool().buffer_bytes();
    std::vector<ucp_dt_iov_t> unused;
    uint64_t off = 0;
    for (uint32_t k = 0; k < plan.size(); ++k) {
      const uint64_t len = plan[k];
      if (len > seg) {
        Abandon();
        return Internal("a UCX message of " + std::to_string(len) +
                        " bytes is larger than a staging buffer");
      }
      uint8_t* buf = bufs.buffer(k % 2);
      // The copy out of this buffer two messages ago must be done.
      TH_RETURN_IF_ERROR(streams_[k % 2]->Synchronize());
      iovec b{buf, len};
      Status posted = PostReceive(seq, k, {&b, 1}, len, unused);
      if (!posted.ok()) {
        Abandon();
        return posted;
      }
      TH_RETURN_IF_ERROR(WaitReceives(deadline));
      if (hash != nullptr) hash->Update(buf, len);
      TH_RETURN_IF_ERROR(
          ForRange(dest, off, len, [&](uint8_t* p, uint64_t l, uint64_t done) {
            return streams_[k % 2]->CopyAsync(p, buf + done, l);
          }));
      off += len;
    }
    for (auto& s : streams_) TH_RETURN_IF_ERROR(s->Synchronize());
    return Status::Ok();
  }

  bool PeerClosed() {
    pollfd p{fd_.get(), POLLIN | POLLRDHUP, 0};
    return ::poll(&p, 1, 0) != 0;
  }

  // Breaks the connection for good: closes the TCP stream (which ends the
  // holder's lease) and the UCX worker, after which no receive of ours
  // moves another byte.
  void Abandon() {
    broken_ = true;
    {
      MutexLock l(mu_);
      fd_.Reset();
    }
    Teardown();
  }

  // Cancels and frees what the reads left, and destroys the worker (and
  // with it the endpoint the holder's connection made). Reading thread
  // only.
  void Teardown() {
    if (!worker_) return;
    for (const Pending& p : pending_) {
      ucp_request_cancel(worker_->get(), p.request);
    }
    // Force-closing our endpoint ends what the holder's messages started
    // on this connection (a matched receive's transfer cannot be cancelled
    // otherwise): nothing lands in the destination after this.
    if (ep_ != nullptr) {
      CloseEndpoint(*worker_, ep_);
      ep_ = nullptr;
    }
    (void)worker_->Wait(
        [&] {
          for (const Pending& p : pending_) {
            if (ucp_request_check_status(p.request) == UCS_INPROGRESS) {
              return false;
            }
          }
          return true;
        },
        Deadline::AfterMs(kCloseWaitMs), nullptr);
    for (const Pending& p : pending_) ucp_request_free(p.request);
    pending_.clear();
    std::unique_ptr<Worker> w;
    {
      MutexLock l(mu_);
      w = std::move(worker_);
    }
    w.reset();  // destroys the worker: its transports stop moving bytes
  }

  static constexpr int64_t kCloseWaitMs = 2000;

  struct Pending {
    void* request;
    uint64_t length;  // the message's, from the plan
  };

  // fd_ and worker_ are replaced only by the reading thread, under mu_;
  // Cancel uses them under mu_ from another thread.
  Mutex mu_;
  Fd fd_;
  std::atomic<bool> cancelled_{false};
  const std::string peer_;
  std::unique_ptr<Worker> worker_;
  ucp_ep_h ep_;  // ours, paired with the holder's; closed in Teardown
  std::unique_ptr<std::atomic<bool>> ep_failed_;  // UCX's error callback's
  // The reading thread's:
  uint64_t read_seq_ = 0;         // reads the holder answered with a plan
  std::vector<Pending> pending_;  // receives in flight
  bool broken_ = false;
  ReadInfo last_read_;
  std::unique_ptr<cuda::Stream> streams_[2];  // device reads, made on use
};

class UcxTransport final : public Transport {
 public:
  UcxTransport(std::shared_ptr<Context> ctx, const UcxTransportOptions& o)
      : ctx_(std::move(ctx)), secret_(o.secret) {}

  std::string_view name() const override { return "ucx"; }

  Result<std::unique_ptr<Server>> Listen(
      const std::string& host_port, ReadSource* source,
      const ServerOptions& options) override {
    TH_ASSIGN_OR_RETURN(Fd fd, ListenTcp(host_port, 512));
    TH_ASSIGN_OR_RETURN(std::string addr, LocalAddress(fd.get()));
    TH_ASSIGN_OR_RETURN(auto hp, SplitHostPort(host_port));
    TH_ASSIGN_OR_RETURN(auto bound, SplitHostPort(addr));
    std::string advertised =
        (hp.first.find(':') != std::string::npos ? "[" + hp.first + "]"
                                                 : hp.first) +
        ":" + std::to_string(bound.second);
    return std::unique_ptr<Server>(new UcxServer(
        std::move(fd), advertised, source, options, ctx_, secret_));
  }

  Result<std::unique_ptr<Connection>> Connect(
      const std::string& address, const Deadline& deadline) override {
    TH_ASSIGN_OR_RETURN(Link link, OpenLink(address, deadline));
    return std::unique_ptr<Connection>(
        new UcxConnection(std::move(link.fd), address, std::move(link.worker),
                          link.ep, std::move(link.failed)));
  }

  // A TCP connection to the holder at `address` with the link set up: the
  // secret proved both ways, then this side's worker and the holder's
  // endpoint to it.
  struct Link {
    Fd fd;
    std::unique_ptr<Worker> worker;
    ucp_ep_h ep = nullptr;
    std::unique_ptr<std::atomic<bool>> failed;  // set by UCX's error callback
  };
  Result<Link> OpenLink(const std::string& address, const Deadline& deadline) {
    TH_ASSIGN_OR_RETURN(Fd fd, ConnectTcp(address, deadline));
    TH_RETURN_IF_ERROR(ClientHandshake(fd.get(), secret_, deadline)
                           .WithContext("holder " + address));
    // Only after the holder proved the secret does it learn where this
    // worker is; it connects an endpoint to it and says so.
    TH_ASSIGN_OR_RETURN(std::unique_ptr<Worker> worker, Worker::Create(ctx_));
    TH_ASSIGN_OR_RETURN(std::string local, worker->Address());
    if (local.empty() || local.size() > ucx::kMaxWorkerAddressBytes) {
      return ResourceExhausted("UCX worker address of " +
                               std::to_string(local.size()) + " bytes");
    }
    std::string hello =
        ucx::EncodeHelloHeader(static_cast<uint32_t>(local.size()));
    iovec hv[2] = {{hello.data(), hello.size()}, {local.data(), local.size()}};
    TH_RETURN_IF_ERROR(
        WriteAll(fd.get(), hv, deadline).WithContext("holder " + address));
    uint8_t ready[ucx::kHelloHeaderBytes];
    TH_RETURN_IF_ERROR(ReadExact(fd.get(), ready, sizeof(ready), deadline)
                           .WithContext("holder " + address));
    Result<uint32_t> len = ucx::DecodeReady(ready, sizeof(ready));
    if (!len.ok()) return len.status().WithContext("holder " + address);
    std::string remote(*len, '\0');
    TH_RETURN_IF_ERROR(
        ReadExact(fd.get(), remote.data(), remote.size(), deadline)
            .WithContext("holder " + address));
    // An endpoint of our own to the holder's worker, which UCX pairs with
    // the holder's to ours: closing it (Teardown) ends the transfers the
    // holder's messages started here, which a cut link would otherwise
    // leave running after Read returned.
    auto failed = std::make_unique<std::atomic<bool>>(false);
    Result<ucp_ep_h> ep =
        CreateEndpoint(*worker, remote, SameHost(fd.get()), failed.get());
    if (!ep.ok()) return ep.status().WithContext("holder " + address);
    return Link{std::move(fd), std::move(worker), *ep, std::move(failed)};
  }

 private:
  const std::shared_ptr<Context> ctx_;
  const std::string secret_;
};

}  // namespace

bool UcxAvailable() { return true; }

Result<RawUcxLinkForTest> OpenRawUcxLinkForTest(const std::string& address,
                                                const std::string& secret,
                                                const Deadline& deadline) {
  TH_ASSIGN_OR_RETURN(std::shared_ptr<Context> ctx, Context::Create());
  UcxTransportOptions options;
  options.secret = secret;
  UcxTransport t(ctx, options);
  TH_ASSIGN_OR_RETURN(UcxTransport::Link link, t.OpenLink(address, deadline));
  // The worker answers UCX's own messages (the holder's endpoint's wire-up)
  // as a real reader's does, on its own thread until `keep` goes; then the
  // worker goes, before its context.
  struct Kept {
    std::shared_ptr<Context> ctx;
    std::unique_ptr<Worker> worker;
    ucp_ep_h ep = nullptr;
    std::unique_ptr<std::atomic<bool>> failed;
    std::atomic<bool> stop{false};
    std::thread progress;
    ~Kept() {
      stop = true;
      worker->Signal();
      progress.join();
      CloseEndpoint(*worker, ep);
    }
  };
  auto kept = std::make_shared<Kept>();
  kept->ctx = ctx;
  kept->worker = std::move(link.worker);
  kept->ep = link.ep;
  kept->failed = std::move(link.failed);
  Kept* k = kept.get();
  kept->progress = std::thread([k] {
    (void)k->worker->Wait([] { return false; }, Deadline::AfterMs(3600000),
                          &k->stop);
  });
  return RawUcxLinkForTest{std::move(link.fd), std::move(kept)};
}

Result<std::unique_ptr<Transport>> MakeUcxTransport(
    const UcxTransportOptions& options) {
  TH_ASSIGN_OR_RETURN(std::shared_ptr<Context> ctx, Context::Create());
  return std::unique_ptr<Transport>(new UcxTransport(std::move(ctx), options));
}

uint64_t UcxLiveMappingsForTest() { return g_live_mappings.load(); }

}  // namespace tensorhub::transport
