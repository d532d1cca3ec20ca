// `tensorhub bench fanout`: one trainer and N readers on the multi-host test
// bed (bench/testbed.sh), each in its own network namespace behind a shaped
// link. Times how long until every reader holds a new version, beside the
// bandwidth lower bound S/B, and counts what crossed the trainer's link and
// the wide-area link. `--mode p2p` is the plain point-to-point baseline:
// readers do not serve, so every one pulls from the trainer.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "cli_util.h"
#include "common/log.h"
#include "demo_model.h"
#include "subprocess.h"

namespace tensorhub::cli {
namespace {

constexpr char kModel[] = "bench-fanout";

std::vector<TensorSpec> BenchLayout(uint64_t bytes) {
  // Like a model: many tiny tensors (norms, biases) and large matrices.
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 48; ++i) specs.push_back({"norm." + std::to_string(i), DType::kBF16, {896}});
  uint64_t left = bytes > 48 * 1792 ? bytes - 48 * 1792 : 2;
  for (int i = 0; left >= 2; ++i) {
    uint64_t n = std::min<uint64_t>(left, 32ull << 20) / 2;
    specs.push_back({"w." + std::to_string(i), DType::kBF16, {n}});
    left -= n * 2;
  }
  return specs;
}

Result<ClientOptions> RoleOptions(const Args& a) {
  ClientOptions o;
  o.hub_address = a.Get("hub");
  o.name = a.Get("name");
  o.labels.datacenter = a.Get("datacenter");
  o.labels.host = a.Get("host-label");
  o.data_listen_address = a.Get("data-listen", "127.0.0.1:0");
  o.connect_timeout_ms = 30000;
  return o;
}

// Test bed description written by bench/testbed.sh up.
struct Testbed {
  std::string prefix, switch_ns;
  std::vector<std::string> names, ips, dcs;
  double host_mbit = 0, wan_mbit = 0;
  int num_dcs = 1;
};

Result<Testbed> LoadTestbed(const std::string& prefix) {
  std::string path = "/run/tensorhub-testbed-" + prefix + ".env";
  std::ifstream in(path);
  if (!in) {
    return NotFound("no test bed '" + prefix + "' (" + path +
                    "); start one with: bench/testbed.sh up --prefix " + prefix);
  }
  std::map<std::string, std::string> kv;
  std::string line;
  while (std::getline(in, line)) {
    size_t eq = line.find('=');
    if (eq == std::string::npos || line[0] == '#') continue;
    std::string k = line.substr(0, eq), v = line.substr(eq + 1);
    if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'')) v = v.substr(1, v.size() - 2);
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
  if (t.names.empty() || t.names.size() != t.ips.size() || t.names.size() != t.dcs.size() ||
      t.host_mbit <= 0) {
    return InvalidArgument("test bed file " + path + " is incomplete");
  }
  return t;
}

// Bytes that left datacenter `dc` towards the wide-area link so far.
uint64_t WanTxBytes(const Testbed& t, const std::string& dc) {
  std::string d = dc;
  while (!d.empty() && !std::isdigit(static_cast<unsigned char>(d[0]))) d.erase(0, 1);
  std::string cmd = "ip netns exec " + t.switch_ns + " cat /sys/class/net/up" + d +
                    "/statistics/tx_bytes 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return 0;
  unsigned long long v = 0;
  if (std::fscanf(p, "%llu", &v) != 1) v = 0;
  ::pclose(p);
  return v;
}

}  // namespace

int CmdBenchTrainer(int argc, char** argv) {
  auto args = ParseArgs(argc, argv, 2, {"hub", "bytes", "chunk-bytes", "name", "datacenter",
                                        "host-label", "data-listen"}, {});
  if (!args.ok()) return Fail(args.status());
  SetLogPrefix("trainer");
  SyntheticModel model(BenchLayout(std::stoull(args->Get("bytes"))));
  auto o = RoleOptions(*args);
  if (!o.ok()) return Fail(o.status());
  auto client = Client::Connect(*o);
  if (!client.ok()) return Fail(client.status());
  Reply("ready " + (*client)->id().value());
  PublishOptions po;
  po.chunk_bytes = std::stoull(args->Get("chunk-bytes", std::to_string(4 << 20)));
  std::string line;
  uint64_t last = 0;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    uint64_t v = 0;
    in >> cmd >> v;
    if (cmd != "publish") break;
    if (last) {
      Status s = (*client)->Unpublish(kModel, Version(last), 120000);
      if (!s.ok()) { Reply("error " + s.ToString()); continue; }
    }
    model.Fill(v);
    Status s = (*client)->Publish(kModel, Version(v), model.tensors(), po);
    if (!s.ok()) { Reply("error " + s.ToString()); continue; }
    last = v;
    Reply("published " + std::to_string(v) + " " + Hex(model.Digest()));
  }
  return 0;
}

int CmdBenchReader(int argc, char** argv) {
  auto args = ParseArgs(argc, argv, 2, {"hub", "bytes", "name", "datacenter", "host-label",
                                        "data-listen", "connections"}, {"no-serve"});
  if (!args.ok()) return Fail(args.status());
  SetLogPrefix(args->Get("name").c_str());
  SyntheticModel model(BenchLayout(std::stoull(args->Get("bytes"))));
  auto o = RoleOptions(*args);
  if (!o.ok()) return Fail(o.status());
  auto client = Client::Connect(*o);
  if (!client.ok()) return Fail(client.status());
  Reply("ready " + (*client)->id().value());
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    uint64_t v = 0;
    in >> cmd >> v;
    if (cmd != "fetch") break;
    FetchOptions fo;
    fo.timeout_ms = 600000;
    fo.serve = !args->Has("no-serve");
    fo.connections = std::stoi(args->Get("connections", "4"));
    auto st = (*client)->Fetch(kModel, Version(v), model.tensors(), fo);
    if (!st.ok()) { Reply("error " + st.status().ToString()); continue; }
    std::string out = "fetched " + std::to_string(v) + " " + Hex(model.Digest()) + " " +
                      std::to_string(st->seconds) + " " + std::to_string(st->chunk_retries);
    for (const FetchSourceStats& s : st->sources) {
      out += " " + s.worker.value() + ":" + std::to_string(s.bytes) + ":" +
             (s.was_filling ? "f" : "c");
    }
    Reply(out);
  }
  return 0;
}

int CmdBenchFanout(int argc, char** argv) {
  auto args = ParseArgs(argc, argv, 3, {"testbed", "readers", "bytes", "mode", "repeat",
                                        "chunk-bytes", "connections", "port"}, {});
  if (!args.ok()) return Fail(args.status());
  auto tb = LoadTestbed(args->Get("testbed", "th"));
  if (!tb.ok()) return Fail(tb.status());
  auto bytes = ParseBytes(args->Get("bytes", "256MiB"));
  auto chunk = ParseBytes(args->Get("chunk-bytes", "2MiB"));
  auto readers = args->GetU64("readers", tb->names.size() - 1);
  auto repeat = args->GetU64("repeat", 2);
  std::string mode = args->Get("mode", "tensorhub");
  for (const Status& s : {bytes.status(), chunk.status(), readers.status(), repeat.status()}) {
    if (!s.ok()) return Fail(s);
  }
  if (mode != "tensorhub" && mode != "p2p") return Fail(InvalidArgument("--mode is tensorhub or p2p"));
  if (*readers < 1 || *readers + 1 > tb->names.size()) {
    return Fail(InvalidArgument("the test bed has " + std::to_string(tb->names.size()) +
                                " hosts: at most " + std::to_string(tb->names.size() - 1) +
                                " readers"));
  }
  if (*repeat < 1 || *repeat > 20) return Fail(InvalidArgument("--repeat must be in [1, 20]"));
  SetLogLevel(LogLevel::kWarn);
  auto ns = [&](size_t i) { return std::vector<std::string>{"ip", "netns", "exec", tb->names[i]}; };
  const std::vector<std::string> env = {"TENSORHUB_LOG=warn"};
  std::string hub = tb->ips[0] + ":" + args->Get("port", "7070");
  auto hub_proc = Subprocess::Spawn({"serve", "--listen", hub}, env, ns(0));
  if (!hub_proc.ok()) return Fail(hub_proc.status());
  std::string sbytes = std::to_string(*bytes);
  auto trainer = Subprocess::Spawn({"bench", "_trainer", "--hub", hub, "--bytes", sbytes,
                                    "--chunk-bytes", std::to_string(*chunk), "--name", "trainer",
                                    "--datacenter", tb->dcs[0], "--host-label", tb->names[0],
                                    "--data-listen", tb->ips[0] + ":0"},
                                   env, ns(0));
  if (!trainer.ok()) return Fail(trainer.status());
  auto ready = trainer->ReadLine(Deadline::AfterMs(60000));
  if (!ready.ok() || ready->rfind("ready ", 0) != 0) {
    return Fail(Unavailable("trainer did not start: " + (ready.ok() ? *ready : ready.status().ToString())));
  }
  std::string trainer_id = ready->substr(6);
  std::vector<Subprocess> rs;
  for (uint64_t i = 1; i <= *readers; ++i) {
    std::vector<std::string> a = {"bench", "_reader", "--hub", hub, "--bytes", sbytes,
                                  "--name", "reader-" + std::to_string(i), "--datacenter",
                                  tb->dcs[i], "--host-label", tb->names[i], "--data-listen",
                                  tb->ips[i] + ":0", "--connections",
                                  args->Get("connections", "4")};
    if (mode == "p2p") a.push_back("--no-serve");
    auto r = Subprocess::Spawn(a, env, ns(i));
    if (!r.ok()) return Fail(r.status());
    rs.push_back(std::move(r).value());
  }
  for (Subprocess& r : rs) {
    auto line = r.ReadLine(Deadline::AfterMs(60000));
    if (!line.ok() || line->rfind("ready", 0) != 0) return Fail(Unavailable("a reader did not start"));
  }
  // The lower bound: every reader must download S through its own link.
  const double link_bytes_per_s = tb->host_mbit * 1e6 / 8;
  const double bound = *bytes / link_bytes_per_s;
  std::set<std::string> remote_dcs;
  for (uint64_t i = 1; i <= *readers; ++i) {
    if (tb->dcs[i] != tb->dcs[0]) remote_dcs.insert(tb->dcs[i]);
  }
  std::printf("fanout: mode %s, %llu readers, %s, links %.0f Mbit/s%s, chunks of %s, "
              "bound S/B %.2f s\n",
              mode.c_str(), static_cast<unsigned long long>(*readers), FormatBytes(*bytes).c_str(),
              tb->host_mbit,
              remote_dcs.empty() ? "" : (", WAN " + std::to_string(static_cast<int>(tb->wan_mbit)) +
                                         " Mbit/s, " + std::to_string(remote_dcs.size()) +
                                         " remote DC(s)").c_str(),
              FormatBytes(*chunk).c_str(), bound);
  double best = 1e30;
  bool all_ok = true;
  double best_trainer_copies = 0, best_wan = 0, best_filling = 0;
  for (uint64_t r = 1; r <= *repeat; ++r) {
    Status s = trainer->Send("publish " + std::to_string(r));
    auto pub = s.ok() ? trainer->ReadLine(Deadline::AfterMs(600000)) : Result<std::string>(s);
    if (!pub.ok() || pub->rfind("published", 0) != 0) {
      return Fail(Internal("trainer: " + (pub.ok() ? *pub : pub.status().ToString())));
    }
    std::string digest = pub->substr(pub->rfind(' ') + 1);
    uint64_t wan0 = WanTxBytes(*tb, tb->dcs[0]);
    auto t0 = SteadyClock::now();
    for (Subprocess& rd : rs) (void)rd.Send("fetch " + std::to_string(r));
    double last = 0, first = 1e30;
    uint64_t from_trainer = 0, from_filling = 0, retries = 0;
    size_t matched = 0;
    for (size_t i = 0; i < rs.size(); ++i) {
      auto line = rs[i].ReadLine(Deadline::AfterMs(900000));
      double at = std::chrono::duration<double>(SteadyClock::now() - t0).count();
      if (!line.ok() || line->rfind("fetched", 0) != 0) {
        std::printf("  reader-%zu FAILED: %s\n", i + 1, line.ok() ? line->c_str() : line.status().ToString().c_str());
        all_ok = false;
        continue;
      }
      std::istringstream in(*line);
      std::string w, ver, dig;
      double secs = 0;
      uint64_t rt = 0;
      in >> w >> ver >> dig >> secs >> rt;
      retries += rt;
      matched += dig == digest;
      for (std::string src; in >> src;) {
        size_t c1 = src.find(':'), c2 = src.rfind(':');
        uint64_t b = std::stoull(src.substr(c1 + 1, c2 - c1 - 1));
        if (src.substr(0, c1) == trainer_id) from_trainer += b;
        if (src.substr(c2 + 1) == "f") from_filling += b;
      }
      last = std::max(last, at);
      first = std::min(first, at);
    }
    uint64_t wan = WanTxBytes(*tb, tb->dcs[0]) - wan0;
    all_ok = all_ok && matched == rs.size();
    double copies = static_cast<double>(from_trainer) / *bytes;
    std::printf("  round %llu: all %zu readers hold it after %.2f s (first %.2f s) = %.2f x S/B; "
                "bytes match %zu/%zu; from trainer %.2f S; from filling peers %.2f S; retries %llu",
                static_cast<unsigned long long>(r), rs.size(), last, first, last / bound, matched,
                rs.size(), copies, static_cast<double>(from_filling) / *bytes,
                static_cast<unsigned long long>(retries));
    if (!remote_dcs.empty()) std::printf("; WAN out of %s %.3f S", tb->dcs[0].c_str(), static_cast<double>(wan) / *bytes);
    std::printf("\n");
    std::fflush(stdout);
    if (last < best) {
      best = last;
      best_trainer_copies = copies;
      best_wan = static_cast<double>(wan) / *bytes;
      best_filling = static_cast<double>(from_filling) / *bytes;
    }
  }
  (void)trainer->Send("quit");
  for (Subprocess& rd : rs) (void)rd.Send("quit");
  for (Subprocess& rd : rs) rd.Stop(3000);
  trainer->Stop(3000);
  hub_proc->Stop(3000);
  std::printf("fanout mode=%s readers=%llu bytes=%llu seconds=%.3f bound_seconds=%.3f ratio=%.3f "
              "trainer_copies=%.2f from_filling_per_S=%.2f wan_per_S=%.3f ok=%d\n",
              mode.c_str(), static_cast<unsigned long long>(*readers),
              static_cast<unsigned long long>(*bytes), best, bound, best / bound,
              best_trainer_copies, best_filling, best_wan, all_ok ? 1 : 0);
  return all_ok ? 0 : 1;
}

}  // namespace tensorhub::cli
