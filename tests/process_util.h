// What the cross-component tests share for driving worker processes (the
// roles of test_roles.h and gpu_roles.h) over their line protocol, and the
// main() of a test binary that is also its own worker.
#ifndef TENSORHUB_TESTS_PROCESS_UTIL_H_
#define TENSORHUB_TESTS_PROCESS_UTIL_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "subprocess.h"

namespace tensorhub::testing {

// Word `i` (from 0) of a reply line, or "" past its end.
std::string Word(const std::string& line, int i);

// Spawns this binary with `args` (a --role=... first) and TENSORHUB_LOG=warn;
// a failed spawn fails the test.
cli::Subprocess MustSpawn(const std::vector<std::string>& args);

// Sends one command line and returns the reply line, or "error ..." if the
// process did not answer within `timeout_ms`.
std::string Ask(cli::Subprocess& p, const std::string& cmd,
                int64_t timeout_ms = 120000);

// SIGSTOP, then waits until the kernel reports the process stopped (the
// signal is delivered asynchronously); a process that does not stop within
// 5 s fails the test.
void StopProcess(pid_t pid);

// Starts "fetchx V TIMEOUT_MS PAUSE_AFTER" on a reader role and returns once
// it has paused: `pause_after` or more chunks are verified and no stream
// pulls another one until Resume() (FetchPause). With `quiet_streams` > 0,
// only once that many streams wait between chunks: none has a read in
// flight. Fails the test otherwise.
void FetchUntilPaused(cli::Subprocess& reader, const std::string& version,
                      int64_t timeout_ms, uint64_t pause_after = 8,
                      int quiet_streams = 0);

// Lets a paused reader go on and returns its "fetched ..." or "failed ..."
// line.
std::string Resume(cli::Subprocess& reader);

// A test binary's main(): runs the role named by argv if `run_role` finds
// one (it returns -1 otherwise), else the GoogleTest suite.
int RoleOrTestsMain(int argc, char** argv,
                    int (*run_role)(int argc, char** argv));

}  // namespace tensorhub::testing

#endif  // TENSORHUB_TESTS_PROCESS_UTIL_H_
