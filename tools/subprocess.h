// A child process of this binary with line-based pipes to its stdin and
// stdout, used by the demo and the benchmarks to run real worker processes.
#ifndef TENSORHUB_TOOLS_SUBPROCESS_H_
#define TENSORHUB_TOOLS_SUBPROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "tensorhub/status.h"

namespace tensorhub::cli {

class Subprocess {
 public:
  // Runs this binary with `args` (argv[1..]); extra "KEY=VALUE" pairs are
  // added to the environment (replacing this process's values of the same
  // names). A non-empty `wrapper` is run instead, with
  // this binary's path and `args` appended (e.g. {"ip", "netns", "exec",
  // "th-h3"} runs it inside a network namespace).
  static Result<Subprocess> Spawn(const std::vector<std::string>& args,
                                  const std::vector<std::string>& env = {},
                                  const std::vector<std::string>& wrapper = {});
  Subprocess(Subprocess&& o) noexcept;
  Subprocess& operator=(Subprocess&&) = delete;
  Subprocess(const Subprocess&) = delete;
  // SIGKILLs and reaps a child still running (waiting at most kReapWaitMs
  // for it to go: one stuck in the kernel is left, said on stderr).
  ~Subprocess();

  // One line to the child's stdin. A child that is gone is UNAVAILABLE,
  // saying how it ended; never SIGPIPE for this process, whatever the
  // process's disposition of it.
  Status Send(const std::string& line);
  // One line without its '\n', or DEADLINE_EXCEEDED, or UNAVAILABLE once
  // the child closed its stdout (it exited: saying how, e.g. "killed by
  // signal 6 (Aborted)").
  Result<std::string> ReadLine(const Deadline& deadline);
  // SIGTERM, then SIGKILL after `grace_ms`; returns the wait status, or -1
  // if it is not known (the child could not be reaped, or was reaped
  // elsewhere).
  int Stop(int64_t grace_ms);
  // How the child ended ("exited with code 0", "killed by signal 6
  // (Aborted)"), reaping it, once it has; "still running" if it has not
  // within `wait_ms`.
  std::string HowItEnded(int64_t wait_ms = 0);
  // Closes the child's stdin (it reads EOF).
  void CloseInput();
  pid_t pid() const { return pid_; }

  // How long the final wait for a SIGKILLed child may take.
  static constexpr int64_t kReapWaitMs = 10000;

 private:
  Subprocess() = default;
  // Polls for the child's exit until `deadline`; true once reaped.
  bool Reap(const Deadline& deadline);
  pid_t pid_ = -1;
  int in_fd_ = -1;
  int out_fd_ = -1;
  std::string buffer_;
  bool reaped_ = false;
  // waitpid's, once reaped_; none when it was reaped elsewhere (ECHILD).
  std::optional<int> wait_status_;
};

// "exited with code N" or "killed by signal N (name)", from a waitpid
// status.
std::string DescribeWaitStatus(int status);

// A TCP port on 127.0.0.1 that was free a moment ago (the kernel's choice),
// for a child process to listen on; another process may take it first.
Result<int> FreeLoopbackPort();

}  // namespace tensorhub::cli

#endif  // TENSORHUB_TOOLS_SUBPROCESS_H_
