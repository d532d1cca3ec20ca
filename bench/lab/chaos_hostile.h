// The hostile peer of `tensorhub-lab chaos` (issue 27): a process that does
// not know the shared secret and attacks one port for a while, as someone
// on the same network would.
//
//   _chaos-attacker --target HOST:PORT --kind hub|data --ms N
//                   [--connections N] [--from ADDRESS] [--seed S]
//
//   hub   idle connections that sent only the HTTP/2 preface (reopened as
//         the hub closes them), connections of garbage bytes, and gRPC
//         calls without a valid proof of the secret: a 32 MiB Publish with
//         none, ListModels with a proof of another secret and with a
//         malformed one.
//   data  idle connections to a holder's data port (reopened as it closes
//         them) for half the time, then handshakes answered with a wrong
//         proof; garbage all along.
//
// It prints one line when its time is up:
//   attacked KIND idle=N reopened=N garbage=N tries=N refused=N served=N
//            unanswered=N
// `served` counts what it got without the secret (a call answered OK, a
// verdict OK): the driver counts any as a violation. `unanswered`: calls and
// handshakes that failed otherwise (the target down, a timeout).
#ifndef TENSORHUB_BENCH_LAB_CHAOS_HOSTILE_H_
#define TENSORHUB_BENCH_LAB_CHAOS_HOSTILE_H_

#include <cstdint>
#include <string>

#include "cli_util.h"

namespace tensorhub::cli {

struct AttackerFlags {
  std::string target;
  std::string kind = "hub";
  int64_t ms = 1000;
  int connections = 300;
  std::string from;  // a local address to connect from ("": any)
  uint64_t seed = 1;
};

int RunChaosAttacker(const AttackerFlags& f);
void AddAttackerCommand(CommandLine& cl);

}  // namespace tensorhub::cli

#endif  // TENSORHUB_BENCH_LAB_CHAOS_HOSTILE_H_
