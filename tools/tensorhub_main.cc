// tensorhub: the command line users run: the hub, the file tools, the demo
// and the two-process benchmarks. The lab's harnesses and drivers (chaos,
// sim, bench hub|fanout|workload) are in tensorhub-lab (bench/lab/).
#include <cstdio>
#include <optional>
#include <string>

#include "cli_util.h"
#include "common/log.h"

namespace tensorhub::cli {
int CmdServe(int argc, char** argv);
int CmdLs(int argc, char** argv);
int CmdShow(int argc, char** argv);
int CmdPublish(int argc, char** argv);
int CmdFetch(int argc, char** argv);
int CmdDemo(int argc, char** argv);
int CmdDemoTrainer(int argc, char** argv);
int CmdDemoRollout(int argc, char** argv);
int CmdBench(int argc, char** argv);
int CmdRetain(int argc, char** argv);
int CmdKeeper(int argc, char** argv);
}  // namespace tensorhub::cli

namespace {

const char kUsage[] = R"(usage: tensorhub COMMAND [flags]

Commands:
  serve  [--listen HOST:PORT] [--lease-ms N]     run the hub (default 127.0.0.1:7070)
         [--oversubscribed-racks]                 rack uplinks are the bottleneck
         [--keep-latest K]                        retain the latest K versions per model
         [--rebuild-ms N]                         after a start, answer unknown versions
                                                  UNAVAILABLE for N ms (default: the lease)
         [--tls-cert F --tls-key F]               serve gRPC over TLS only (PEM files)
         [--tls-client-ca F]                      and require client certificates (mTLS)
  ls                                              models, versions, state, holders
  show   MODEL[@VERSION|@latest]                  manifest and holders of a version
  publish FILE.safetensors --model M --version V  hold a file's tensors (memory-mapped)
         [--rank R --group-size G]                until interrupted
  fetch  MODEL[@VERSION|@latest] -o OUT.safetensors
         [--group ID --step N]                    reader group: one `latest` per step
  retain MODEL@VERSION / unretain MODEL@VERSION   pin a version / withdraw the pin
  keeper [--memory-limit BYTES]                   hold retained versions in host memory
  demo   [--rollouts 4] [--rounds 5] [--scale 1.0]  trainer + rollouts, ~1 GB bf16 model
  bench  pair [--bytes 1GiB] [--data-tls]         holder -> reader on loopback vs raw TCP
  bench  local [--bytes 1GiB]                     the same on the intra-host path vs memcpy
  (chaos, sim and bench hub|fanout|workload moved to the lab binary: tensorhub-lab, bench/lab/)

Common flags:
  --hub HOST:PORT        the hub (else $TENSORHUB_HUB, else 127.0.0.1:7070)
  --secret-file PATH     shared secret (else $TENSORHUB_SECRET_FILE / $TENSORHUB_SECRET)
  --datacenter/--rack/--host-label NAME   this worker's place in the topology
  --data-listen HOST:PORT  data-plane listen address (default 127.0.0.1:0)
  --advertise-host HOST  host other workers dial for the data plane
  --timeout-ms N         deadline for the call (default depends on the command)
  --metrics-listen HOST:PORT  serve Prometheus metrics at /metrics (serve, publish,
                         fetch, keeper; docs/metrics.md)
  --tls-ca F             talk TLS to the hub, trusting hub certificates signed by F
  --tls-cert F --tls-key F  this worker's certificate (mutual TLS; data-plane TLS)
  --tls-server-name NAME the name the hub's certificate must have (default: --hub's host)
  --data-tls             TLS on data connections too (publish, fetch, keeper; every
                         worker must agree; kernel TLS where available)
Environment: TENSORHUB_LOG=debug|info|warn|error
)";

}  // namespace

int main(int argc, char** argv) {
  using namespace tensorhub::cli;
  if (std::optional<int> rc = TopLevelHelp(argc, argv, kUsage)) return *rc;
  std::string cmd = argv[1];
  if (cmd == "serve") return CmdServe(argc, argv);
  if (cmd == "ls") return CmdLs(argc, argv);
  if (cmd == "show") return CmdShow(argc, argv);
  if (cmd == "publish") return CmdPublish(argc, argv);
  if (cmd == "fetch") return CmdFetch(argc, argv);
  if (cmd == "demo") return CmdDemo(argc, argv);
  if (cmd == "_demo-trainer") return CmdDemoTrainer(argc, argv);
  if (cmd == "_demo-rollout") return CmdDemoRollout(argc, argv);
  if (cmd == "bench") return CmdBench(argc, argv);
  if (cmd == "sim" || cmd == "chaos" || cmd == "_chaos-worker")
    return MovedToLab(cmd);
  if (cmd == "retain" || cmd == "unretain") return CmdRetain(argc, argv);
  if (cmd == "keeper") return CmdKeeper(argc, argv);
  std::fprintf(stderr, "tensorhub: unknown command '%s'\n\n%s", cmd.c_str(),
               kUsage);
  return 2;
}
