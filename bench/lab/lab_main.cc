// tensorhub-lab: the lab's command line. The chaos harness, the simulator and
// the drivers that measure the hub and the test bed; none of it is a command
// users run, so it lives here and not in the product binary (tools/).
#include "cli_util.h"

namespace tensorhub::cli {
void AddServeCommand(CommandLine& cl);
void AddSimCommand(CommandLine& cl);
void AddChaosCommands(CommandLine& cl);
void AddBenchHubCommand(CommandLine& cl, CLI::App* bench);
void AddBenchFanoutCommands(CommandLine& cl, CLI::App* bench);
void AddBenchWorkloadCommand(CommandLine& cl, CLI::App* bench);
void AddBenchReshardCommand(CommandLine& cl, CLI::App* bench);
void AddBenchChecksumCommand(CommandLine& cl, CLI::App* bench);
void AddBenchDeltaCommand(CommandLine& cl, CLI::App* bench);
void AddBenchDeltaWanCommands(CommandLine& cl, CLI::App* bench);
}  // namespace tensorhub::cli

int main(int argc, char** argv) {
  using namespace tensorhub::cli;
  CommandLine cl("tensorhub-lab",
                 "The lab: harnesses and drivers that test and measure "
                 "TensorHub. What users run is in `tensorhub` (tools/).\n"
                 "`tensorhub-lab COMMAND --help` lists a command's flags.");
  AddChaosCommands(cl);
  AddSimCommand(cl);
  CLI::App* bench =
      cl.AddGroup("bench",
                  "bench hub | bench fanout | bench workload | bench reshard | "
                  "bench checksum | bench delta | bench delta-wan (bench pair "
                  "and bench local are in `tensorhub`)");
  AddBenchHubCommand(cl, bench);
  AddBenchFanoutCommands(cl, bench);
  AddBenchWorkloadCommand(cl, bench);
  AddBenchReshardCommand(cl, bench);
  AddBenchChecksumCommand(cl, bench);
  AddBenchDeltaCommand(cl, bench);
  AddBenchDeltaWanCommands(cl, bench);
  AddServeCommand(cl);
  cl.app().footer(
      "Environment: TENSORHUB_LOG=debug|info|warn|error, TENSORHUB_ROLE_LOG "
      "(test-bed roles).\n"
      "Exit status: 0 done, 1 the command failed (chaos: a violation), 2 a "
      "bad command line.");
  return cl.Run(argc, argv);
}
