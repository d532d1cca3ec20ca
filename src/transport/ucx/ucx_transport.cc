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
#include <array>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// What every context of this transport asks of UCX: active messages
// (the holder sends a read's bytes with ucp_am_send_nbx) and wake-ups.
// Never UCP_FEATURE_RMA: with it UCX 1.13 installs, in every worker, its
// handlers of emulated gets and puts, which copy from and to whatever
// address a peer names (docs/security.md, "What a UCX peer can reach").
constexpr uint64_t kContextFeatures = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;

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
    // server's on its own: UCX's registration cache (rendezvous) is shared
    // between them.
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

// Whether `fd` has something to read, or was closed or shut down.
bool Readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) != 0;
}

// How long closing an endpoint may wait for UCX to finish the close.
constexpr int64_t kCloseWaitMs = 2000;

// This process's endpoint to a peer's worker, connected by the worker's
// address. Asks UCX to report a peer that died (what waits on it then fails
// at once instead of at its deadline); on the wires that cannot (shared
// memory in UCX 1.13) it goes without. Close() (or destruction) closes it
// by force: what it still had to send completes as cancelled. Used only by
// the thread that progresses `worker`, which outlives it.
class Endpoint {
 public:
  explicit Endpoint(Worker& worker) : worker_(worker) {}
  ~Endpoint() { Close(); }
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  Status Open(const std::string& remote_address, const std::string& peer) {
    t_probing_peer_errors = true;
    ucs_status_t s = Create(remote_address, UCP_ERR_HANDLING_MODE_PEER);
    t_probing_peer_errors = false;
    peer_errors_ = s == UCS_OK;
    if (s == UCS_ERR_UNREACHABLE) {
      s = Create(remote_address, UCP_ERR_HANDLING_MODE_NONE);
    }
    if (s != UCS_OK) {
      ep_ = nullptr;
      return UcsError(s, "connecting a UCX endpoint to " + peer);
    }
    return Status::Ok();
  }

  ucp_ep_h get() const { return ep_; }
  // UCX reported the peer dead (only where peer_errors()).
  bool failed() const { return failed_.load(); }
  bool peer_errors() const { return peer_errors_; }

  void Close() {
    if (ep_ == nullptr) return;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep_, &param);
    if (UCS_PTR_IS_PTR(r)) {
      (void)worker_.Wait(
          [&] { return ucp_request_check_status(r) != UCS_INPROGRESS; },
          Deadline::AfterMs(kCloseWaitMs), nullptr);
      ucp_request_free(r);
    }
    ep_ = nullptr;
  }

 private:
  ucs_status_t Create(const std::string& remote_address,
                      ucp_err_handling_mode_t mode) {
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = reinterpret_cast<const ucp_address_t*>(remote_address.data());
    ep.err_mode = mode;
    if (mode == UCP_ERR_HANDLING_MODE_PEER) {
      ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t) {
        static_cast<Endpoint*>(arg)->failed_.store(true);
      };
      ep.err_handler.arg = this;
    }
    return ucp_ep_create(worker_.get(), &ep, &ep_);
  }

  Worker& worker_;
  ucp_ep_h ep_ = nullptr;
  bool peer_errors_ = false;
  std::atomic<bool> failed_{false};
};

// The bytes of one read, sent by the holder as active messages (ucx_reply.h,
// "piece"): piece i is bytes [i x piece_bytes, ...) of the lease's range,
// sent from the served memory itself with ucp_am_send_nbx. UCX copies a
// small piece out at once (eager; every piece with `eager_only`) and lets
// the reader pull a large one (rendezvous), reading the served memory
// until the send completes; so
// the lease must outlive every send (the caller closes the endpoint, which
// cancels what is left, before the lease ends). At most kSendWindow pieces
// are in flight at once. Serving thread only.
class PieceSends {
 public:
  static constexpr size_t kSendWindow = 8;

  PieceSends(ucp_ep_h ep, bool eager_only, std::span<const iovec> source,
             const ucx::Grant& grant, uint64_t length)
      : ep_(ep),
        eager_only_(eager_only),
        source_(source),
        grant_(grant),
        length_(length),
        count_(ucx::PieceCount(grant.piece_bytes, length)) {}
  ~PieceSends() {
    for (Slot& s : slots_) {
      if (s.request != nullptr) ucp_request_free(s.request);
    }
  }
  PieceSends(const PieceSends&) = delete;
  PieceSends& operator=(const PieceSends&) = delete;

  // Collects the sends that completed and issues the next pieces into the
  // free slots. An error once a send failed.
  Status Pump() {
    for (Slot& s : slots_) {
      if (s.request == nullptr) continue;
      const ucs_status_t st = ucp_request_check_status(s.request);
      if (st == UCS_INPROGRESS) continue;
      ucp_request_free(s.request);
      s.request = nullptr;
      --in_flight_;
      if (st != UCS_OK) return UcsError(st, "sending a piece to the reader");
    }
    for (Slot& s : slots_) {
      if (next_ == count_) break;
      if (s.request != nullptr) continue;
      TH_RETURN_IF_ERROR(Issue(s, next_++));
    }
    return Status::Ok();
  }

  bool done() const { return next_ == count_ && in_flight_ == 0; }

  // Whether Pump() has work: a send in flight completed, or a slot is free
  // for a piece not issued yet (sends UCX completed at once leave one).
  bool Ready() const {
    if (next_ < count_ && in_flight_ < kSendWindow) return true;
    return AnyComplete();
  }

  // Whether a send in flight has completed (Pump has work).
  bool AnyComplete() const {
    for (const Slot& s : slots_) {
      if (s.request != nullptr &&
          ucp_request_check_status(s.request) != UCS_INPROGRESS) {
        return true;
      }
    }
    return false;
  }

 private:
  struct Slot {
    std::string header;  // UCX reads it until the send completes
    std::vector<ucp_dt_iov_t> iov;
    void* request = nullptr;
  };

  Status Issue(Slot& s, uint64_t index) {
    ucx::PieceHeader h{grant_.read_id, index * grant_.piece_bytes};
    const uint64_t len = std::min(grant_.piece_bytes, length_ - h.offset);
    // A test's hostile holder changes what the header says here.
    testpoint::Hit("ucx.piece_sending", reinterpret_cast<uint64_t>(&h));
    s.header = ucx::EncodePieceHeader(h);
    s.iov.clear();
    TH_RETURN_IF_ERROR(ForRange(source_, index * grant_.piece_bytes, len,
                                [&](uint8_t* p, uint64_t l, uint64_t) {
                                  s.iov.push_back({p, l});
                                  return Status::Ok();
                                }));
    ucp_request_param_t param{};
    if (eager_only_) {
      param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_AM_SEND_FLAG_EAGER;
    }
    const void* buffer = s.iov.front().buffer;
    size_t count = s.iov.front().length;
    if (s.iov.size() > 1) {
      param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
      param.datatype = ucp_dt_make_iov();
      buffer = s.iov.data();
      count = s.iov.size();
    }
    ucs_status_ptr_t r =
        ucp_am_send_nbx(ep_, ucx::kPieceAmId, s.header.data(), s.header.size(),
                        buffer, count, &param);
    if (UCS_PTR_IS_ERR(r)) {
      return UcsError(UCS_PTR_STATUS(r), "sending a piece to the reader");
    }
    if (r != nullptr) {
      s.request = r;
      ++in_flight_;
    }
    return Status::Ok();
  }

  const ucp_ep_h ep_;
  const bool eager_only_;
  const std::span<const iovec> source_;
  const ucx::Grant grant_;
  const uint64_t length_;
  const uint64_t count_;
  uint64_t next_ = 0;  // the next piece to issue
  size_t in_flight_ = 0;
  std::array<Slot, kSendWindow> slots_;
};

// Each connection has its own UCX worker, made when the connection is
// accepted, progressed only by the thread that serves the connection, and
// destroyed when the connection ends. The worker has no handler a reader's
// message could reach beyond UCX's own connection set-up: no context of
// this transport asks UCX for RMA (its gets and puts), and the holder's
// worker installs no active-message handler. The holder connects an
// endpoint of its worker to the reader's (whose address the reader sends
// after the hello) and sends each read's bytes on it; a read whose sends
// do not complete (the reader went silent past local_release_timeout_ms,
// or closed the connection) has that endpoint closed, which cancels them,
// before its lease ends: no byte of memory the owner may by then have
// unmapped or reused is read afterwards (docs/design.md, UCX data plane).
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
    // Shuts every connection down and joins its thread, which closes the
    // connection's endpoint before its lease ends.
    acceptor_.Stop();
  }

 private:
  // The most bytes one active message carries.
  static constexpr uint64_t kPieceBytes = 1 << 20;
  static_assert(kPieceBytes >= ucx::kMinPieceBytes &&
                kPieceBytes <= ucx::kMaxPieceBytes);

  // Serves one connection until the peer leaves, an I/O error, or Stop().
  // As in the TCP server, one request's whole life stays in one loop body:
  // the lease visibly ends at its bottom, after the reader released it, or
  // after the endpoint its bytes went out on was closed.
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
    // connection.
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
    // The reader's worker, which its reads' bytes go to.
    Endpoint to_reader(*worker);
    if (Status s = ConnectToReader(fd, ticket, to_reader); !s.ok()) {
      acceptor_.refusals().Refused(ticket.peer(),
                                   "dropped a reader: " + s.ToString());
      return;
    }
    uint64_t reads = 0;
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
      const ucx::Grant grant{++reads, kPieceBytes};
      if (!ServeAm(fd, *worker, to_reader, req, *lease, grant, deadline)) {
        // Shut down before the lease ends: a reader still reading sees the
        // connection gone when it finishes, and discards the bytes. And
        // the endpoint goes first: none of its sends reads the served
        // memory once the lease may let it be reused.
        ::shutdown(fd, SHUT_RDWR);
        to_reader.Close();
        return;
      }
      // The lease ends here, after the release: every piece was sent and
      // the reader took them.
    }
  }

  // Reads the reader's worker address (it comes right after the hello)
  // and connects `ep` to it.
  Status ConnectToReader(int fd, Acceptor::Ticket& ticket, Endpoint& ep) {
    const Deadline by = Deadline::AfterMs(options_.io_stall_timeout_ms);
    uint8_t prefix[4];
    TH_RETURN_IF_ERROR(ReadExact(fd, prefix, sizeof(prefix), by));
    TH_ASSIGN_OR_RETURN(uint32_t len,
                        ucx::DecodeAddressLength(prefix, sizeof(prefix)));
    std::string address(len, '\0');
    TH_RETURN_IF_ERROR(ReadExact(fd, address.data(), len, by));
    return ep.Open(address, "reader " + ticket.peer());
  }

  // Admits the read to the reader (the grant), sends its bytes and waits
  // (bounded) for the reader's release. False: drop the connection.
  bool ServeAm(int fd, Worker& worker, Endpoint& ep,
               const wire::ReadRequest& req, const ServeLease& lease,
               const ucx::Grant& grant, const Deadline& deadline) {
    const std::string body = ucx::EncodeGrant(grant);
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
    const Deadline release_by =
        Deadline::AfterMs(options_.local_release_timeout_ms);
    // Rendezvous only where the endpoint hears of a dead reader: elsewhere
    // (shared memory) UCX 1.13 moves a rendezvous by cross-memory attach
    // and aborts the process whose copy fails because the other died
    // (docs/design.md, "Tried and not kept"); eager pieces are copied
    // through UCX's own buffers.
    PieceSends sends(ep.get(), !ep.peer_errors(), lease.pieces, grant,
                     req.length);
    // Anything from the reader before its bytes are all sent means it
    // left (or broke the protocol): its release comes after the last byte.
    Status s = Status::Ok();
    for (;;) {
      s = sends.Pump();
      if (!s.ok() || sends.done()) break;
      if (Readable(fd) || ep.failed()) {
        s = Unavailable("the reader left mid-read");
        break;
      }
      s = worker.Wait(
          [&] { return Readable(fd) || ep.failed() || sends.Ready(); },
          release_by, nullptr, fd, Polling::kAlways);
      if (!s.ok()) break;
    }
    if (s.ok()) {
      s = worker.Wait([fd] { return Readable(fd); }, release_by, nullptr, fd);
    }
    uint8_t release[wire::kReleaseBytes];
    if (s.ok()) s = ReadExact(fd, release, sizeof(release), release_by);
    if (!s.ok()) {
      if (s.code() == StatusCode::kDeadlineExceeded) {
        TH_LOG(WARN) << "ucx data server " << address_
                     << ": a reader did not release its lease within "
                     << options_.local_release_timeout_ms << " ms; dropping it";
      }
      // Cancels the sends still in flight before `sends` frees them.
      ep.Close();
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

  // Installs the handler of the holder's pieces, connects the endpoint to
  // the holder's worker (which tells this worker when the holder died) and
  // sends the holder this worker's address, which the holder sends the
  // bytes of each read to.
  Status Open(const std::string& remote_address, const Deadline& deadline) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                    UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = ucx::kPieceAmId;
    hp.cb = &UcxConnection::OnPiece;
    hp.arg = this;
    ucs_status_t s = ucp_worker_set_am_recv_handler(worker_->get(), &hp);
    if (s != UCS_OK) return UcsError(s, "installing the UCX piece handler");
    ep_ = std::make_unique<Endpoint>(*worker_);
    TH_RETURN_IF_ERROR(ep_->Open(remote_address, "holder " + peer_));
    TH_ASSIGN_OR_RETURN(std::string mine, worker_->Address());
    if (mine.empty() || mine.size() > ucx::kMaxWorkerAddressBytes) {
      return ResourceExhausted("UCX worker address of " +
                               std::to_string(mine.size()) + " bytes");
    }
    std::string message = ucx::EncodeAddress(mine);
    iovec v{message.data(), message.size()};
    return WriteAll(fd_.get(), {&v, 1}, deadline)
        .WithContext("holder " + peer_);
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
  enum class PieceState : uint8_t { kMissing, kQueued, kLanding, kLanded };

  // A piece accepted for a device read, waiting for its turn in a staging
  // buffer: UCX's rendezvous descriptor, UCX's data kept past the handler,
  // or a copy of data UCX would not keep.
  struct Queued {
    void* data = nullptr;  // UCX's (rendezvous or kept), else null
    bool rndv = false;
    std::string copy;  // the bytes, where data is null
  };

  // The read in flight: what the piece handler checks each piece against,
  // and where the pieces stand.
  struct InFlight {
    ucx::Grant grant;
    uint64_t length = 0;
    std::span<const iovec> dest;
    bool device = false;
    std::vector<PieceState> state;  // by piece index
    std::vector<void*> landing;     // a receive in flight, by piece index
    std::vector<std::vector<ucp_dt_iov_t>> iov;  // what it receives into
    std::map<uint64_t, Queued> queued;           // device reads
    uint64_t landed = 0;  // pieces [0, landed) are in and hashed
  };

  static ucs_status_t OnPiece(void* arg, const void* header,
                              size_t header_length, void* data, size_t length,
                              const ucp_am_recv_param_t* param) {
    return static_cast<UcxConnection*>(arg)->Piece(header, header_length, data,
                                                   length, param);
  }

  // Runs inside ucp_worker_progress on the reading thread. Takes a piece
  // only if it is one the read in flight asked for and has not had yet,
  // so that a holder can write nothing outside the destination (and
  // nothing twice); anything else fails the read (bad_piece_).
  ucs_status_t Piece(const void* header, size_t header_length, void* data,
                     size_t length, const ucp_am_recv_param_t* param) {
    const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    const bool kept = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0;
    auto refuse = [&](Status why) {
      if (bad_piece_.ok()) {
        bad_piece_ =
            DataLoss("holder " + peer_ +
                     " sent a piece it was not asked for: " + why.message());
      }
      // A refused rendezvous completes the holder's send with an error.
      return rndv ? UCS_ERR_REJECTED : UCS_OK;
    };
    if (read_ == nullptr) return refuse(DataLoss("no read in flight"));
    Result<ucx::PieceHeader> h = ucx::DecodePieceHeader(
        static_cast<const uint8_t*>(header), header_length);
    if (!h.ok()) return refuse(h.status());
    InFlight& r = *read_;
    Result<uint64_t> index = ucx::PieceIndex(r.grant, r.length, *h, length);
    if (!index.ok()) return refuse(index.status());
    const uint64_t i = *index;
    if (r.state[i] != PieceState::kMissing) {
      return refuse(DataLoss("a second copy of the piece at offset " +
                             std::to_string(h->offset)));
    }
    if (r.device) {
      // Staged in index order by Advance(), in pinned buffers.
      Queued q;
      q.rndv = rndv;
      if (rndv || kept) {
        q.data = data;
      } else {
        q.copy.assign(static_cast<const char*>(data), length);
      }
      r.queued.emplace(i, std::move(q));
      r.state[i] = PieceState::kQueued;
      return (rndv || kept) ? UCS_INPROGRESS : UCS_OK;
    }
    if (!rndv) {
      const auto* from = static_cast<const uint8_t*>(data);
      Status copied = ForRange(r.dest, h->offset, length,
                               [&](uint8_t* p, uint64_t l, uint64_t done) {
                                 std::memcpy(p, from + done, l);
                                 return Status::Ok();
                               });
      if (!copied.ok()) return refuse(copied);
      r.state[i] = PieceState::kLanded;
      return UCS_OK;
    }
    // Rendezvous: UCX moves the piece straight into the destination.
    std::vector<ucp_dt_iov_t>& iov = r.iov[i];
    Status sliced = ForRange(r.dest, h->offset, length,
                             [&](uint8_t* p, uint64_t l, uint64_t) {
                               iov.push_back({p, l});
                               return Status::Ok();
                             });
    if (!sliced.ok()) return refuse(sliced);
    Receive(i, data, iov);
    return UCS_INPROGRESS;
  }

  // Receives rendezvous piece `i` into `iov` (one buffer or several).
  void Receive(uint64_t i, void* desc, const std::vector<ucp_dt_iov_t>& iov) {
    ucp_request_param_t p{};
    void* buffer = iov.front().buffer;
    size_t count = iov.front().length;
    if (iov.size() > 1) {
      p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
      p.datatype = ucp_dt_make_iov();
      buffer = const_cast<ucp_dt_iov_t*>(iov.data());
      count = iov.size();
    }
    ucs_status_ptr_t rq =
        ucp_am_recv_data_nbx(worker_->get(), desc, buffer, count, &p);
    if (UCS_PTR_IS_ERR(rq)) {
      if (receive_failed_.ok()) {
        receive_failed_ =
            UcsError(UCS_PTR_STATUS(rq), "UCX receive from holder " + peer_);
      }
      return;
    }
    if (rq == nullptr) {
      read_->state[i] = PieceState::kLanded;
      return;
    }
    read_->landing[i] = rq;
    read_->state[i] = PieceState::kLanding;
  }

  // Collects the receives that completed, stages the next piece of a
  // device read, and hashes the pieces landed in order. True once the read
  // is complete or cannot complete (a bad piece, a failed receive, the
  // holder's TCP side closed).
  bool Advance(ChunkHash* hash) {
    InFlight& r = *read_;
    if (!bad_piece_.ok() || !receive_failed_.ok()) return true;
    for (uint64_t i = r.landed; i < r.state.size(); ++i) {
      if (r.state[i] != PieceState::kLanding) continue;
      const ucs_status_t st = ucp_request_check_status(r.landing[i]);
      if (st == UCS_INPROGRESS) continue;
      ucp_request_free(r.landing[i]);
      r.landing[i] = nullptr;
      if (st != UCS_OK) {
        receive_failed_ = UcsError(st, "UCX receive from holder " + peer_);
        return true;
      }
      r.state[i] = PieceState::kLanded;
    }
    if (r.device) {
      if (Status s = StageNext(hash); !s.ok()) {
        receive_failed_ = s;
        return true;
      }
    } else {
      while (r.landed < r.state.size() &&
             r.state[r.landed] == PieceState::kLanded) {
        if (hash != nullptr) {
          const uint64_t off = r.landed * r.grant.piece_bytes;
          (void)ForRange(r.dest, off,
                         std::min(r.grant.piece_bytes, r.length - off),
                         [&](uint8_t* p, uint64_t l, uint64_t) {
                           hash->Update(p, l);
                           return Status::Ok();
                         });
        }
        ++r.landed;
      }
    }
    return r.landed == r.state.size() || holder_left_ ||
           (holder_left_ = Readable(fd_.get()) || ep_->failed());
  }

  // Device destination: the next piece in order goes through one of two
  // pinned buffers (a rendezvous piece received there), is hashed there,
  // and copied to the device while the next one comes into the other.
  Status StageNext(ChunkHash* hash) {
    InFlight& r = *read_;
    while (r.landed < r.state.size()) {
      const uint64_t k = r.landed;
      uint8_t* buf = bufs_.buffer(k % 2);
      const uint64_t off = k * r.grant.piece_bytes;
      const uint64_t len = std::min(r.grant.piece_bytes, r.length - off);
      if (r.state[k] == PieceState::kQueued) {
        // The copy out of this buffer two pieces ago must be done.
        TH_RETURN_IF_ERROR(streams_[k % 2]->Synchronize());
        Queued q = std::move(r.queued[k]);
        r.queued.erase(k);
        if (q.rndv) {
          r.iov[k] = {{buf, len}};
          Receive(k, q.data, r.iov[k]);
          TH_RETURN_IF_ERROR(receive_failed_);
        } else {
          std::memcpy(buf, q.data != nullptr ? q.data : q.copy.data(), len);
          if (q.data != nullptr) ucp_am_data_release(worker_->get(), q.data);
          r.state[k] = PieceState::kLanded;
        }
      }
      if (r.state[k] != PieceState::kLanded) return Status::Ok();
      if (hash != nullptr) hash->Update(buf, len);
      TH_RETURN_IF_ERROR(ForRange(
          r.dest, off, len, [&](uint8_t* p, uint64_t l, uint64_t done) {
            return streams_[k % 2]->CopyAsync(p, buf + done, l);
          }));
      ++r.landed;
    }
    for (auto& s : streams_) TH_RETURN_IF_ERROR(s->Synchronize());
    return Status::Ok();
  }

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
    if (!bad_piece_.ok()) {
      // A piece came between reads: the holder does not keep to the
      // protocol.
      Abandon();
      return bad_piece_;
    }
    if (device >= 0) {
      // Taken before asking, so that a busy pool refuses this read without
      // holding the holder's lease.
      TH_ASSIGN_OR_RETURN(bufs_, cuda::StagingPool().Acquire(2, deadline));
    }
    std::string frame = wire::EncodeReadRequest(req, nullptr, false);
    iovec out{frame.data(), frame.size()};
    TH_RETURN_IF_ERROR(WriteAll(fd_.get(), {&out, 1}, deadline)
                           .WithContext("holder " + peer_));
    TH_ASSIGN_OR_RETURN(ucx::Grant grant, ReceiveGrant(deadline));
    InFlight r;
    r.grant = grant;
    r.length = req.length;
    r.dest = dest;
    r.device = device >= 0;
    const uint64_t count = ucx::PieceCount(grant.piece_bytes, req.length);
    r.state.assign(count, PieceState::kMissing);
    r.landing.assign(count, nullptr);
    r.iov.resize(count);
    ChunkHash hash(ChecksumKind(sum), /*timed=*/true);
    receive_failed_ = Status::Ok();
    read_ = &r;
    holder_left_ = false;
    testpoint::Hit("ucx.read_granted", count);
    Status waited =
        worker_->Wait([&] { return Advance(sum != nullptr ? &hash : nullptr); },
                      deadline, &cancelled_, fd_.get());
    Status failed = !bad_piece_.ok()        ? bad_piece_
                    : !receive_failed_.ok() ? receive_failed_
                    : !waited.ok() ? waited.WithContext("holder " + peer_)
                    : r.landed != count
                        ? Unavailable("holder " + peer_ +
                                      " ended the lease before the read "
                                      "finished")
                        : Status::Ok();
    if (!failed.ok()) {
      // Abandon() while read_ still names the read: its receives in flight
      // (into the destination) end before this returns.
      Abandon();
      EndRead();
      return failed;
    }
    EndRead();
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

  // Forgets the read in flight: later pieces are refused. Frees what is
  // left of it (only after a failure, with the worker gone or about to go).
  void EndRead() {
    if (read_ == nullptr) return;
    for (void*& rq : read_->landing) {
      if (rq != nullptr) ucp_request_free(rq);  // UCX frees it when done
      rq = nullptr;
    }
    for (auto& [i, q] : read_->queued) {
      if (q.data != nullptr && worker_) {
        ucp_am_data_release(worker_->get(), q.data);
      }
    }
    read_ = nullptr;
    bufs_ = cuda::PinnedPool::Lease();
  }

  // The holder's answer: its refusal as a status, or its grant.
  Result<ucx::Grant> ReceiveGrant(const Deadline& deadline) {
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
    if (h->local || h->cuda_ipc || h->payload_len != ucx::kGrantBytes) {
      Abandon();
      return DataLoss("holder " + peer_ + " sent a reply UCX does not expect");
    }
    uint8_t body[ucx::kGrantBytes];
    TH_RETURN_IF_ERROR(ReadExact(fd_.get(), body, sizeof(body), deadline)
                           .WithContext("holder " + peer_));
    Result<ucx::Grant> grant = ucx::DecodeGrant(body, sizeof(body));
    if (!grant.ok()) {
      Abandon();  // closing the connection ends the holder's lease
      return DataLoss("holder " + peer_ +
                      " sent a bad UCX grant: " + grant.status().message());
    }
    return grant;
  }

  bool PeerClosed() {
    pollfd p{fd_.get(), POLLIN | POLLRDHUP, 0};
    return ::poll(&p, 1, 0) != 0;
  }

  // Breaks the connection for good: closes the TCP stream (which ends the
  // holder's lease, and makes the holder close its endpoint, cancelling
  // its sends) and then this side's endpoint and worker, after which
  // nothing of the holder's lands in a destination.
  void Abandon() {
    broken_ = true;
    {
      MutexLock l(mu_);
      fd_.Reset();
    }
    Linger();
    Teardown();
  }

  // Called with the TCP connection just closed, while the read's receives
  // may still be in flight: keeps the worker progressing until none is
  // left (each completed or failed), or the holder dropped its worker (our
  // endpoint to it failed: the holder drops it once it sees the closed
  // connection), or linger_ms_ passed, so that the holder's sends in flight
  // end in an answer rather than in an error against a worker that
  // vanished under them. Bytes of the failed read may still land in its
  // destination meanwhile: its Read has not returned. Only on endpoints
  // that report a dead peer (tcp): elsewhere nothing would end it early.
  void Linger() {
    if (!worker_ || read_ == nullptr || ep_ == nullptr || !ep_->peer_errors() ||
        ep_->failed()) {
      return;
    }
    auto outstanding = [&] {
      return std::any_of(read_->landing.begin(), read_->landing.end(),
                         [](void* r) {
                           return r != nullptr &&
                                  ucp_request_check_status(r) == UCS_INPROGRESS;
                         });
    };
    if (!outstanding()) return;
    testpoint::Hit("ucx.reader_lingers", read_->landing.size());
    (void)worker_->Wait([&] { return ep_->failed() || !outstanding(); },
                        Deadline::AfterMs(linger_ms_), nullptr);
  }

  // Force-closes the endpoint, frees what the read left, and destroys the
  // worker. Reading thread only.
  void Teardown() {
    if (!worker_) return;
    if (ep_ != nullptr) ep_->Close();
    ep_.reset();
    EndRead();
    std::unique_ptr<Worker> w;
    {
      MutexLock l(mu_);
      w = std::move(worker_);
    }
    w.reset();  // destroys the worker: its transports stop moving bytes
  }

  // fd_ and worker_ are replaced only by the reading thread, under mu_;
  // Cancel uses them under mu_ from another thread.
  Mutex mu_;
  Fd fd_;
  std::atomic<bool> cancelled_{false};
  const std::string peer_;
  std::unique_ptr<Worker> worker_;
  const int64_t linger_ms_;  // bounds Linger()
  // The reading thread's:
  std::unique_ptr<Endpoint> ep_;  // to the holder's worker; before worker_
  InFlight* read_ = nullptr;      // the read in flight, or null
  Status bad_piece_;              // the first piece refused, ever
  Status receive_failed_;         // of the read in flight
  bool holder_left_ = false;      // of the read in flight
  cuda::PinnedPool::Lease bufs_;  // the device read's staging buffers
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
    TH_RETURN_IF_ERROR(c->Open(remote, deadline));
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
        << "ucx: wires on which no hardware checks a peer allowed ("
        << ucx::kEmulatedGetsEnv
        << "=allow or ClientOptions::ucx_emulated_gets):" << list
        << ": a peer that proved the secret and modifies its UCX can write "
           "into this process's memory over tcp (docs/security.md, \"What "
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

uint64_t UcxContextFeaturesForTest() { return kContextFeatures; }

}  // namespace tensorhub::transport
