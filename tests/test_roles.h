// Worker roles that the cross-component tests run as separate processes of
// the test binary itself (Subprocess spawns /proc/self/exe --role=NAME ...).
// Each role speaks a line protocol on stdin/stdout:
//   hub      --port P [--lease-ms N]     prints "ready ADDR", runs until killed
//            [--etcd EP --etcd-lease-ms N --rebuild-ms N]: one of an HA set
//   trainer  --hub A --bytes N           "publish V [RANK GROUP]" -> "published
//   V DIGEST"
//                                        "unpublish V" -> "unpublished V"
//                                        "address" -> "address HOST:PORT" (its
//                                        data server)
//   reader   --hub A --bytes N           "fetch V|latest" -> "fetched V DIGEST"
//                                        or "error CODE: message"
//            "fetchx V|latest TIMEOUT_MS PAUSE_AFTER": with PAUSE_AFTER > 0,
//            stops pulling once that many chunks are verified, prints
//            "paused N" and waits for the line "go" (the test injects its
//            fault meanwhile) ->
//            "fetched V DIGEST RETRIES STOLEN MS PAUSED_AT SOURCES TRANSPORTS"
//            (TRANSPORTS: what the chunks came over, e.g. "ucx", "tcp,ucx")
//            or "failed MS CODE: message"
//            "fetchwait V|latest TIMEOUT_MS": prints "waiting" the first time
//            the hub answers a retryable UNAVAILABLE, then
//            "fetched V DIGEST waited|at-once" or "failed MS CODE: message"
//   keeper   --hub A                     prints "ready ID", keeps retained
//                                        versions until killed
// Every role takes --secret S (the shared secret); the hub also
// --max-connections-per-peer N --idle-connection-ms N
// --handshake-timeout-ms N --accept-request-secret (HubOptions).
#ifndef TENSORHUB_TESTS_TEST_ROLES_H_
#define TENSORHUB_TESTS_TEST_ROLES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tensorhub/types.h"

namespace tensorhub::testing {

// A call must end by its own deadline. The slack covers process scheduling
// on a loaded 2-core machine; every fallback a missed deadline would land on
// (an RPC or read timeout) is several times longer, so a check with it still
// tells "ended by its deadline" from "ended by some other timeout".
constexpr int64_t kDeadlineSlackMs = 2000;

// Runs the role named by argv ("--role=NAME") and returns its exit code, or
// -1 if argv names no role.
int MaybeRunRole(int argc, char** argv);

// The tensors every role uses for a version of `bytes` bytes: a few large
// tensors and many tiny ones (norms, biases), like a real model.
std::vector<TensorSpec> TestLayout(uint64_t bytes);

// A free TCP port on 127.0.0.1 (bound, then released).
// A loopback port that was free a moment ago (aborts the test binary if the
// kernel gives none).
int FreePort();

}  // namespace tensorhub::testing

#endif  // TENSORHUB_TESTS_TEST_ROLES_H_
