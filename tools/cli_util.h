// Shared pieces of the `tensorhub` command line: flag parsing, the hub
// address and secret, human-readable sizes, a progress bar, signal waits.
#ifndef TENSORHUB_TOOLS_CLI_UTIL_H_
#define TENSORHUB_TOOLS_CLI_UTIL_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tensorhub/client.h"
#include "tensorhub/status.h"

namespace tensorhub::cli {

// --name VALUE, --name=VALUE and bare --flag (for names in `bool_flags`).
// Anything not starting with "--" is positional.
struct Args {
  std::map<std::string, std::string> flags;
  std::vector<std::string> positional;

  bool Has(const std::string& name) const { return flags.count(name) > 0; }
  std::string Get(const std::string& name, const std::string& def = "") const;
  Result<uint64_t> GetU64(const std::string& name, uint64_t def) const;
  Result<double> GetDouble(const std::string& name, double def) const;
};

Result<Args> ParseArgs(int argc, char** argv, int first,
                       const std::vector<std::string>& value_flags,
                       const std::vector<std::string>& bool_flags);

// Accepts "1000000", "256MiB", "1GB", "4k" ...
Result<uint64_t> ParseBytes(const std::string& text);
std::string FormatBytes(uint64_t bytes);

// --hub, else $TENSORHUB_HUB, else 127.0.0.1:7070.
std::string HubAddress(const Args& args);
// --secret-file, else $TENSORHUB_SECRET_FILE, else $TENSORHUB_SECRET.
Result<std::string> Secret(const Args& args);
// Client options from the common flags (--hub, --name, --datacenter, --rack,
// --host-label, --spot, --data-listen, --advertise-host, --metrics-listen, the
// TLS flags).
Result<ClientOptions> ClientOptionsFrom(const Args& args);
// `value_flags` and the TLS flags of every command that talks to the hub:
// --tls-ca, --tls-cert, --tls-key, --tls-server-name. Worker commands also
// take the bare flag kDataTlsFlag (--data-tls).
std::vector<std::string> WithTlsFlags(std::vector<std::string> value_flags);
inline constexpr char kDataTlsFlag[] = "data-tls";

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

// A binary's top level: with no command, prints `usage` to stderr and
// returns 2; with -h, --help or help, prints it to stdout and returns 0;
// else returns nothing and the command runs.
std::optional<int> TopLevelHelp(int argc, char** argv, const char* usage);

// For a lab command asked of the product binary: prints the one line that
// says where it went (`tensorhub-lab COMMAND`, bench/lab/) and returns 2.
int MovedToLab(const std::string& command);

// The line protocol of worker processes spawned by the demo, benchmarks and
// tests: a digest as 16 hex digits, and one flushed line on stdout.
std::string Hex(uint64_t v);
void Reply(const std::string& line);

}  // namespace tensorhub::cli

#endif  // TENSORHUB_TOOLS_CLI_UTIL_H_
