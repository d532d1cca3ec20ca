#include "subprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <thread>
#include <utility>

extern char** environ;

namespace tensorhub::cli {

Result<Subprocess> Subprocess::Spawn(const std::vector<std::string>& args,
                                     const std::vector<std::string>& env,
                                     const std::vector<std::string>& wrapper) {
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return Internal("cannot find this binary's path");
  self[n] = '\0';
  int in_pipe[2], out_pipe[2];
  if (::pipe2(in_pipe, O_CLOEXEC) != 0) return Internal("pipe failed");
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    ::close(in_pipe[0]);
    ::close(in_pipe[1]);
    return Internal("pipe failed");
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in_pipe[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&fa, out_pipe[1], STDOUT_FILENO);
  // The children must not inherit a blocked SIGTERM from the parent.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  std::vector<std::string> argv_s = wrapper;
  argv_s.push_back(self);
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  // `env` replaces what this process has under the same names (getenv
  // would find the first of two).
  auto name_of = [](std::string_view kv) { return kv.substr(0, kv.find('=')); };
  std::vector<std::string> env_s;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view name = name_of(*e);
    if (std::none_of(env.begin(), env.end(), [&](const std::string& kv) {
          return name_of(kv) == name;
        })) {
      env_s.push_back(*e);
    }
  }
  env_s.insert(env_s.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (std::string& s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  int rc = wrapper.empty()
               ? posix_spawn(&pid, self, &fa, &attr, argv.data(), envp.data())
               : posix_spawnp(&pid, wrapper[0].c_str(), &fa, &attr, argv.data(),
                              envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(in_pipe[0]);
  ::close(out_pipe[1]);
  if (rc != 0) {
    ::close(in_pipe[1]);
    ::close(out_pipe[0]);
    return Internal(std::string("spawn failed: ") + std::strerror(rc));
  }
  Subprocess p;
  p.pid_ = pid;
  p.in_fd_ = in_pipe[1];
  p.out_fd_ = out_pipe[0];
  return p;
}

Subprocess::Subprocess(Subprocess&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)),
      in_fd_(std::exchange(o.in_fd_, -1)),
      out_fd_(std::exchange(o.out_fd_, -1)),
      buffer_(std::move(o.buffer_)),
      reaped_(o.reaped_),
      wait_status_(o.wait_status_) {}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    if (!Reap(Deadline::AfterMs(kReapWaitMs))) {
      std::fprintf(stderr,
                   "child %d did not go within %lld ms of SIGKILL (stuck in "
                   "the kernel?); left unreaped\n",
                   static_cast<int>(pid_), static_cast<long long>(kReapWaitMs));
    }
  }
  if (in_fd_ >= 0) ::close(in_fd_);
  if (out_fd_ >= 0) ::close(out_fd_);
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) {
    return "exited with code " + std::to_string(WEXITSTATUS(status));
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = ::strsignal(sig);
    return "killed by signal " + std::to_string(sig) + " (" +
           (name != nullptr ? name : "?") + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

bool Subprocess::Reap(const Deadline& deadline) {
  if (reaped_) return true;
  if (pid_ <= 0) return false;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) {
      reaped_ = true;
      // ECHILD: someone else reaped it (a SIGCHLD handler, another
      // waitpid): it ended, how is not known.
      wait_status_ = r == pid_ ? std::optional<int>(status) : std::nullopt;
      return true;
    }
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string Subprocess::HowItEnded(int64_t wait_ms) {
  if (!Reap(Deadline::AfterMs(wait_ms))) return "still running";
  if (!wait_status_.has_value()) {
    return "ended; how is not known (it was reaped elsewhere)";
  }
  return DescribeWaitStatus(*wait_status_);
}

void Subprocess::CloseInput() {
  if (in_fd_ >= 0) ::close(in_fd_);
  in_fd_ = -1;
}

Status Subprocess::Send(const std::string& line) {
  const std::string gone = "child " + std::to_string(pid_) + " is gone";
  if (in_fd_ < 0) return Unavailable(gone + " (its stdin is closed)");
  // A write to a pipe whose reader exited raises SIGPIPE, which would end
  // this process (a test binary) on the spot: no test result, and its other
  // children left running. Blocked for this write, and taken back if this
  // write raised it, so that the write fails with EPIPE instead.
  sigset_t pipe_only, old, pending;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  sigemptyset(&pending);
  (void)sigpending(&pending);
  const bool was_pending = sigismember(&pending, SIGPIPE) == 1;
  pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
  std::string s = line + "\n";
  size_t off = 0;
  int error = 0;
  while (off < s.size()) {
    ssize_t n = ::write(in_fd_, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = n < 0 ? errno : EIO;
      break;
    }
    off += static_cast<size_t>(n);
  }
  if (error == EPIPE && !was_pending) {
    const timespec zero{0, 0};
    (void)sigtimedwait(&pipe_only, nullptr, &zero);
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (error != 0) {
    // Its stdin closes as it exits: give the exit a moment to land.
    return Unavailable(gone + " (" + HowItEnded(1000) + ")");
  }
  return Status::Ok();
}

Result<std::string> Subprocess::ReadLine(const Deadline& deadline) {
  while (true) {
    size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    if (buffer_.size() > (1 << 20)) return Internal("child line too long");
    int64_t left = deadline.remaining_ms();
    if (left <= 0) {
      return DeadlineExceeded("child " + std::to_string(pid_) +
                              " did not answer in time");
    }
    pollfd p{out_fd_, POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (rc <= 0) continue;
    char buf[4096];
    ssize_t n = ::read(out_fd_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // Its stdout closes as it exits: give the exit a moment to land.
      return Unavailable("child " + std::to_string(pid_) + " exited (" +
                         HowItEnded(1000) + ")");
    }
    buffer_.append(buf, static_cast<size_t>(n));
  }
}

int Subprocess::Stop(int64_t grace_ms) {
  if (pid_ <= 0) return -1;
  if (!reaped_) {
    ::kill(pid_, SIGTERM);
    if (!Reap(Deadline::AfterMs(grace_ms))) {
      ::kill(pid_, SIGKILL);
      if (!Reap(Deadline::AfterMs(kReapWaitMs))) {
        std::fprintf(stderr,
                     "child %d did not go within %lld ms of SIGKILL (stuck "
                     "in the kernel?); left unreaped\n",
                     static_cast<int>(pid_),
                     static_cast<long long>(kReapWaitMs));
        pid_ = -1;
        return -1;
      }
    }
  }
  pid_ = -1;
  return wait_status_.value_or(-1);
}

Result<int> FreeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return Internal(std::string("socket: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    Status s = Internal(std::string("choosing a loopback port: ") +
                        std::strerror(errno));
    ::close(fd);
    return s;
  }
  ::close(fd);
  return static_cast<int>(ntohs(a.sin_port));
}

}  // namespace tensorhub::cli
