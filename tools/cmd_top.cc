// `tensorhub top`: a live view of the hub (models, versions and holders,
// fetches in flight with their sources and rates, the slowest holders),
// redrawn in place every --interval; plain lines, one snapshot per interval,
// when stdout is not a terminal (or with --once, a single one).
//
// The terminal is driven with a few ANSI/VT100 sequences (alternate screen,
// cursor home, erase line): docs/design.md, "tensorhub top", says why not
// ncurses. The view itself is RenderTop (top_view.h), a pure function.
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <string>

#include "cli_util.h"
#include "top_view.h"

namespace tensorhub::cli {
namespace {

struct TopFlags {
  WorkerFlags worker;
  double interval_s = 1.0;
  bool once = false;
  uint64_t timeout_ms = 5000;
  size_t width = 160;  // plain output
  SnapshotLimits limits;
};

volatile std::sig_atomic_t g_stop = 0;
volatile std::sig_atomic_t g_resized = 0;

void OnStop(int) { g_stop = 1; }
void OnResize(int) { g_resized = 1; }

// SIGINT, SIGTERM and SIGWINCH are blocked in every thread (gRPC's included,
// which start later and inherit the mask) and delivered only inside ppoll,
// so that they always interrupt the main thread's wait.
sigset_t HandleSignals() {
  struct sigaction sa {};
  sa.sa_handler = OnStop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sa.sa_handler = OnResize;
  sigaction(SIGWINCH, &sa, nullptr);
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGWINCH);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  sigdelset(&old, SIGINT);
  sigdelset(&old, SIGTERM);
  sigdelset(&old, SIGWINCH);
  return old;  // the mask to wait with
}

// Waits up to `ms` for input on `fd` (-1: none) or a signal. Returns the
// byte read, or -1.
int WaitKey(int fd, int64_t ms, const sigset_t& wait_mask) {
  struct pollfd p {};
  p.fd = fd;
  p.events = POLLIN;
  struct timespec ts {};
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = (ms % 1000) * 1000000;
  const int n = ppoll(&p, fd >= 0 ? 1 : 0, &ts, &wait_mask);
  if (n <= 0 || fd < 0 || (p.revents & POLLIN) == 0) return -1;
  unsigned char c = 0;
  if (read(fd, &c, 1) != 1) return -1;
  return c;
}

std::string Title(const TopFlags& f) {
  char when[32];
  const std::time_t now = std::time(nullptr);
  struct tm tm {};
  gmtime_r(&now, &tm);
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return "tensorhub top  hub " + f.worker.options.hub_address + "  " + when;
}

// The terminal in the live view's mode (no echo, keys one at a time,
// alternate screen, cursor hidden), restored when this goes away.
class LiveTerminal {
 public:
  LiveTerminal() {
    if (isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved_) == 0) {
      struct termios raw = saved_;
      raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);  // ISIG kept
      raw.c_cc[VMIN] = 1;
      raw.c_cc[VTIME] = 0;
      restore_ = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
    }
    Write("\x1b[?1049h\x1b[?25l");
  }
  ~LiveTerminal() {
    Write("\x1b[?25h\x1b[?1049l");
    if (restore_) tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }
  LiveTerminal(const LiveTerminal&) = delete;
  LiveTerminal& operator=(const LiveTerminal&) = delete;

  int key_fd() const { return restore_ ? STDIN_FILENO : -1; }

  static void Size(size_t* cols, size_t* rows) {
    struct winsize ws {};
    *cols = 80;
    *rows = 24;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
      *cols = ws.ws_col;
      *rows = ws.ws_row;
    }
  }

  // Redraws from the top left: each line erased to its end, then the rest
  // of the screen; one write, so the view does not flicker.
  static void Draw(const std::vector<std::string>& lines) {
    std::string out = "\x1b[H";
    for (size_t i = 0; i < lines.size(); ++i) {
      out += lines[i] + "\x1b[K";
      if (i + 1 < lines.size()) out += "\r\n";
    }
    out += "\x1b[J";
    Write(out);
  }

 private:
  static void Write(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = write(STDOUT_FILENO, s.data() + off, s.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
  }

  struct termios saved_ {};
  bool restore_ = false;
};

// The snapshot as lines, or the error in its place (the view goes on).
std::vector<std::string> Frame(HubWatcher& hub, const TopFlags& f, size_t width,
                               size_t rows) {
  Result<HubSnapshot> s = hub.Snapshot(f.limits);
  if (!s.ok()) {
    return RenderTop(HubSnapshot{},
                     Title(f) + "  (hub: " + s.status().ToString() + ")", width,
                     rows);
  }
  return RenderTop(*s, Title(f), width, rows);
}

int RunLive(HubWatcher& hub, const TopFlags& f, const sigset_t& wait_mask) {
  LiveTerminal term;
  const int64_t interval_ms = std::llround(f.interval_s * 1000);
  while (g_stop == 0) {
    size_t cols = 0, rows = 0;
    LiveTerminal::Size(&cols, &rows);
    LiveTerminal::Draw(Frame(hub, f, cols, rows));
    const auto next = std::chrono::steady_clock::now() +
                      std::chrono::milliseconds(interval_ms);
    g_resized = 0;
    while (g_stop == 0 && g_resized == 0) {
      const int64_t left =
          std::chrono::duration_cast<std::chrono::milliseconds>(
              next - std::chrono::steady_clock::now())
              .count();
      if (left <= 0) break;
      const int key = WaitKey(term.key_fd(), left, wait_mask);
      if (key == 'q' || key == 'Q') return 0;
    }
  }
  return 0;
}

int RunPlain(HubWatcher& hub, const TopFlags& f, const sigset_t& wait_mask) {
  const int64_t interval_ms = std::llround(f.interval_s * 1000);
  for (bool first = true; g_stop == 0; first = false) {
    Result<HubSnapshot> s = hub.Snapshot(f.limits);
    if (!s.ok() && f.once) return Fail(s.status());
    if (!first) std::printf("\n");
    const std::vector<std::string> lines =
        s.ok() ? RenderTop(*s, Title(f), f.width)
               : std::vector<std::string>{
                     Title(f) + "  (hub: " + s.status().ToString() + ")"};
    for (const std::string& l : lines) std::printf("%s\n", l.c_str());
    std::fflush(stdout);
    if (f.once) return 0;
    const auto next = std::chrono::steady_clock::now() +
                      std::chrono::milliseconds(interval_ms);
    while (g_stop == 0) {
      const int64_t left =
          std::chrono::duration_cast<std::chrono::milliseconds>(
              next - std::chrono::steady_clock::now())
              .count();
      if (left <= 0) break;
      WaitKey(-1, left, wait_mask);
    }
  }
  return 0;
}

int RunTop(const TopFlags& f) {
  Result<ClientOptions> o = ClientOptionsFrom(f.worker);
  if (!o.ok()) return Fail(o.status());
  o->rpc_timeout_ms = static_cast<int64_t>(f.timeout_ms);
  const sigset_t wait_mask = HandleSignals();
  Result<std::unique_ptr<HubWatcher>> hub = HubWatcher::Connect(*o);
  if (!hub.ok()) return Fail(hub.status());
  if (!f.once && isatty(STDOUT_FILENO)) return RunLive(**hub, f, wait_mask);
  return RunPlain(**hub, f, wait_mask);
}

}  // namespace

void AddTopCommand(CommandLine& cl) {
  auto f = std::make_shared<TopFlags>();
  CLI::App* c = cl.Add(
      "top",
      "a live view of the hub: versions and holders, fetches in flight with "
      "their sources and rates, the slowest holders (q or Ctrl-C quits)",
      [f] { return RunTop(*f); });
  c->add_option("--interval", f->interval_s, "seconds between refreshes")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  c->add_flag("--once", f->once,
              "print one snapshot as plain lines and exit (also the output "
              "format, one snapshot per interval, when stdout is not a "
              "terminal)");
  c->add_option("--timeout-ms", f->timeout_ms, "deadline of each hub call")
      ->check(CLI::Range(uint64_t{1}, uint64_t{600000}))
      ->capture_default_str();
  c->add_option("--width", f->width,
                "columns of the plain output (a terminal's own width is used "
                "live)")
      ->check(CLI::Range(size_t{40}, size_t{100000}))
      ->capture_default_str();
  c->add_option("--transfers", f->limits.transfers,
                "fetches in flight listed at most")
      ->check(CLI::Range(1u, kMaxSnapshotTransfers))
      ->capture_default_str();
  c->add_option("--versions", f->limits.versions_per_model,
                "versions listed per model at most (the newest)")
      ->check(CLI::Range(1u, kMaxSnapshotVersions))
      ->capture_default_str();
  AddHubFlags(c, &f->worker);
}

}  // namespace tensorhub::cli
