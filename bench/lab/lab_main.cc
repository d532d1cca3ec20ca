// tensorhub-lab: the lab's command line. The chaos harness, the simulator and
// the drivers that measure the hub and the test bed; none of it is a command
// users run, so it lives here and not in the product binary (tools/).
#include <cstdio>
#include <optional>
#include <string>

#include "cli_util.h"
#include "common/log.h"

namespace tensorhub::cli {
int CmdServe(int argc, char** argv);
int CmdSim(int argc, char** argv);
int CmdChaos(int argc, char** argv);
int CmdChaosWorker(int argc, char** argv);
int CmdBenchTrainer(int argc, char** argv);
int CmdBenchReader(int argc, char** argv);
int CmdBenchFanout(int argc, char** argv);
int CmdBenchHub(int argc, char** argv);
int CmdBenchWorkload(int argc, char** argv);
int CmdBenchReshard(int argc, char** argv);
}  // namespace tensorhub::cli

namespace {

const char kUsage[] = R"(usage: tensorhub-lab COMMAND [flags]

The lab: harnesses and drivers that test and measure TensorHub. What users run
is in `tensorhub` (tools/).

Commands:
  chaos  [--seed S] [--rounds R] [--readers 4]    seeded fault injection (kill, stop, slow, hub
         [--bytes 4MiB] [--verbose]              stop/restart) on loopback processes; checks
                                                  bytes, deadlines, availability; exit 1 on
                                                  any violation
  sim    --scenario standalone|elastic|crossdc|scale|testbed [--csv]
                                                  cluster-scale simulation of the hub's scheduler
  bench hub [--workers 10000] [--threads 4] [--no-rpc]
                                                  hub CPU for one version to N readers: the state
                                                  machine and `serve` over gRPC
  bench reshard [--trainers 4] [--tp 4] [--scale 1.0]
                                                  a 0.5B Llama-shaped model, trainer FSDP(K) to
                                                  rollout TP(M): partial fetch vs full fetch +
                                                  slicing, bytes and time per rank vs the bound
  bench fanout --testbed PREFIX --readers N       fan-out on bench/testbed.sh's hosts
  bench workload standalone|elastic|crossdc --testbed PREFIX
                                                  trainer loop + rollouts: GPU stall vs
                                                  point-to-point and MPI_Bcast
  serve  [flags as `tensorhub serve`]             the hub (the drivers run it as a child)

Environment: TENSORHUB_LOG=debug|info|warn|error, TENSORHUB_ROLE_LOG (test-bed roles)
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace tensorhub::cli;
  if (std::optional<int> rc = TopLevelHelp(argc, argv, kUsage)) return *rc;
  std::string cmd = argv[1];
  if (cmd == "serve") return CmdServe(argc, argv);
  if (cmd == "sim") return CmdSim(argc, argv);
  if (cmd == "chaos") return CmdChaos(argc, argv);
  if (cmd == "_chaos-worker") return CmdChaosWorker(argc, argv);
  if (cmd == "bench") {
    std::string what = argc >= 3 ? argv[2] : "";
    // The test-bed roles take their flags from argv[2] on, like a command.
    if (what == "_trainer") return CmdBenchTrainer(argc - 1, argv + 1);
    if (what == "_reader") return CmdBenchReader(argc - 1, argv + 1);
    if (what == "fanout") return CmdBenchFanout(argc, argv);
    if (what == "workload") return CmdBenchWorkload(argc, argv);
    if (what == "hub") return CmdBenchHub(argc, argv);
    if (what == "reshard") return CmdBenchReshard(argc, argv);
    std::fprintf(stderr,
                 "tensorhub-lab: unknown benchmark '%s': bench "
                 "hub|fanout|workload|reshard "
                 "(bench pair and bench local are in `tensorhub`)\n",
                 what.c_str());
    return 2;
  }
  std::fprintf(stderr, "tensorhub-lab: unknown command '%s'\n\n%s", cmd.c_str(),
               kUsage);
  return 2;
}
