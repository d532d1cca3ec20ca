#include "transport/ucx/ucx_transport.h"

#include <ifaddrs.h>
#include <netdb.h>
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
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "common/checksum.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/test_point.h"
#include "cuda/device.h"
#include "transport/tcp/acceptor.h"
#include "transport/tcp/auth.h"
#include "transport/tcp/cma.h"
#include "transport/tcp/request_io.h"
#include "transport/tcp/socket_util.h"
#include "transport/tcp/stream.h"
#include "transport/ucx/ucx_reply.h"
#include "transport/ucx/ucx_wires.h"

namespace tensorhub::transport {
namespace {

// How long a worker keeps polling after its last event before it sleeps on
// its event descriptor. Waking a sleeping worker costs a system call and a
// scheduler round trip for each message it must answer (a holder serving
// emulated gets over tcp answers a stream of them), which polling a little
// past the last one saves where the next comes soon: on loopback they come
// tens of microseconds apart. Where they come further apart than kMaxSpin
// (the test bed's 400 Mbit/s links hand a reader 64 KiB every 1.3 ms),
// polling only burns a core: so each worker keeps the average gap between
// its events and polls for kSpinFactor times it, at most kMaxSpin, and not
// at all when the average is above kMaxSpin (benchmarks.md, section 14).
// Except a holder answering gets (Polling::kAlways): UCX's shared memory
// wakes a worker for what it receives, not for room to send again, so a
// holder asleep with a reply waiting for room in the reader's queue slept
// until its poll timed out (50 ms; 0.3 GB/s instead of 8 over `cma,posix`).
constexpr std::chrono::nanoseconds kMaxSpin = std::chrono::microseconds(500);
constexpr int kSpinFactor = 4;
enum class Polling { kAdaptive, kAlways };

std::atomic<uint64_t> g_live_mappings{0};
std::atomic<uint64_t> g_next_key_id{1};

// What every context of this transport asks of UCX. UCP_FEATURE_RMA is
// what ucp_get_nbx needs, and it also makes UCX install, in every worker
// of the context, its handlers of emulated gets and puts, which copy from
// and to whatever address a peer names (docs/security.md, "What a UCX peer
// can reach": why a holder's context keeps it).
constexpr uint64_t kContextFeatures = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;

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
// what it logs during that probe is debug. The same for a context limited
// to RDMA wires on a machine without them (MakeUcxTransport explains).
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
  // `device`: the one network device UCX may use ("": UCX's default).
  // `wires`: the transports UCX may use, as UCX_TLS ("": the user's).
  // `quiet`: UCX's complaints while it is made are debug lines (a probe
  // whose failure the caller expects and explains).
  static Result<std::shared_ptr<Context>> Create(const std::string& device,
                                                 const std::string& wires = "",
                                                 bool quiet = false) {
    RouteUcxLogOnce();
    ucp_config_t* config = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
    if (s != UCS_OK) return UcsError(s, "reading the UCX configuration");
    if (!device.empty()) {
      s = ucp_config_modify(config, "NET_DEVICES", device.c_str());
      if (s != UCS_OK) {
        ucp_config_release(config);
        return UcsError(s, "limiting UCX to network device " + device);
      }
    }
    if (!wires.empty()) {
      s = ucp_config_modify(config, "TLS", wires.c_str());
      if (s != UCS_OK) {
        ucp_config_release(config);
        return UcsError(s, "limiting UCX to the wires " + wires);
      }
    }
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    p.features = kContextFeatures;
    // Connections' workers are made and used on the fetch threads, the
    // server's on its own: memory maps are shared between them.
    p.mt_workers_shared = 1;
    ucp_context_h ctx = nullptr;
    t_probing_peer_errors = quiet;
    s = ucp_init(&p, config, &ctx);
    t_probing_peer_errors = false;
    ucp_config_release(config);
    if (s != UCS_OK) return UcsError(s, "initialising UCX");
    return std::shared_ptr<Context>(new Context(ctx));
  }
  ~Context() { ucp_cleanup(ctx_); }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ucp_context_h get() const { return ctx_; }

  // The transport resources UCX chose for this context: every worker made
  // in it opens each of them (ucp_context_print_info's list).
  std::vector<ucx::Wire> Wires() const {
    char* text = nullptr;
    size_t len = 0;
    FILE* f = ::open_memstream(&text, &len);
    if (f == nullptr) return {};
    ucp_context_print_info(ctx_, f);
    std::fclose(f);
    std::vector<ucx::Wire> out =
        ucx::ParseContextWires(std::string_view(text, len));
    std::free(text);
    return out;
  }

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
  // *stop is set. Once nothing has happened for SpinBudget() (kMaxSpin with
  // Polling::kAlways) it sleeps on the worker's event descriptor, and on
  // `also_fd` when one is given (at most 50 ms at a time, so that a stop is
  // seen even without a signal).
  //
  // done() is asked before every progress call, not only after: a holder
  // waits for "the reader released, or left", and once the reader has left
  // its worker must not be progressed again. Progress would answer get
  // requests that the departed reader left behind (a holder paused while
  // they arrived, then resumed), and UCX 1.13 aborts the process when such
  // an answer fails (ucp_get_req_handler: "Fatal: unexpected error:
  // Endpoint timeout"). Test: UcxRegistryTest, AHolderResumedAfter...
  template <typename Done>
  Status Wait(Done&& done, const Deadline& deadline,
              const std::atomic<bool>* stop, int also_fd = -1,
              Polling polling = Polling::kAdaptive) {
    auto idle_since = std::chrono::steady_clock::now();
    for (;;) {
      if (done()) return Status::Ok();
      testpoint::Hit("ucx.progress_next");
      bool progressed = false;
      while (ucp_worker_progress(w_) != 0) progressed = true;
      if (done()) return Status::Ok();
      if (stop != nullptr && stop->load()) return Unavailable("cancelled");
      if (deadline.expired()) {
        return DeadlineExceeded("UCX transfer did not finish in time");
      }
      const auto now = std::chrono::steady_clock::now();
      if (progressed) {
        NoteGap(now - idle_since);
        idle_since = now;
      }
      const std::chrono::nanoseconds spin =
          polling == Polling::kAlways ? kMaxSpin : SpinBudget();
      if (efd_ < 0 || now - idle_since < spin) {
        std::this_thread::yield();
        continue;
      }
      ucs_status_t s = ucp_worker_arm(w_);
      if (s == UCS_ERR_BUSY) continue;  // events arrived: progress again
      if (s != UCS_OK) {
        std::this_thread::yield();
        continue;
      }
      pollfd p[2] = {{efd_, POLLIN, 0}, {also_fd, POLLIN, 0}};
      (void)::poll(
          p, also_fd >= 0 ? 2 : 1,
          static_cast<int>(std::min<int64_t>(deadline.remaining_ms(), 50)));
    }
  }

 private:
  Worker(std::shared_ptr<Context> ctx, ucp_worker_h w, int efd)
      : ctx_(std::move(ctx)), w_(w), efd_(efd) {}

  // A moving average over about the last 8 gaps between events, each
  // counted as at most 4 x kMaxSpin so that one long idle spell (between
  // reads) does not stop the polling for long.
  void NoteGap(std::chrono::nanoseconds gap) {
    gap = std::min<std::chrono::nanoseconds>(gap, 4 * kMaxSpin);
    gap_ = (7 * gap_ + gap) / 8;
  }
  std::chrono::nanoseconds SpinBudget() const {
    if (gap_ > kMaxSpin) return std::chrono::nanoseconds(0);
    return std::min<std::chrono::nanoseconds>(kMaxSpin, kSpinFactor * gap_);
  }

  std::shared_ptr<Context> ctx_;  // outlives the worker
  ucp_worker_h w_;
  int efd_;  // owned by the worker
  // Starts where the budget is kMaxSpin, until the gaps say otherwise.
  std::chrono::nanoseconds gap_ = kMaxSpin / kSpinFactor;
};

// One ucp_mem_map of contiguous memory and its packed remote key. Unmapped
// on destruction: a remote key a reader kept no longer reads anything.
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
    void* buf = nullptr;
    size_t buf_len = 0;
    s = ucp_rkey_pack(ctx->get(), memh, &buf, &buf_len);
    if (s != UCS_OK) {
      ucp_mem_unmap(ctx->get(), memh);
      return UcsError(s, "packing a UCX remote key");
    }
    std::string packed(static_cast<const char*>(buf), buf_len);
    ucp_rkey_buffer_release(buf);
    if (packed.empty() || packed.size() > ucx::kMaxRkeyBytes) {
      ucp_mem_unmap(ctx->get(), memh);
      return ResourceExhausted("UCX remote key of " +
                               std::to_string(packed.size()) + " bytes");
    }
    g_live_mappings.fetch_add(1);
    return std::unique_ptr<Mapping>(
        new Mapping(std::move(ctx), memh, base, len, std::move(packed)));
  }
  ~Mapping() {
    ucp_mem_unmap(ctx_->get(), memh_);
    g_live_mappings.fetch_sub(1);
  }

  const uint8_t* base() const { return base_; }
  size_t length() const { return len_; }
  uint64_t id() const { return id_; }
  const std::string& packed() const { return packed_; }

 private:
  Mapping(std::shared_ptr<Context> ctx, ucp_mem_h memh, uint8_t* base,
          size_t len, std::string packed)
      : ctx_(std::move(ctx)),
        memh_(memh),
        base_(base),
        len_(len),
        id_(g_next_key_id.fetch_add(1)),
        packed_(std::move(packed)) {}
  const std::shared_ptr<Context> ctx_;
  const ucp_mem_h memh_;
  uint8_t* const base_;
  const size_t len_;
  const uint64_t id_;
  const std::string packed_;
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

// Whether `fd` has something to read, or was closed or shut down.
bool Readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) != 0;
}

// Each connection has its own UCX worker, made when the connection is
// accepted, progressed only by the thread that serves the connection (while
// it waits for the next request and for a release), and destroyed when the
// connection ends. Where UCX emulates a get (tcp, shared memory), the
// holder's worker answers it by copying from the address the get names,
// with no check against a registration, and answers a large get piece by
// piece as the reader takes the bytes. So a lease that ends without the
// reader's release (it went silent past local_release_timeout_ms, or
// closed the connection mid-read) may end only after that worker is gone:
// until then a get the reader already sent could still be answered from
// memory its owner may by then have unmapped or reused (docs/design.md,
// UCX data plane). One worker shared by all connections could not be
// dropped for one reader.
class UcxServer final : public Server {
 public:
  UcxServer(Fd listener, std::string address, ReadSource* source,
            ServerOptions options, std::shared_ptr<Context> ctx,
            std::string secret, const wire::HostIdentity& host)
      : address_(std::move(address)),
        source_(source),
        options_(options),
        ctx_(std::move(ctx)),
        secret_(std::move(secret)),
        host_(host),
        acceptor_(std::move(listener), AcceptorLimitsOf(options),
                  "ucx data server " + address_) {
    acceptor_.Start(
        [this](int fd, Acceptor::Ticket& ticket) { Serve(fd, ticket); });
  }
  ~UcxServer() override { Stop(); }

  std::string address() const override { return address_; }
  uint64_t bytes_served() const override { return bytes_served_.load(); }
  uint64_t connections_refused() const override {
    return refused_.load() + acceptor_.refused_at_accept();
  }

  void Stop() override {
    MutexLock stop_lock(stop_mu_);
    stopping_ = true;
    // Shuts every connection down and joins its thread, which destroys the
    // connection's worker before its lease ends.
    acceptor_.Stop();
  }

 private:
  // Serves one connection until the peer leaves, an I/O error, or Stop().
  // As in the TCP server, one request's whole life stays in one loop body:
  // the lease (and a per-read mapping) visibly ends at its bottom, after
  // the reader released it, or after the connection was shut down.
  void Serve(int fd, Acceptor::Ticket& ticket) {
    const int64_t stall_ms = options_.io_stall_timeout_ms;
    // The TCP stream of requests, frames and releases (never TLS: a
    // worker with data-plane TLS does not serve UCX).
    Stream stream(fd);
    // Within the short handshake deadline, and holding only an
    // authenticating slot until it passes (acceptor.h): no UCX worker for
    // a peer that has not proven the secret.
    Status auth =
        ServerHandshake(stream, secret_, nullptr,
                        Deadline::AfterMs(options_.handshake_timeout_ms),
                        [&ticket] { return ticket.Admit(); });
    if (!auth.ok()) {
      if (auth.code() != StatusCode::kResourceExhausted) {
        acceptor_.refusals().Refused(ticket.peer(), auth.ToString());
        refused_.fetch_add(1, std::memory_order_relaxed);
      }
      return;
    }
    // This connection's worker; see the class comment for why one per
    // connection, and why it goes before a lease the reader did not release.
    Result<std::unique_ptr<Worker>> made = Worker::Create(ctx_);
    Result<std::string> worker_address =
        made.ok() ? (*made)->Address() : made.status();
    if (worker_address.ok() &&
        (worker_address->empty() ||
         worker_address->size() > ucx::kMaxWorkerAddressBytes)) {
      worker_address =
          ResourceExhausted("UCX worker address of " +
                            std::to_string(worker_address->size()) + " bytes");
    }
    if (!worker_address.ok()) {
      // Said in the hello (an address of 0 bytes), so that the reader reads
      // this holder over TCP instead of counting it as failed.
      TH_LOG(WARN) << "ucx data server " << address_
                   << ": sending a reader to tcp: no UCX worker for it ("
                   << worker_address.status().ToString()
                   << "); each UCX reader connection needs one (descriptors "
                      "and memory: docs/design.md, UCX data plane; raise "
                      "'ulimit -n')";
      std::string refusal = ucx::EncodeHelloHeader(0, host_);
      iovec rv{refusal.data(), refusal.size()};
      (void)WriteAll(fd, {&rv, 1}, Deadline::AfterMs(stall_ms), stall_ms);
      return;
    }
    std::unique_ptr<Worker> worker = std::move(made).value();
    // Only a peer that proved the secret learns where the worker is.
    std::string hello = ucx::EncodeHelloHeader(
        static_cast<uint32_t>(worker_address->size()), host_);
    iovec hv[2] = {
        {hello.data(), hello.size()},
        {const_cast<char*>(worker_address->data()), worker_address->size()}};
    if (!WriteAll(fd, hv, Deadline::AfterMs(stall_ms), stall_ms).ok()) return;
    while (!stopping_.load()) {
      // Between reads the worker still has work: connecting the reader's
      // endpoint, keepalives.
      Status ready = worker->Wait([fd] { return Readable(fd); },
                                  Deadline::AfterMs(200), &stopping_, fd);
      if (ready.code() == StatusCode::kDeadlineExceeded) continue;
      if (!ready.ok()) return;
      Deadline deadline = Deadline::AfterMs(3600 * 1000);
      IncomingRequest in;
      Status bad;
      const RequestOutcome got =
          ReadIncomingRequest(stream, deadline, stall_ms, &in, &bad);
      if (got == RequestOutcome::kGone) return;
      if (got == RequestOutcome::kOk && (in.local || in.cuda_ipc)) {
        bad = InvalidArgument(
            "same-host reads are not offered on a UCX connection");
      }
      if (!bad.ok()) {
        acceptor_.refusals().Refused(ticket.peer(),
                                     "dropped a reader: " + bad.ToString());
        (void)SendError(fd, bad, deadline);
        return;
      }
      const wire::ReadRequest& req = in.req;
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
      Result<std::string> body =
          maps.ok() ? ReplyBody(**maps, lease->pieces) : maps.status();
      if (!body.ok()) {
        if (!SendError(fd, body.status(), deadline).ok()) return;
        continue;
      }
      if (!ServeRma(fd, *worker, req, *body, deadline)) {
        // Shut down before the lease ends: a reader still reading sees the
        // connection gone when it finishes, and discards the bytes. And
        // the worker goes first: a get the reader sent is answered by no
        // one once the memory may be reused.
        ::shutdown(fd, SHUT_RDWR);
        worker.reset();
        return;
      }
      // The lease (and a per-read mapping) ends here, after the release:
      // the reader took every byte it asked for, so no get of this read is
      // still being answered.
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

  static Result<std::string> ReplyBody(const MappingSet& maps,
                                       const std::vector<iovec>& pieces) {
    ucx::RmaReply reply;
    std::map<uint64_t, uint32_t> key_index;  // mapping id -> index
    for (const iovec& v : pieces) {
      if (v.iov_len == 0) continue;
      const auto* p = static_cast<const uint8_t*>(v.iov_base);
      const Mapping* m = maps.Find(p, v.iov_len);
      if (m == nullptr) {
        return Internal("a served range lies outside its registered memory");
      }
      auto [it, added] =
          key_index.emplace(m->id(), static_cast<uint32_t>(reply.keys.size()));
      if (added) {
        if (reply.keys.size() == ucx::kMaxRmaKeys) {
          return ResourceExhausted("read spans too many registrations");
        }
        reply.keys.push_back({m->id(), m->packed()});
      }
      const uint64_t addr = reinterpret_cast<uint64_t>(p);
      if (!reply.pieces.empty() && reply.pieces.back().key == it->second &&
          reply.pieces.back().address + reply.pieces.back().length == addr) {
        reply.pieces.back().length += v.iov_len;
        continue;
      }
      if (reply.pieces.size() == ucx::kMaxRmaPieces) {
        return ResourceExhausted("read too scattered for one UCX reply");
      }
      reply.pieces.push_back({addr, v.iov_len, it->second});
    }
    std::string body = ucx::EncodeRmaReply(reply);
    if (body.size() > ucx::kMaxRmaReplyBytes) {
      return ResourceExhausted("UCX reply over its bound");
    }
    return body;
  }

  // Tells the reader where to read, then waits (bounded) for its release,
  // answering its gets meanwhile. False: drop the connection.
  bool ServeRma(int fd, Worker& worker, const wire::ReadRequest& req,
                const std::string& body, const Deadline& deadline) {
    wire::ResponseHeader h;
    h.status = StatusCode::kOk;
    h.payload_len = body.size();
    auto hdr = wire::EncodeResponseHeader(h);
    iovec iov[2] = {{hdr.data(), hdr.size()},
                    {const_cast<char*>(body.data()), body.size()}};
    if (!WriteAll(fd, iov, deadline, options_.io_stall_timeout_ms).ok()) {
      return false;
    }
    testpoint::Hit("ucx.reply_sent", req.length);
    uint8_t release[wire::kReleaseBytes];
    const Deadline release_by =
        Deadline::AfterMs(options_.local_release_timeout_ms);
    Status s = worker.Wait([fd] { return Readable(fd); }, release_by, nullptr,
                           fd, Polling::kAlways);
    if (s.ok()) s = ReadExact(fd, release, sizeof(release), release_by);
    if (!s.ok()) {
      if (s.code() == StatusCode::kDeadlineExceeded) {
        TH_LOG(WARN) << "ucx data server " << address_
                     << ": a reader did not release its lease within "
                     << options_.local_release_timeout_ms << " ms; dropping it";
      }
      return false;
    }
    Result<wire::ReleaseOutcome> outcome =
        wire::DecodeRelease(release, sizeof(release));
    if (!outcome.ok()) {
      TH_LOG(WARN) << "ucx data server " << address_
                   << ": dropping peer: " << outcome.status().ToString();
      return false;
    }
    if (*outcome == wire::ReleaseOutcome::kCopied) {
      bytes_served_.fetch_add(req.length, std::memory_order_relaxed);
    }
    return true;
  }

  Status SendError(int fd, const Status& status, const Deadline& deadline) {
    Stream stream(fd);
    return SendRefusal(stream, status, deadline, options_.io_stall_timeout_ms);
  }

  const std::string address_;
  ReadSource* const source_;
  const ServerOptions options_;
  const std::shared_ptr<Context> ctx_;
  const std::string secret_;
  const wire::HostIdentity host_;  // sent in the hello
  std::atomic<uint64_t> refused_{0};
  Mutex stop_mu_;  // serialises Stop()
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> bytes_served_{0};
  // Last: its threads run Serve() on the members above.
  Acceptor acceptor_;
};

class UcxConnection final : public Connection {
 public:
  UcxConnection(Fd fd, std::string peer, std::unique_ptr<Worker> worker,
                int64_t linger_ms)
      : fd_(std::move(fd)),
        peer_(std::move(peer)),
        worker_(std::move(worker)),
        linger_ms_(linger_ms) {}
  ~UcxConnection() override {
    for (auto& s : streams_) {
      if (s) (void)s->Synchronize();
    }
    Teardown();
  }

  // Connects the endpoint to the holder's worker. Asks UCX to report a
  // holder that died (failing the reads on it at once instead of at their
  // deadline); the wires that cannot (shared memory in UCX 1.13) are used
  // without it, their reads then bounded by the deadline alone.
  Status Open(const std::string& remote_address) {
    t_probing_peer_errors = true;
    ucs_status_t s = CreateEp(remote_address, UCP_ERR_HANDLING_MODE_PEER);
    t_probing_peer_errors = false;
    peer_errors_ = s == UCS_OK;
    if (s == UCS_ERR_UNREACHABLE) {
      s = CreateEp(remote_address, UCP_ERR_HANDLING_MODE_NONE);
    }
    if (s != UCS_OK) {
      ep_ = nullptr;
      return UcsError(s, "connecting a UCX endpoint to holder " + peer_);
    }
    return Status::Ok();
  }

  Status Read(const wire::ReadRequest& req, std::span<const iovec> dest,
              const Deadline& deadline, ReadChecksum* sum) override {
    if (broken_) return Unavailable("connection to " + peer_ + " is broken");
    last_read_ = ReadInfo{};
    return Finish(DoRead(req, dest, -1, deadline, sum));
  }

  Status ReadDevice(const wire::ReadRequest& req, std::span<const iovec> dest,
                    int device, const Deadline& deadline,
                    ReadChecksum* sum) override {
    if (broken_) return Unavailable("connection to " + peer_ + " is broken");
    // A failure here is about this process's device, not the holder.
    for (auto& s : streams_) {
      if (!s || s->device() != device) {
        TH_ASSIGN_OR_RETURN(s, cuda::Stream::Create(device));
      }
    }
    last_read_ = ReadInfo{};
    return Finish(DoRead(req, dest, device, deadline, sum));
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
    if (!KeepsConnection(s.code())) {
      if (!broken_) Abandon();  // the stream position is unknown now
    }
    return s;
  }

  // `device` < 0: `dest` is host memory; else memory of that CUDA device,
  // reached through pinned staging buffers.
  Status DoRead(const wire::ReadRequest& req, std::span<const iovec> dest,
                int device, const Deadline& deadline, ReadChecksum* sum) {
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
    TH_ASSIGN_OR_RETURN(ucx::RmaReply reply, ReceiveReply(req, deadline));
    TH_ASSIGN_OR_RETURN(std::vector<ucp_rkey_h> keys, Keys(reply));
    ChunkHash hash(ChecksumKind(sum), /*timed=*/true);
    if (device < 0) {
      TH_RETURN_IF_ERROR(Get(reply, keys, 0, dest, deadline,
                             sum != nullptr ? &hash : nullptr));
    } else {
      TH_RETURN_IF_ERROR(GetStaged(reply, keys, req.length, dest, bufs,
                                   deadline, sum != nullptr ? &hash : nullptr));
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
    auto rel = wire::EncodeRelease(wire::ReleaseOutcome::kCopied);
    iovec rv{rel.data(), rel.size()};
    TH_RETURN_IF_ERROR(
        WriteAll(fd_.get(), {&rv, 1}, deadline).WithContext("holder " + peer_));
    SetChecksum(hash, sum);
    last_read_.verify_ns = hash.update_ns();
    return Status::Ok();
  }

  // The holder's answer: its refusal as a status, or where to read.
  Result<ucx::RmaReply> ReceiveReply(const wire::ReadRequest& req,
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
    if (h->local || h->cuda_ipc || h->payload_len > ucx::kMaxRmaReplyBytes) {
      Abandon();
      return DataLoss("holder " + peer_ + " sent a reply UCX does not expect");
    }
    std::string body(h->payload_len, '\0');
    TH_RETURN_IF_ERROR(ReadExact(fd_.get(), body.data(), body.size(), deadline)
                           .WithContext("holder " + peer_));
    Result<ucx::RmaReply> reply = ucx::DecodeRmaReply(
        reinterpret_cast<const uint8_t*>(body.data()), body.size(), req.length);
    if (!reply.ok()) {
      Abandon();  // closing the connection ends the holder's lease
      return DataLoss("holder " + peer_ +
                      " sent a bad UCX reply: " + reply.status().message());
    }
    return reply;
  }

  // The unpacked remote key of each of the reply's keys, cached by id.
  Result<std::vector<ucp_rkey_h>> Keys(const ucx::RmaReply& reply) {
    if (rkeys_.size() + reply.keys.size() > kMaxCachedKeys) {
      // No read is in flight here: every cached key may go.
      for (auto& [id, rk] : rkeys_) ucp_rkey_destroy(rk);
      rkeys_.clear();
    }
    std::vector<ucp_rkey_h> out;
    out.reserve(reply.keys.size());
    for (const ucx::RmaKey& k : reply.keys) {
      auto it = rkeys_.find(k.id);
      if (it == rkeys_.end()) {
        ucp_rkey_h rk = nullptr;
        ucs_status_t s = ucp_ep_rkey_unpack(ep_, k.packed.data(), &rk);
        if (s != UCS_OK) {
          Abandon();
          return DataLoss("holder " + peer_ + " sent a UCX remote key that " +
                          "cannot be unpacked: " + ucs_status_string(s));
        }
        it = rkeys_.emplace(k.id, rk).first;
      }
      out.push_back(it->second);
    }
    return out;
  }

  // Reads bytes [offset, offset + size of dst) of the reply's range into
  // `dst` with one ucp_get_nbx per contiguous run of at most kGetBytes, and
  // waits for all of them. With `hash`, each run is hashed (in order) as
  // soon as it and every run before it have landed, while the later ones
  // are still moving: the check costs no pass over the chunk after the
  // last byte. On any failure the connection is abandoned before
  // returning, so nothing lands in `dst` afterwards.
  Status Get(const ucx::RmaReply& reply, const std::vector<ucp_rkey_h>& keys,
             uint64_t offset, std::span<const iovec> dst,
             const Deadline& deadline, ChunkHash* hash = nullptr) {
    size_t pi = 0;
    uint64_t at = 0;
    while (pi < reply.pieces.size() && at + reply.pieces[pi].length <= offset) {
      at += reply.pieces[pi++].length;
    }
    uint64_t in = offset - at;  // into piece pi
    ucp_request_param_t param{};
    Status issued = Status::Ok();
    for (const iovec& d : dst) {
      auto* p = static_cast<uint8_t*>(d.iov_base);
      uint64_t left = d.iov_len;
      while (left > 0 && issued.ok()) {
        if (pi >= reply.pieces.size()) {
          issued = Internal("read past the end of the holder's pieces");
          break;
        }
        const ucx::RmaPiece& rp = reply.pieces[pi];
        const uint64_t take = std::min({left, rp.length - in, kGetBytes});
        ucs_status_ptr_t r =
            ucp_get_nbx(ep_, p, take, rp.address + in, keys[rp.key], &param);
        if (UCS_PTR_IS_ERR(r)) {
          issued = UcsError(UCS_PTR_STATUS(r), "UCX get from holder " + peer_);
        } else {
          // Null: done already. Kept in order, for the hash.
          pending_.push_back(r);
          landing_.push_back({p, take});
        }
        p += take;
        left -= take;
        in += take;
        if (in == rp.length) {
          ++pi;
          in = 0;
        }
      }
    }
    testpoint::Hit("ucx.gets_issued", pending_.size());
    size_t next = 0;  // pending_[..next) are complete (and hashed)
    bool failed = false;
    Status waited = worker_->Wait(
        [&] {
          while (next < pending_.size()) {
            if (pending_[next] != nullptr) {
              const ucs_status_t st = ucp_request_check_status(pending_[next]);
              if (st == UCS_INPROGRESS) break;
              failed = failed || st != UCS_OK;
            }
            // Bytes of a failed get are never used: the read fails below.
            if (hash != nullptr && !failed) {
              hash->Update(landing_[next].iov_base, landing_[next].iov_len);
            }
            ++next;
          }
          return next == pending_.size();
        },
        deadline, &cancelled_);
    if (!waited.ok() || !issued.ok()) {
      Abandon();
      return (issued.ok() ? waited : issued).WithContext("holder " + peer_);
    }
    Status result = Status::Ok();
    for (void* r : pending_) {
      if (r == nullptr) continue;
      ucs_status_t s = ucp_request_check_status(r);
      if (s != UCS_OK && result.ok()) {
        result = UcsError(s, "UCX get from holder " + peer_);
      }
      ucp_request_free(r);
    }
    pending_.clear();
    landing_.clear();
    if (result.ok() && ep_failed_.load()) {
      result = Unavailable("UCX endpoint to holder " + peer_ + " failed");
    }
    if (!result.ok()) Abandon();
    return result;
  }

  ucs_status_t CreateEp(const std::string& remote_address,
                        ucp_err_handling_mode_t mode) {
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = reinterpret_cast<const ucp_address_t*>(remote_address.data());
    ep.err_mode = mode;
    if (mode == UCP_ERR_HANDLING_MODE_PEER) {
      ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t) {
        static_cast<UcxConnection*>(arg)->ep_failed_.store(true);
      };
      ep.err_handler.arg = this;
    }
    return ucp_ep_create(worker_->get(), &ep, &ep_);
  }

  // Device destination: each segment is read into one of two pinned
  // buffers, hashed there, and copied to the device while the next one is
  // read into the other buffer.
  Status GetStaged(const ucx::RmaReply& reply,
                   const std::vector<ucp_rkey_h>& keys, uint64_t length,
                   std::span<const iovec> dest, cuda::PinnedPool::Lease& bufs,
                   const Deadline& deadline, ChunkHash* hash) {
    // A failure of this device leaves the read unreleased: whatever its
    // code, the connection is out of step with the holder.
    auto broken = [this](Status s) {
      if (!broken_) Abandon();
      return s;
    };
    const uint64_t seg = cuda::StagingPool().buffer_bytes();
    for (uint64_t k = 0, off = 0; off < length; ++k, off += seg) {
      const uint64_t len = std::min(seg, length - off);
      uint8_t* buf = bufs.buffer(k % 2);
      // The copy out of this buffer two segments ago must be done.
      if (Status s = streams_[k % 2]->Synchronize(); !s.ok()) return broken(s);
      iovec b{buf, len};
      TH_RETURN_IF_ERROR(Get(reply, keys, off, {&b, 1}, deadline));
      if (hash != nullptr) hash->Update(buf, len);
      Status copied =
          ForRange(dest, off, len, [&](uint8_t* p, uint64_t l, uint64_t done) {
            return streams_[k % 2]->CopyAsync(p, buf + done, l);
          });
      if (!copied.ok()) return broken(copied);
    }
    for (auto& s : streams_) {
      if (Status st = s->Synchronize(); !st.ok()) return broken(st);
    }
    return Status::Ok();
  }

  bool PeerClosed() {
    pollfd p{fd_.get(), POLLIN | POLLRDHUP, 0};
    return ::poll(&p, 1, 0) != 0;
  }

  // Breaks the connection for good: closes the TCP stream (which ends the
  // holder's lease) and the UCX endpoint and worker, after which no get
  // of ours moves another byte.
  void Abandon() {
    broken_ = true;
    {
      MutexLock l(mu_);
      fd_.Reset();
    }
    Linger();
    Teardown();
  }

  // Called with the TCP connection just closed, before the endpoint goes.
  // Where UCX emulates gets, the holder's worker answers ours, and UCX 1.13
  // aborts the holder when an answer fails because our endpoint is gone.
  // The holder stops answering once it sees the closed connection (it asks
  // before every progress call, then drops the connection's worker), but
  // a progress call it began just before that would still answer. So with
  // gets outstanding, wait until none is left for the holder to answer:
  // each completed, or our endpoint failed (the holder dropped its worker),
  // or linger_ms_ passed (a holder stopped that long sees the closed
  // connection first when it resumes). This worker keeps progressing
  // meanwhile, so bytes of the failed read may still land in its
  // destination: its Read has not returned. Only on endpoints that report
  // a dead peer (tcp); shared memory does not fail an answer to a reader
  // that left (UcxRegistryTest, AReaderLeavingAsTheHolderAnswers...).
  void Linger() {
    if (!worker_ || ep_ == nullptr || !peer_errors_ || ep_failed_.load()) {
      return;
    }
    auto outstanding = [&] {
      return std::any_of(pending_.begin(), pending_.end(), [](void* r) {
        return r != nullptr && ucp_request_check_status(r) == UCS_INPROGRESS;
      });
    };
    if (!outstanding()) return;
    testpoint::Hit("ucx.reader_lingers", pending_.size());
    (void)worker_->Wait([&] { return ep_failed_.load() || !outstanding(); },
                        Deadline::AfterMs(linger_ms_), nullptr);
  }

  // Force-closes the endpoint (outstanding gets complete as cancelled),
  // frees what the reads left, and destroys the worker. Reading thread
  // only.
  void Teardown() {
    if (!worker_) return;
    if (ep_ != nullptr) {
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t r = ucp_ep_close_nbx(ep_, &param);
      if (UCS_PTR_IS_PTR(r)) {
        (void)worker_->Wait(
            [&] { return ucp_request_check_status(r) != UCS_INPROGRESS; },
            Deadline::AfterMs(kCloseWaitMs), nullptr);
        ucp_request_free(r);
      }
      ep_ = nullptr;
    }
    for (void* r : pending_) {
      if (r != nullptr) ucp_request_free(r);
    }
    pending_.clear();
    landing_.clear();
    for (auto& [id, rk] : rkeys_) ucp_rkey_destroy(rk);
    rkeys_.clear();
    std::unique_ptr<Worker> w;
    {
      MutexLock l(mu_);
      w = std::move(worker_);
    }
    w.reset();  // destroys the worker: its transports stop moving bytes
  }

  // Twice the most one reply names, so one reply always fits.
  static constexpr size_t kMaxCachedKeys = 2 * ucx::kMaxRmaKeys;
  // The most one get moves: small enough that the hash of the runs already
  // landed overlaps the rest, large enough that a chunk takes a handful.
  static constexpr uint64_t kGetBytes = 1 << 20;
  static constexpr int64_t kCloseWaitMs = 2000;

  // fd_ and worker_ are replaced only by the reading thread, under mu_;
  // Cancel uses them under mu_ from another thread.
  Mutex mu_;
  Fd fd_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> ep_failed_{false};
  // The endpoint reports a dead peer (UCP_ERR_HANDLING_MODE_PEER).
  bool peer_errors_ = false;
  const std::string peer_;
  std::unique_ptr<Worker> worker_;
  const int64_t linger_ms_;  // bounds Linger()
  // The reading thread's:
  ucp_ep_h ep_ = nullptr;
  std::map<uint64_t, ucp_rkey_h> rkeys_;  // by key id, bounded
  std::vector<void*> pending_;  // gets in flight, in order; null: done
  std::vector<iovec> landing_;  // where each of pending_ lands
  bool broken_ = false;
  ReadInfo last_read_;
  std::unique_ptr<cuda::Stream> streams_[2];  // device reads, made on use
};

class UcxTransport final : public Transport {
 public:
  UcxTransport(std::shared_ptr<Context> ctx, const UcxTransportOptions& o)
      : ctx_(std::move(ctx)),
        secret_(o.secret),
        refuse_same_host_(o.refuse_same_host),
        linger_ms_(o.give_up_linger_ms) {
    // All zero where /proc cannot say: then no holder counts as this
    // host's, and none is told it is.
    Result<wire::HostIdentity> id = ReadHostIdentity();
    if (id.ok()) host_ = *id;
  }

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
    // Each connection gets its own worker; one made here says at once
    // whether UCX can make them at all.
    TH_RETURN_IF_ERROR(Worker::Create(ctx_).status());
    return std::unique_ptr<Server>(new UcxServer(
        std::move(fd), advertised, source, options, ctx_, secret_, host_));
  }

  Result<std::unique_ptr<Connection>> Connect(
      const std::string& address, const Deadline& deadline) override {
    TH_ASSIGN_OR_RETURN(Fd fd, ConnectTcp(address, deadline));
    TH_RETURN_IF_ERROR(ClientHandshake(fd.get(), secret_, deadline)
                           .WithContext("holder " + address));
    uint8_t hello[ucx::kHelloHeaderBytes];
    TH_RETURN_IF_ERROR(ReadExact(fd.get(), hello, sizeof(hello), deadline)
                           .WithContext("holder " + address));
    Result<ucx::Hello> decoded = ucx::DecodeHelloHeader(hello, sizeof(hello));
    if (!decoded.ok()) return decoded.status().WithContext("holder " + address);
    const ucx::Hello& h = *decoded;
    if (refuse_same_host_ && h.host == host_ &&
        h.host != wire::HostIdentity{}) {
      // TCP's same-host path copies the bytes once (cross-memory attach,
      // CUDA IPC); UCX 1.13 on one host cannot read user memory that way.
      return FailedPrecondition(
          "holder " + address +
          " is on this host (same boot id and namespaces): read it over "
          "tcp, whose cross-memory attach copies the bytes once "
          "(TENSORHUB_UCX_SAME_HOST=1 reads it over UCX anyway)");
    }
    const uint32_t len = h.address_len;
    std::string remote(len, '\0');
    TH_RETURN_IF_ERROR(ReadExact(fd.get(), remote.data(), len, deadline)
                           .WithContext("holder " + address));
    TH_ASSIGN_OR_RETURN(std::unique_ptr<Worker> worker, Worker::Create(ctx_));
    auto c = std::make_unique<UcxConnection>(std::move(fd), address,
                                             std::move(worker), linger_ms_);
    TH_RETURN_IF_ERROR(c->Open(remote));
    return std::unique_ptr<Connection>(std::move(c));
  }

 private:
  const std::shared_ptr<Context> ctx_;
  const std::string secret_;
  const bool refuse_same_host_;
  const int64_t linger_ms_;
  wire::HostIdentity host_;  // this process's; set once, in the constructor
};

}  // namespace

bool UcxAvailable() { return true; }

std::string InterfaceOf(const std::string& host) {
  if (host.empty()) return "";
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICSERV;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string bare = host;
  if (bare.size() > 2 && bare.front() == '[' && bare.back() == ']') {
    bare = bare.substr(1, bare.size() - 2);
  }
  if (::getaddrinfo(bare.c_str(), nullptr, &hints, &res) != 0) return "";
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) {
    ::freeaddrinfo(res);
    return "";
  }
  std::string found;
  for (addrinfo* a = res; a != nullptr && found.empty(); a = a->ai_next) {
    for (ifaddrs* i = ifs; i != nullptr && found.empty(); i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != a->ai_family) {
        continue;
      }
      if (a->ai_family == AF_INET &&
          reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr.s_addr ==
              reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr) {
        found = i->ifa_name;
      } else if (a->ai_family == AF_INET6 &&
                 std::memcmp(
                     &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr,
                     &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                     sizeof(in6_addr)) == 0) {
        found = i->ifa_name;
      }
    }
  }
  ::freeifaddrs(ifs);
  ::freeaddrinfo(res);
  return found;
}

namespace {

// The context a transport runs on (ucx_wires.h). Without emulated gets
// allowed, a context whose wires all have their gets checked: UCX_TLS's
// where it names such wires, else (UCX_TLS unset or "all") UCX limited to
// its RDMA wires. Such a context is not limited to the data plane's network
// device: RDMA devices have names of their own ("mlx5_0:1", not the "ib0" or
// "eth2" that holds the address), and none of these wires listens on a
// socket. Failing that, the refusal, naming what UCX would have used here.
// With emulated gets allowed, UCX's own choice, said once per process.
Result<std::shared_ptr<Context>> MakeContext(const std::string& device,
                                             bool allow_emulated_gets) {
  if (!allow_emulated_gets) {
    // "all" is UCX's default.
    const char* tls = std::getenv("UCX_TLS");
    const bool tls_chosen =
        tls != nullptr && *tls != '\0' && std::string_view(tls) != "all";
    Result<std::shared_ptr<Context>> checked = Context::Create(
        "", tls_chosen ? "" : ucx::kRdmaWires, /*quiet=*/!tls_chosen);
    if (checked.ok()) {
      const std::vector<ucx::Wire> wires = (*checked)->Wires();
      if (!wires.empty() && ucx::UncheckedGetWires(wires).empty()) {
        return checked;
      }
    }
  }
  TH_ASSIGN_OR_RETURN(std::shared_ptr<Context> ctx, Context::Create(device));
  const std::vector<std::string> unchecked =
      ucx::UncheckedGetWires(ctx->Wires());
  if (unchecked.empty()) return ctx;
  if (!allow_emulated_gets) return ucx::EmulatedGetsRefusal(unchecked);
  static std::once_flag said;
  std::call_once(said, [&] {
    std::string list;
    for (const std::string& w : unchecked) list += " " + w;
    TH_LOG(WARN)
        << "ucx: wires whose gets nothing checks allowed ("
        << ucx::kEmulatedGetsEnv
        << "=allow or ClientOptions::ucx_emulated_gets):" << list
        << ": any peer that proved the secret can read and write "
           "all of this process's memory over them (docs/security.md, \"What "
           "a UCX peer can reach\")";
  });
  return ctx;
}

}  // namespace

Result<std::unique_ptr<Transport>> MakeUcxTransport(
    const UcxTransportOptions& options) {
  // UCX's workers listen on every device it may use (its tcp wire): only
  // the data plane's, unless the user chose (UCX_NET_DEVICES).
  std::string device;
  const char* chosen = std::getenv("UCX_NET_DEVICES");
  if (chosen == nullptr || *chosen == '\0') {
    device = InterfaceOf(options.listen_host);
    const bool wildcard =
        options.listen_host.empty() || options.listen_host == "0.0.0.0" ||
        options.listen_host == "::" || options.listen_host == "[::]";
    if (device.empty() && !wildcard) {
      TH_LOG(WARN) << "ucx: no network interface of this machine holds "
                   << options.listen_host
                   << " (the data plane's address): UCX may use every "
                      "interface; set UCX_NET_DEVICES to limit it";
    }
  }
  TH_ASSIGN_OR_RETURN(std::shared_ptr<Context> ctx,
                      MakeContext(device, options.allow_emulated_gets));
  return std::unique_ptr<Transport>(new UcxTransport(std::move(ctx), options));
}

uint64_t UcxLiveMappingsForTest() { return g_live_mappings.load(); }

uint64_t UcxContextFeaturesForTest() { return kContextFeatures; }

}  // namespace tensorhub::transport
