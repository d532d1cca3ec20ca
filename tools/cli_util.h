// Shared pieces of the `tensorhub` and `tensorhub-lab` command lines: the
// command table and its flags (CLI11), the hub address and secret,
// human-readable sizes, a progress bar, signal waits.
#ifndef TENSORHUB_TOOLS_CLI_UTIL_H_
#define TENSORHUB_TOOLS_CLI_UTIL_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensorhub/client.h"
#include "tensorhub/status.h"

namespace tensorhub::cli {

// ---- Commands and flags ----
//
// A binary's command line is a CommandLine: a CLI11 app whose subcommands
// are the commands, each registered with the function that runs it once its
// flags are parsed. Flags bind straight to the fields a command reads (a
// struct the run function captures), so every flag is declared once, with
// its help text, type and range, and `COMMAND --help` lists them all.
//
// Exit codes, the same for every binary: 0 success (and --help); 1 the
// command ran and failed (Fail prints why); 2 the command line is wrong
// (unknown command or flag, bad or missing value): the message names the
// flag and points at `COMMAND --help`.
class CommandLine {
 public:
  CommandLine(std::string binary, std::string description);
  CommandLine(const CommandLine&) = delete;
  CommandLine& operator=(const CommandLine&) = delete;

  CLI::App& app() { return app_; }

  // Adds command `name` under `parent` (nullptr: the binary) that calls
  // `run` when chosen; `run`'s result is the exit code. A name starting
  // with '_' is hidden from the help: a worker process the binary spawns
  // itself (the demo's rollouts, the benchmarks' holders).
  CLI::App* Add(const std::string& name, const std::string& description,
                std::function<int()> run, CLI::App* parent = nullptr);
  // A command that only groups others (`bench pair`, `bench local`).
  CLI::App* AddGroup(const std::string& name, const std::string& description,
                     CLI::App* parent = nullptr);
  // A hidden command that takes any arguments and calls `run` (e.g. one
  // that moved to another binary and says where).
  void AddAnyArgs(const std::string& name, std::function<int()> run,
                  CLI::App* parent = nullptr);

  // Parses argv, runs the chosen command and returns the exit code. With no
  // command, prints the help to stderr and returns 2; `help [COMMAND...]`,
  // -h and --help print it to stdout and return 0.
  int Run(int argc, char** argv);

 private:
  struct Entry {
    CLI::App* app;
    std::function<int()> run;
  };
  CLI::App app_;
  std::vector<Entry> entries_;
};

// For a binary without commands (the test roles, gpu_bench): parses argv
// into `app`'s flags. Returns nothing to go on, else the exit code: 0 after
// printing the help, 2 after saying what is wrong with the command line.
std::optional<int> ParseFlags(CLI::App& app, int argc, char** argv);

// "tensorhub fetch": the command being parsed or run (for messages).
std::string CommandPath(const CLI::App& app);
// For a bad command line found after parsing (a combination of flags):
// prints "PATH: MESSAGE" and the --help hint for the running command, and
// returns 2.
int UsageError(const std::string& message);

// The flags of a command that talks to the hub, and of one that joins as a
// worker (holds and serves versions). The one place these are defined: a
// flag every such command takes is one line in AddHubFlags or
// AddWorkerFlags, binding it into `options` (or a field here).
struct WorkerFlags {
  // --hub, --tls-ca, --tls-cert, --tls-key, --tls-server-name, --name,
  // --datacenter, --rack, --host-label, --spot, --data-listen,
  // --advertise-host, --metrics-listen, --data-tls; the secret is read by
  // ClientOptionsFrom.
  ClientOptions options;
  std::string secret_file;  // --secret-file
  // --data-listen (AddWorkerFlags): when neither it nor
  // $TENSORHUB_DATA_LISTEN is given and the hub is not on loopback,
  // ClientOptionsFrom listens on the address that routes to the hub.
  CLI::Option* data_listen = nullptr;
};
// --hub HOST:PORT (else $TENSORHUB_HUB, else 127.0.0.1:7070),
// --secret-file PATH (else $TENSORHUB_SECRET_FILE, else the secret itself in
// $TENSORHUB_SECRET), and TLS to the hub: --tls-ca, --tls-cert, --tls-key,
// --tls-server-name.
void AddHubFlags(CLI::App* command, WorkerFlags* flags);
// AddHubFlags' flags plus who this worker is, where its data plane listens
// and its metrics endpoint: --name, --datacenter, --rack, --host-label,
// --spot, --data-listen, --advertise-host, --metrics-listen, --data-tls,
// --insecure, and deltas: --no-deltas, --wide-area-mbit, --datacenter-mbit,
// --delta-memory.
void AddWorkerFlags(CLI::App* command, WorkerFlags* flags);
// The options the flags give, with the secret read. A worker (AddWorkerFlags)
// told no data-plane address whose hub is not on loopback listens on the
// address of its interface that routes to the hub, port 0 (RouteToHub), so
// that readers on other hosts can dial it.
Result<ClientOptions> ClientOptionsFrom(const WorkerFlags& flags);
// The address of this host's interface that routes to `hub_address` (the
// first address of an HA list that resolves), "" when the hub is on
// loopback or is this host. Consults the routing table only: a UDP socket
// is connected, nothing is sent.
Result<std::string> RouteToHub(const std::string& hub_address);
// The secret alone (for `serve`, which is no worker).
Result<std::string> ReadSecret(const std::string& secret_file);

// The transform of a size flag: "256MiB" -> "268435456" (see ParseBytes).
CLI::Validator SizeTransform();
// A size flag: "1000000", "256MiB", "1GB", "4k" (see ParseBytes); `def`
// is the default, written the same way.
CLI::Option* AddBytesOption(CLI::App* command, const std::string& name,
                            uint64_t* bytes, const std::string& def,
                            const std::string& description);

// Accepts "1000000", "256MiB", "1GB", "4k" ...
Result<uint64_t> ParseBytes(const std::string& text);
std::string FormatBytes(uint64_t bytes);
// A throughput in the unit that fits it: "45.3 MiB/s", "1.52 GiB/s"
// (FormatBytes per second); "-" for 0.
std::string FormatRate(double bytes_per_second);
// `bytes` over `seconds` as FormatRate; "-" when seconds is not positive.
std::string FormatRate(uint64_t bytes, double seconds);

// "model", "model@7", "model@latest".
struct ModelRef {
  std::string model;
  Version version;
};
Result<ModelRef> ParseModelRef(const std::string& text);

// Blocks SIGINT/SIGTERM in this thread (call before starting threads, so
// every thread inherits the mask) and later waits for one of them.
void BlockStopSignals();
int WaitForStopSignal();
// The same, for at most `ms`: 0 if no signal came by then.
int WaitForStopSignalFor(int64_t ms);

// A single-line progress bar on stderr, drawn only when stderr is a terminal.
class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  void Update(uint64_t done, uint64_t total);
  void Finish();

 private:
  std::string label_;
  bool tty_;
  int64_t start_ms_;
  bool drawn_ = false;
};

int Fail(const Status& status);  // prints "tensorhub: CODE: message", returns 1

// A fetch's stage breakdown for its closing line (FetchStats' stages):
// "stages: resolve 0.001 s, schedule ..., register 0.001 s".
std::string FormatStages(const FetchStats& st);

// For a lab command asked of the product binary: prints the one line that
// says where it went (`tensorhub-lab COMMAND`, bench/lab/) and returns 2.
int MovedToLab(const std::string& command);

// The line protocol of worker processes spawned by the demo, benchmarks and
// tests: a digest as 16 hex digits, and one flushed line on stdout.
std::string Hex(uint64_t v);
void Reply(const std::string& line);
// Such a worker's start: a client from its flags, connected, then the line
// "ready ID" (Reply).
Result<std::unique_ptr<Client>> ConnectAndSayReady(const WorkerFlags& flags);

}  // namespace tensorhub::cli

#endif  // TENSORHUB_TOOLS_CLI_UTIL_H_
