#include "bench_testbed.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

namespace tensorhub::cli {

std::vector<std::string> Testbed::Exec(size_t i) const {
  return {"ip", "netns", "exec", names.at(i)};
}

Result<Testbed> LoadTestbed(const std::string& prefix) {
  std::string path = "/run/tensorhub-testbed-" + prefix + ".env";
  std::ifstream in(path);
  if (!in) {
    return NotFound("no test bed '" + prefix + "' (" + path +
                    "); start one with: bench/testbed.sh up --prefix " +
                    prefix);
  }
  std::map<std::string, std::string> kv;
  std::string line;
  while (std::getline(in, line)) {
    size_t eq = line.find('=');
    if (eq == std::string::npos || line[0] == '#') continue;
    std::string k = line.substr(0, eq), v = line.substr(eq + 1);
    if (v.size() >= 2 && (v.front() == '"' || v.front() == '\''))
      v = v.substr(1, v.size() - 2);
    kv[k] = v;
  }
  auto split = [](const std::string& s) {
    std::vector<std::string> out;
    std::istringstream ss(s);
    for (std::string w; ss >> w;) out.push_back(w);
    return out;
  };
  Testbed t;
  t.prefix = prefix;
  t.switch_ns = kv["TB_SWITCH_NS"];
  t.names = split(kv["TB_HOST_NAMES"]);
  t.ips = split(kv["TB_HOST_IPS"]);
  t.dcs = split(kv["TB_HOST_DCS"]);
  t.host_mbit = std::atof(kv["TB_HOST_MBIT"].c_str());
  t.wan_mbit = std::atof(kv["TB_WAN_MBIT"].c_str());
  t.num_dcs = std::atoi(kv["TB_DCS"].c_str());
  if (t.names.empty() || t.names.size() != t.ips.size() ||
      t.names.size() != t.dcs.size() || t.host_mbit <= 0) {
    return InvalidArgument("test bed file " + path + " is incomplete");
  }
  return t;
}

uint64_t WanTxBytes(const Testbed& t, const std::string& dc) {
  std::string d = dc;
  while (!d.empty() && !std::isdigit(static_cast<unsigned char>(d[0])))
    d.erase(0, 1);
  std::string cmd = "ip netns exec " + t.switch_ns + " cat /sys/class/net/up" +
                    d + "/statistics/tx_bytes 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return 0;
  unsigned long long v = 0;
  if (std::fscanf(p, "%llu", &v) != 1) v = 0;
  ::pclose(p);
  return v;
}

// The roles listen on the test bed's (non-loopback) addresses, which a hub
// or worker refuses without a secret or TLS: every role of one run shares a
// random secret, as a deployment would (the caller's own
// $TENSORHUB_SECRET, if set).
const std::string& RunSecret() {
  static const std::string secret = [] {
    const char* env = std::getenv("TENSORHUB_SECRET");
    if (env != nullptr && *env != '\0') return std::string(env);
    std::random_device rd;
    char buf[33];
    std::snprintf(buf, sizeof(buf), "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
    return std::string(buf);
  }();
  return secret;
}

std::vector<std::string> RoleEnv() {
  const char* level = std::getenv("TENSORHUB_ROLE_LOG");
  return {std::string("TENSORHUB_LOG=") + (level != nullptr ? level : "warn"),
          "TENSORHUB_SECRET=" + RunSecret()};
}

namespace {
// Host i's datacenter (and rack) labels.
void AddPlace(const Testbed& t, size_t host, std::vector<std::string>* args) {
  if (t.dcs_are_racks) {
    args->insert(args->end(), {"--datacenter", "dc", "--rack", t.dcs[host]});
  } else {
    args->insert(args->end(), {"--datacenter", t.dcs[host]});
  }
}

void AddMetricsListen(const Testbed& t, size_t host, int port,
                      std::vector<std::string>* args) {
  if (port <= 0) return;
  args->push_back("--metrics-listen");
  args->push_back(t.ips[host] + ":" + std::to_string(port));
}
}  // namespace

Result<Subprocess> SpawnHub(const Testbed& t, const std::string& port,
                            std::string* address, int metrics_port) {
  *address = t.ips[0] + ":" + port;
  std::vector<std::string> a = {"serve", "--listen", *address};
  if (t.rack_oversubscription > 0) {
    char ratio[32];
    std::snprintf(ratio, sizeof(ratio), "%g", t.rack_oversubscription);
    a.insert(a.end(), {"--rack-oversubscription", ratio});
  }
  AddMetricsListen(t, 0, metrics_port > 0 ? metrics_port + 1 : 0, &a);
  return Subprocess::Spawn(a, RoleEnv(), t.Exec(0));
}

Result<std::string> WaitReady(Subprocess& role, int64_t timeout_ms) {
  auto ready = role.ReadLine(Deadline::AfterMs(timeout_ms));
  if (!ready.ok())
    return Unavailable("role did not start: " + ready.status().ToString());
  if (ready->rfind("ready ", 0) != 0)
    return Unavailable("role did not start: " + *ready);
  return ready->substr(6);
}

Result<Subprocess> SpawnTrainer(const Testbed& t, const std::string& hub,
                                uint64_t bytes, uint64_t chunk_bytes,
                                std::string* worker_id, int metrics_port) {
  std::vector<std::string> a = {"bench",         "_trainer",
                                "--hub",         hub,
                                "--bytes",       std::to_string(bytes),
                                "--chunk-bytes", std::to_string(chunk_bytes),
                                "--name",        "trainer",
                                "--host-label",  t.names[0],
                                "--data-listen", t.ips[0] + ":0"};
  AddPlace(t, 0, &a);
  AddMetricsListen(t, 0, metrics_port, &a);
  auto trainer = Subprocess::Spawn(a, RoleEnv(), t.Exec(0));
  if (!trainer.ok()) return trainer.status();
  auto id = WaitReady(*trainer, 60000);
  if (!id.ok()) return id.status();
  *worker_id = *id;
  return trainer;
}

Result<Subprocess> SpawnReader(const Testbed& t, size_t host,
                               const std::string& hub, const std::string& name,
                               uint64_t bytes, bool serve, int connections,
                               int metrics_port) {
  std::vector<std::string> a = {"bench",         "_reader",
                                "--hub",         hub,
                                "--bytes",       std::to_string(bytes),
                                "--name",        name,
                                "--host-label",  t.names[host],
                                "--data-listen", t.ips[host] + ":0",
                                "--connections", std::to_string(connections)};
  AddPlace(t, host, &a);
  if (!serve) a.push_back("--no-serve");
  AddMetricsListen(t, host, metrics_port, &a);
  return Subprocess::Spawn(a, RoleEnv(), t.Exec(host));
}

Result<PublishedReply> ParsePublished(const std::string& line) {
  std::istringstream in(line);
  std::string word;
  PublishedReply r;
  if (!(in >> word >> r.version >> r.digest) || word != "published") {
    return Internal("trainer: " + line);
  }
  in >> r.wait_s >> r.unpublish_s >> r.fill_s >> r.publish_s;
  return r;
}

Result<FetchedReply> ParseFetched(const std::string& line) {
  std::istringstream in(line);
  std::string word;
  FetchedReply r;
  if (!(in >> word >> r.version >> r.digest >> r.seconds >> r.retries) ||
      word != "fetched") {
    return Internal("reader: " + line);
  }
  for (std::string src; in >> src;) {
    size_t c1 = src.find(':'), c2 = src.rfind(':');
    if (c1 == std::string::npos || c2 == c1)
      return Internal("reader: bad source '" + src + "'");
    FetchedReply::Source s;
    s.worker = src.substr(0, c1);
    s.bytes =
        std::strtoull(src.substr(c1 + 1, c2 - c1 - 1).c_str(), nullptr, 10);
    s.was_filling = src.substr(c2 + 1) == "f";
    r.sources.push_back(std::move(s));
  }
  return r;
}

uint64_t FetchedReply::BytesFrom(const std::string& worker) const {
  uint64_t n = 0;
  for (const Source& s : sources) n += s.worker == worker ? s.bytes : 0;
  return n;
}

uint64_t FetchedReply::BytesFromFilling() const {
  uint64_t n = 0;
  for (const Source& s : sources) n += s.was_filling ? s.bytes : 0;
  return n;
}

}  // namespace tensorhub::cli
