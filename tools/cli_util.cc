#include "cli_util.h"

#include <signal.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/deadline.h"

namespace tensorhub::cli {

std::string Args::Get(const std::string& name, const std::string& def) const {
  auto it = flags.find(name);
  return it == flags.end() ? def : it->second;
}

Result<uint64_t> Args::GetU64(const std::string& name, uint64_t def) const {
  auto it = flags.find(name);
  if (it == flags.end()) return def;
  const std::string& v = it->second;
  if (v.empty() || v.size() > 20 ||
      v.find_first_not_of("0123456789") != std::string::npos) {
    return InvalidArgument("--" + name +
                           " wants a non-negative integer, got '" + v + "'");
  }
  return std::stoull(v);
}

Result<double> Args::GetDouble(const std::string& name, double def) const {
  auto it = flags.find(name);
  if (it == flags.end()) return def;
  char* end = nullptr;
  double d = std::strtod(it->second.c_str(), &end);
  if (end == it->second.c_str() || *end != '\0' || d < 0) {
    return InvalidArgument("--" + name + " wants a non-negative number, got '" +
                           it->second + "'");
  }
  return d;
}

Result<Args> ParseArgs(int argc, char** argv, int first,
                       const std::vector<std::string>& value_flags,
                       const std::vector<std::string>& bool_flags) {
  auto in = [](const std::vector<std::string>& v, const std::string& s) {
    for (const auto& x : v)
      if (x == s) return true;
    return false;
  };
  Args a;
  for (int i = first; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) != 0 || s == "--") {
      a.positional.push_back(s);
      continue;
    }
    std::string name = s.substr(2);
    std::string value;
    bool has_value = false;
    size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (in(bool_flags, name)) {
      if (has_value) return InvalidArgument("--" + name + " takes no value");
      a.flags[name] = "1";
    } else if (in(value_flags, name)) {
      if (!has_value) {
        if (i + 1 >= argc)
          return InvalidArgument("--" + name + " needs a value");
        value = argv[++i];
      }
      a.flags[name] = value;
    } else {
      return InvalidArgument("unknown flag --" + name);
    }
  }
  return a;
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

std::string HubAddress(const Args& args) {
  if (args.Has("hub")) return args.Get("hub");
  const char* env = std::getenv("TENSORHUB_HUB");
  if (env != nullptr && *env != '\0') return env;
  return "127.0.0.1:7070";
}

Result<std::string> Secret(const Args& args) {
  std::string file = args.Get("secret-file");
  if (file.empty()) {
    const char* env = std::getenv("TENSORHUB_SECRET_FILE");
    if (env != nullptr) file = env;
  }
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) return InvalidArgument("cannot read secret file '" + file + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    std::string s = ss.str();
    while (!s.empty() &&
           (s.back() == '\n' || s.back() == '\r' || s.back() == ' '))
      s.pop_back();
    if (s.empty())
      return InvalidArgument("secret file '" + file + "' is empty");
    return s;
  }
  const char* env = std::getenv("TENSORHUB_SECRET");
  return std::string(env == nullptr ? "" : env);
}

Result<ClientOptions> ClientOptionsFrom(const Args& args) {
  ClientOptions o;
  o.hub_address = HubAddress(args);
  TH_ASSIGN_OR_RETURN(o.secret, Secret(args));
  o.name = args.Get("name");
  o.labels.datacenter = args.Get("datacenter");
  o.labels.rack = args.Get("rack");
  o.labels.host = args.Get("host-label");
  if (args.Has("spot")) o.worker_class = WorkerClass::kSpot;
  if (args.Has("data-listen")) o.data_listen_address = args.Get("data-listen");
  o.data_advertise_host = args.Get("advertise-host");
  o.metrics_listen = args.Get("metrics-listen");
  TH_ASSIGN_OR_RETURN(uint64_t t, args.GetU64("timeout-ms", 10000));
  o.connect_timeout_ms = static_cast<int64_t>(t);
  o.tls_ca_file = args.Get("tls-ca");
  o.tls_cert_file = args.Get("tls-cert");
  o.tls_key_file = args.Get("tls-key");
  o.tls_server_name = args.Get("tls-server-name");
  o.data_tls = args.Has(kDataTlsFlag);
  return o;
}

std::vector<std::string> WithTlsFlags(std::vector<std::string> value_flags) {
  for (const char* f : {"tls-ca", "tls-cert", "tls-key", "tls-server-name"})
    value_flags.push_back(f);
  return value_flags;
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
  double rate = secs > 0 ? done / secs / 1e9 : 0;
  std::string bar(filled, '#');
  bar.resize(width, '.');
  std::fprintf(stderr, "\r%s [%s] %5.1f%% %s / %s  %.2f GB/s ", label_.c_str(),
               bar.c_str(), frac * 100, FormatBytes(done).c_str(),
               FormatBytes(total).c_str(), rate);
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

std::optional<int> TopLevelHelp(int argc, char** argv, const char* usage) {
  if (argc < 2) {
    std::fputs(usage, stderr);
    return 2;
  }
  const std::string first = argv[1];
  if (first == "-h" || first == "--help" || first == "help") {
    std::fputs(usage, stdout);
    return 0;
  }
  return std::nullopt;
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
