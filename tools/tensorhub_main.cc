// tensorhub: the command line users run: the hub, the file tools, the demo
// and the two-process benchmarks. The lab's harnesses and drivers (chaos,
// sim, bench hub|fanout|workload) are in tensorhub-lab (bench/lab/).
#include "cli_util.h"
#include "tensorhub/version.h"

namespace tensorhub::cli {
void AddServeCommand(CommandLine& cl);
void AddInspectCommands(CommandLine& cl);
void AddFileCommands(CommandLine& cl);
void AddRetainCommands(CommandLine& cl);
void AddDemoCommands(CommandLine& cl);
void AddBenchCommands(CommandLine& cl);
void AddTopCommand(CommandLine& cl);
void AddNodeCommand(CommandLine& cl);
}  // namespace tensorhub::cli

int main(int argc, char** argv) {
  using namespace tensorhub::cli;
  CommandLine cl("tensorhub",
                 "TensorHub: model weight versions moved peer to peer, from "
                 "trainers to rollout workers.\n`tensorhub COMMAND --help` "
                 "lists a command's flags.");
  // "tensorhub 0.1.0 (CUDA 13.0, UCX 1.13.1, TLS OpenSSL ...)" on stdout.
  cl.app().set_version_flag("--version", tensorhub::BuildInfoLine(),
                            "the version and what this build can do "
                            "(CUDA, UCX, TLS), then exit");
  AddServeCommand(cl);
  AddInspectCommands(cl);
  AddTopCommand(cl);
  AddFileCommands(cl);
  AddRetainCommands(cl);
  AddNodeCommand(cl);
  AddDemoCommands(cl);
  AddBenchCommands(cl);
  for (const char* moved : {"sim", "chaos", "_chaos-worker"}) {
    cl.AddAnyArgs(moved, [moved] { return MovedToLab(moved); });
  }
  cl.app().footer(
      "The lab's commands (chaos, sim, bench hub|fanout|workload) are in "
      "tensorhub-lab (bench/lab/).\n"
      "Environment: TENSORHUB_HUB, TENSORHUB_SECRET_FILE, TENSORHUB_SECRET "
      "(see --hub, --secret-file);\n"
      "  TENSORHUB_LOG=debug|info|warn|error; TENSORHUB_TRANSPORTS=ucx,tcp\n"
      "  (holders on this host are read over tcp's same-host path unless\n"
      "  TENSORHUB_UCX_SAME_HOST=1; UCX runs only over RDMA, rc or dc, unless\n"
      "  TENSORHUB_UCX_EMULATED_GETS=allow: over its tcp wire a peer with the\n"
      "  secret and a modified UCX can write into a holder's memory);\n"
      "  TENSORHUB_CHUNK_CHECKSUM=xxh3-64-tree-64k|xxh3-64 (publish);\n"
      "  TENSORHUB_NODE=@NAME|PATH (node: where engines find the agent).\n"
      "Exit status: 0 done, 1 the command failed, 2 a bad command line.");
  return cl.Run(argc, argv);
}
