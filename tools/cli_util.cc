#include "cli_util.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/deadline.h"
#include "tensorhub/check.h"

namespace tensorhub::cli {

namespace {

// The command running now: CommandLine::Run sets it for UsageError.
std::string& RunningCommand() {
  static std::string path;
  return path;
}

// The command named `name` directly under `app`; nullptr if none.
CLI::App* FindCommand(CLI::App* app, const std::string& name) {
  for (CLI::App* sub : app->get_subcommands({})) {
    if (sub->check_name(name)) return sub;
  }
  return nullptr;
}

// The deepest command a parse chose (the binary itself if none).
CLI::App* Chosen(CLI::App& app) {
  CLI::App* cur = &app;
  for (;;) {
    std::vector<CLI::App*> subs = cur->get_subcommands();
    if (subs.empty()) return cur;
    cur = subs.front();
  }
}

}  // namespace

CommandLine::CommandLine(std::string binary, std::string description)
    : app_(std::move(description), std::move(binary)) {
  // Inherited by every command added later.
  auto fmt = app_.get_formatter();
  fmt->label("SUBCOMMAND", "COMMAND");
  fmt->label("Positionals", "Arguments");
  fmt->label("OPTIONS", "FLAGS");
  fmt->column_width(34);
  app_.option_defaults()->group("Flags");
  app_.set_help_flag("-h,--help", "print this help and exit");
}

CLI::App* CommandLine::Add(const std::string& name,
                           const std::string& description,
                           std::function<int()> run, CLI::App* parent) {
  CLI::App* c =
      (parent == nullptr ? &app_ : parent)->add_subcommand(name, description);
  c->group(!name.empty() && name[0] == '_' ? "" : "Commands");
  // Made before the group of flags was inherited: again, in it.
  c->set_help_flag("-h,--help", "print this help and exit");
  entries_.push_back({c, std::move(run)});
  return c;
}

CLI::App* CommandLine::AddGroup(const std::string& name,
                                const std::string& description,
                                CLI::App* parent) {
  CLI::App* c =
      (parent == nullptr ? &app_ : parent)->add_subcommand(name, description);
  c->group("Commands");
  c->set_help_flag("-h,--help", "print this help and exit");
  c->require_subcommand(1);
  return c;
}

void CommandLine::AddAnyArgs(const std::string& name, std::function<int()> run,
                             CLI::App* parent) {
  CLI::App* c = Add(name, "", std::move(run), parent);
  c->group("");
  c->set_help_flag();  // --help too is one of the arguments it ignores
  c->prefix_command();
  c->allow_extras();
}

int CommandLine::Run(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(app_.help().c_str(), stderr);
    return 2;
  }
  if (args[0] == "help") {  // `help [COMMAND...]`
    args.erase(args.begin());
    args.push_back("--help");
  }
  // A word that names no command is an unknown command (CLI11 would call
  // it an unexpected argument).
  CLI::App* cur = &app_;
  for (const std::string& a : args) {
    if (a.empty() || a[0] == '-' || cur->get_subcommands({}).empty()) break;
    CLI::App* sub = FindCommand(cur, a);
    if (sub == nullptr) {
      std::fprintf(stderr, "%s: unknown command '%s'\n\n%s",
                   CommandPath(*cur).c_str(), a.c_str(),
                   cur->help(cur->get_parent() == nullptr
                                 ? ""
                                 : CommandPath(*cur->get_parent()))
                       .c_str());
      return 2;
    }
    cur = sub;
  }
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  try {
    app_.parse(args);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app_.help().c_str(), stdout);
    return 0;
  } catch (const CLI::CallForVersion& v) {
    std::printf("%s\n", v.what());
    return 0;
  } catch (const CLI::ParseError& e) {
    CLI::App* chosen = Chosen(app_);
    const std::string path = CommandPath(*chosen);
    if (chosen != &app_ && !chosen->get_subcommands({}).empty()) {
      // A group named with no command of it (`tensorhub bench`).
      std::fprintf(stderr, "%s: name a command\n\n%s", path.c_str(),
                   chosen->help(CommandPath(*chosen->get_parent())).c_str());
      return 2;
    }
    std::fprintf(stderr, "%s: %s\nRun `%s --help` for its flags.\n",
                 path.c_str(), e.what(), path.c_str());
    return 2;
  }
  CLI::App* chosen = Chosen(app_);
  for (const Entry& e : entries_) {
    if (e.app != chosen) continue;
    RunningCommand() = CommandPath(*chosen);
    return e.run();
  }
  // Only a group can be chosen without an entry, and a group requires a
  // command (AddGroup), which the parse checked.
  std::fputs(chosen->help().c_str(), stderr);
  return 2;
}

std::optional<int> ParseFlags(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: %s\nRun `%s --help` for its flags.\n",
                 app.get_name().c_str(), e.what(), app.get_name().c_str());
    return 2;
  }
  return std::nullopt;
}

std::string CommandPath(const CLI::App& app) {
  std::string path = app.get_name();
  for (const CLI::App* p = app.get_parent(); p != nullptr; p = p->get_parent())
    path = p->get_name() + " " + path;
  return path;
}

int UsageError(const std::string& message) {
  const std::string& path = RunningCommand();
  std::fprintf(stderr, "%s: %s\nRun `%s --help` for its flags.\n", path.c_str(),
               message.c_str(), path.c_str());
  return 2;
}

Result<uint64_t> ParseBytes(const std::string& text) {
  size_t i = 0;
  while (i < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) return InvalidArgument("'" + text + "' is not a size");
  double n = std::strtod(text.substr(0, i).c_str(), nullptr);
  std::string unit = text.substr(i);
  double mult = 1;
  if (unit.empty() || unit == "B")
    mult = 1;
  else if (unit == "k" || unit == "K" || unit == "KiB")
    mult = 1024.0;
  else if (unit == "M" || unit == "MiB")
    mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "KB")
    mult = 1e3;
  else if (unit == "MB")
    mult = 1e6;
  else if (unit == "GB")
    mult = 1e9;
  else
    return InvalidArgument("unknown size unit in '" + text + "'");
  double v = n * mult;
  if (v < 0 || v > 1e15)
    return InvalidArgument("size '" + text + "' out of range");
  return static_cast<uint64_t>(v);
}

std::string FormatBytes(uint64_t bytes) {
  char buf[32];
  if (bytes >= (1ull << 30)) {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / double(1ull << 30));
  } else if (bytes >= (1ull << 20)) {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", bytes / double(1ull << 20));
  } else if (bytes >= 1024) {
    std::snprintf(buf, sizeof(buf), "%.1f KiB", bytes / 1024.0);
  } else {
    std::snprintf(buf, sizeof(buf), "%llu B",
                  static_cast<unsigned long long>(bytes));
  }
  return buf;
}

std::string FormatRate(double bytes_per_second) {
  if (!(bytes_per_second > 0)) return "-";
  const double capped = std::min(bytes_per_second, 1e18);
  return FormatBytes(static_cast<uint64_t>(capped)) + "/s";
}

std::string FormatRate(uint64_t bytes, double seconds) {
  return seconds > 0 ? FormatRate(static_cast<double>(bytes) / seconds) : "-";
}

void AddHubFlags(CLI::App* command, WorkerFlags* flags) {
  command->add_option("--hub", flags->options.hub_address, "the hub's address")
      ->envname("TENSORHUB_HUB")
      ->type_name("HOST:PORT")
      ->capture_default_str();
  command
      ->add_option("--secret-file", flags->secret_file,
                   "file with the hub's shared secret (without it: the "
                   "secret in $TENSORHUB_SECRET, if set)")
      ->envname("TENSORHUB_SECRET_FILE")
      ->type_name("PATH");
  ClientOptions& o = flags->options;
  command
      ->add_option("--tls-ca", o.tls_ca_file,
                   "talk TLS to the hub, trusting a hub certificate signed "
                   "by this CA (PEM; docs/security.md)")
      ->envname("TENSORHUB_TLS_CA")
      ->type_name("PATH");
  command
      ->add_option("--tls-cert", o.tls_cert_file,
                   "this worker's certificate (PEM), for a hub that requires "
                   "client certificates and for --data-tls")
      ->envname("TENSORHUB_TLS_CERT")
      ->type_name("PATH");
  command
      ->add_option("--tls-key", o.tls_key_file,
                   "the private key of --tls-cert (PEM, unencrypted)")
      ->envname("TENSORHUB_TLS_KEY")
      ->type_name("PATH");
  command
      ->add_option("--tls-server-name", o.tls_server_name,
                   "the name the hub's certificate must have (default: the "
                   "host in --hub)")
      ->envname("TENSORHUB_TLS_SERVER_NAME")
      ->type_name("NAME");
}

void AddWorkerFlags(CLI::App* command, WorkerFlags* flags) {
  AddHubFlags(command, flags);
  ClientOptions& o = flags->options;
  command->add_option("--name", o.name,
                      "this worker's name in logs and `tensorhub show` "
                      "(default HOSTNAME:PID)");
  command
      ->add_option("--datacenter", o.labels.datacenter,
                   "this worker's datacenter: sources in the same one are "
                   "preferred")
      ->envname("TENSORHUB_DATACENTER");
  command
      ->add_option("--rack", o.labels.rack,
                   "this worker's rack (same rack preferred next)")
      ->envname("TENSORHUB_RACK");
  command
      ->add_option("--host-label", o.labels.host,
                   "this worker's host (same host preferred first)")
      ->envname("TENSORHUB_HOST_LABEL");
  command->add_flag_callback(
      "--spot", [&o] { o.worker_class = WorkerClass::kSpot; },
      "a spot worker: may vanish; retention does not count on its copies");
  flags->data_listen =
      command
          ->add_option("--data-listen", o.data_listen_address,
                       "where the data plane listens (port 0: a free one); "
                       "default: 127.0.0.1:0 when the hub is on loopback, "
                       "else the address of the interface that routes to "
                       "the hub, port 0 (then a secret or --data-tls is "
                       "needed)")
          ->envname("TENSORHUB_DATA_LISTEN")
          ->type_name("HOST:PORT");
  command
      ->add_option("--advertise-host", o.data_advertise_host,
                   "the address other hosts dial for this worker's data "
                   "(default: the listen host)")
      ->envname("TENSORHUB_ADVERTISE_HOST")
      ->type_name("HOST");
  command
      ->add_option("--metrics-listen", o.metrics_listen,
                   "serve Prometheus metrics at http://HOST:PORT/metrics "
                   "(docs/metrics.md)")
      ->envname("TENSORHUB_METRICS_LISTEN")
      ->type_name("HOST:PORT");
  command
      ->add_flag("--data-tls", o.data_tls,
                 "mutual TLS on every data connection too (needs --tls-ca, "
                 "--tls-cert, --tls-key; every worker must agree; kernel "
                 "TLS where the kernel has it)")
      ->envname("TENSORHUB_DATA_TLS");
  command
      ->add_flag("--insecure", o.insecure,
                 "accept --data-listen on a non-loopback address with neither "
                 "a secret nor --data-tls (a private test network); without "
                 "it such a worker refuses to start")
      ->envname("TENSORHUB_INSECURE");
  // Deltas (docs/design.md, "Deltas on slow links"; DeltaOptions in
  // tensorhub/client.h).
  command->add_flag_callback(
      "--no-deltas",
      [&o] {
        o.deltas.serve = false;
        o.deltas.read = false;
      },
      "neither compute nor read deltas: every version travels whole (by "
      "default a worker holding an older version reads a new one across a "
      "slow link as what changed)");
  command
      ->add_option_function<double>(
          "--wide-area-mbit",
          [&o](double mbit) {
            o.deltas.wide_area_link_bytes_per_s = mbit * 1e6 / 8;
          },
          "the link to another datacenter as the delta/full choice assumes "
          "it, Mbit/s (default 1000): a delta is read where it wins over "
          "the version whole after the cost of applying it")
      ->check(CLI::PositiveNumber)
      ->type_name("MBIT");
  command
      ->add_option_function<double>(
          "--datacenter-mbit",
          [&o](double mbit) {
            o.deltas.datacenter_link_bytes_per_s = mbit * 1e6 / 8;
          },
          "the link inside this worker's datacenter as the choice assumes "
          "it, Mbit/s (default 10000)")
      ->check(CLI::PositiveNumber)
      ->type_name("MBIT");
  AddBytesOption(command, "--delta-memory", &o.deltas.max_memory_bytes, "1GiB",
                 "the deltas this worker keeps to serve, in all; one that "
                 "does not fit is not made");
}

Result<std::string> ReadSecret(const std::string& secret_file) {
  if (!secret_file.empty()) {
    std::ifstream in(secret_file);
    if (!in) {
      return InvalidArgument("cannot read secret file '" + secret_file + "'");
    }
    std::stringstream ss;
    ss << in.rdbuf();
    std::string s = ss.str();
    while (!s.empty() &&
           (s.back() == '\n' || s.back() == '\r' || s.back() == ' '))
      s.pop_back();
    if (s.empty())
      return InvalidArgument("secret file '" + secret_file + "' is empty");
    return s;
  }
  const char* env = std::getenv("TENSORHUB_SECRET");
  return std::string(env == nullptr ? "" : env);
}

namespace {

// The host of "HOST:PORT" or "[V6]:PORT".
std::string HostOfAddress(const std::string& address) {
  if (!address.empty() && address.front() == '[') {
    size_t close = address.find(']');
    return close == std::string::npos ? address : address.substr(1, close - 1);
  }
  size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

// The port of "HOST:PORT" or "[V6]:PORT" ("1" when there is none: a UDP
// connect needs one, and any routes the same).
std::string PortOfAddress(const std::string& address) {
  size_t colon = address.rfind(':');
  size_t close = address.rfind(']');
  if (colon == std::string::npos || colon + 1 >= address.size() ||
      (close != std::string::npos && close > colon)) {
    return "1";
  }
  return address.substr(colon + 1);
}

// 127.0.0.0/8, ::1, ::ffff:127.x.y.z or "localhost".
bool IsLoopbackAddress(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

}  // namespace

Result<std::string> RouteToHub(const std::string& hub_address) {
  std::string last_error = "no address";
  size_t begin = 0;
  while (begin <= hub_address.size()) {
    size_t end = hub_address.find(',', begin);
    if (end == std::string::npos) end = hub_address.size();
    std::string address = hub_address.substr(begin, end - begin);
    begin = end + 1;
    if (address.empty()) continue;
    std::string host = HostOfAddress(address);
    if (IsLoopbackAddress(host)) return std::string();
    std::string port = PortOfAddress(address);
    addrinfo hints{};
    hints.ai_socktype = SOCK_DGRAM;
    addrinfo* found = nullptr;
    int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
    if (rc != 0) {
      last_error = host + ": " + gai_strerror(rc);
      continue;
    }
    std::string source;
    for (addrinfo* a = found; a != nullptr && source.empty(); a = a->ai_next) {
      int fd =
          socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      sockaddr_storage local{};
      socklen_t len = sizeof(local);
      char text[NI_MAXHOST];
      if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
          getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
          getnameinfo(reinterpret_cast<sockaddr*>(&local), len, text,
                      sizeof(text), nullptr, 0, NI_NUMERICHOST) == 0) {
        source = text;
      } else {
        last_error = host + ": " + std::strerror(errno);
      }
      close(fd);
    }
    freeaddrinfo(found);
    if (source.empty()) continue;
    if (IsLoopbackAddress(source)) return std::string();
    return source;
  }
  return Unavailable("no route from this host to the hub " + hub_address +
                     " (" + last_error +
                     "); set --data-listen HOST:0 (or "
                     "$TENSORHUB_DATA_LISTEN) with an address other hosts "
                     "can reach");
}

Result<ClientOptions> ClientOptionsFrom(const WorkerFlags& flags) {
  ClientOptions o = flags.options;
  TH_ASSIGN_OR_RETURN(o.secret, ReadSecret(flags.secret_file));
  if (flags.data_listen != nullptr && flags.data_listen->count() == 0) {
    TH_ASSIGN_OR_RETURN(std::string routed, RouteToHub(o.hub_address));
    if (!routed.empty()) {
      bool v6 = routed.find(':') != std::string::npos;
      o.data_listen_address = (v6 ? "[" + routed + "]" : routed) + ":0";
    }
  }
  return o;
}

CLI::Validator SizeTransform() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        Result<uint64_t> b = ParseBytes(text);
        if (!b.ok()) return b.status().message();
        text = std::to_string(*b);
        return "";
      },
      "", "size");
}

CLI::Option* AddBytesOption(CLI::App* command, const std::string& name,
                            uint64_t* bytes, const std::string& def,
                            const std::string& description) {
  Result<uint64_t> d = ParseBytes(def);
  TH_CHECK(d.ok());
  *bytes = *d;
  return command->add_option(name, *bytes, description)
      ->transform(SizeTransform())
      ->type_name("SIZE")
      ->default_str(def);
}

Result<ModelRef> ParseModelRef(const std::string& text) {
  ModelRef r;
  size_t at = text.find('@');
  r.model = text.substr(0, at);
  if (r.model.empty()) return InvalidArgument("'" + text + "' names no model");
  if (at == std::string::npos) return r;
  std::string v = text.substr(at + 1);
  if (v == "latest") return r;
  if (v.empty() || v.size() > 20 ||
      v.find_first_not_of("0123456789") != std::string::npos) {
    return InvalidArgument("'" + v + "' is not a version number or 'latest'");
  }
  r.version = Version(std::stoull(v));
  if (r.version.is_latest())
    return InvalidArgument("version numbers start at 1");
  return r;
}

void BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForStopSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  sigwait(&set, &sig);
  return sig;
}

int WaitForStopSignalFor(int64_t ms) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  timespec ts{static_cast<time_t>(ms / 1000),
              static_cast<long>((ms % 1000) * 1000000)};
  const int sig = sigtimedwait(&set, nullptr, &ts);
  return sig > 0 ? sig : 0;
}

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)),
      tty_(isatty(STDERR_FILENO)),
      start_ms_(NowMs()) {}

void ProgressBar::Update(uint64_t done, uint64_t total) {
  if (!tty_ || total == 0) return;
  double frac = static_cast<double>(done) / static_cast<double>(total);
  int width = 30;
  int filled = static_cast<int>(frac * width);
  double secs = (NowMs() - start_ms_) / 1000.0;
  std::string bar(filled, '#');
  bar.resize(width, '.');
  std::fprintf(stderr, "\r%s [%s] %5.1f%% %s / %s  %s ", label_.c_str(),
               bar.c_str(), frac * 100, FormatBytes(done).c_str(),
               FormatBytes(total).c_str(), FormatRate(done, secs).c_str());
  drawn_ = true;
}

void ProgressBar::Finish() {
  if (drawn_) std::fprintf(stderr, "\n");
}

std::string Hex(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

void Reply(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

Result<std::unique_ptr<Client>> ConnectAndSayReady(const WorkerFlags& flags) {
  TH_ASSIGN_OR_RETURN(ClientOptions o, ClientOptionsFrom(flags));
  TH_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(o));
  Reply("ready " + client->id().value());
  return client;
}

std::string FormatStages(const FetchStats& st) {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "stages: resolve %.3f s, schedule %.3f s, first byte %.3f s, "
                "transfer %.3f s, verify %.3f s, register %.3f s",
                st.resolve_seconds, st.schedule_seconds, st.first_byte_seconds,
                st.transfer_seconds, st.verify_seconds, st.register_seconds);
  return buf;
}

int Fail(const Status& status) {
  std::fprintf(stderr, "tensorhub: %s\n", status.ToString().c_str());
  return 1;
}

int MovedToLab(const std::string& command) {
  std::fprintf(
      stderr,
      "tensorhub: '%s' moved to the lab binary: run `tensorhub-lab %s` "
      "(build/bench/lab/tensorhub-lab)\n",
      command.c_str(), command.c_str());
  return 2;
}

}  // namespace tensorhub::cli
