// `tensorhub-lab chaos`: a seeded fault-injection run against real processes
// on loopback. One hub process (`tensorhub-lab serve`: the product's `serve`),
// one trainer, several reader processes and an auditor (all
// `tensorhub-lab _chaos-worker`), each a real
// Client with its own data-plane server. Every round the trainer unpublishes
// its old version and publishes a new one while the readers fetch (latest or
// an older version) and sometimes unpublish, and the driver injects faults:
//
//   kill-holder     SIGKILL of a worker that holds a version
//   kill-reader     SIGKILL of a reader, usually in the middle of its fetch
//   kill-trainer    the trainer publishes rank 0 of a group of 2 and is
//                   SIGKILLed before rank 1 could: the version must never be
//                   visible and must end ABORTED
//   stop            SIGSTOP for 0.5-2.5 s, then SIGCONT (a partition: the
//                   process neither answers reads nor renews its lease)
//   slow            SIGSTOP/SIGCONT duty cycle (40 ms of every 60) for 1-2.5 s
//   hub-restart     SIGKILL of the hub, a new hub on the same port 0.2-1 s
//                   later
//   hub-stop        SIGSTOP of the hub for 0.5-2.5 s: it accepts
//                   connections but answers nothing; every call must still
//                   keep its deadline
//   flood-hub       a hostile peer without the secret (`_chaos-attacker`,
//                   chaos_hostile.h) attacks the hub for 0.5-2.5 s: idle
//                   connections, garbage, calls without a valid proof (a
//                   32 MiB Publish among them)
//   flood-holder    the same against a holder's data port: idle
//                   connections, handshakes with a wrong proof, garbage
//
// Every process of a run shares one random secret ($TENSORHUB_SECRET), so
// that the hostile peers face what a deployment has. After a flood the run
// checks that nothing was served to the attacker, that the target's memory
// grew by at most 64 MiB and that its descriptors come back.
//
// With --testbed PREFIX every process runs on a host of that test bed
// (bench/testbed.sh up --prefix PREFIX --hosts 6: h0 the trainer, h1-h3 the
// readers and the auditor, h4 the attacker, h5 the hub) and two network
// faults join in:
//   partition       a host's link set down for 0.5-2.5 s, then up
//   crawl           a host's link shaped to 1 Mbit/s each way (tc tbf) for
//                   0.5-2.5 s, then back to the test bed's rate
// (this kernel has neither netem nor iptables: loss and delay come from
// these two).
//
// With --ha N the hub is a highly available set of N hubs on a loopback
// etcd (each `serve --etcd`), the workers are given all N addresses, and:
//   hub-restart     SIGKILL of any hub of the set, restarted (as a standby)
//                   0.2-1 s later; a failover if it was the leader
//   hub-stop        SIGSTOP of the leader for 0.5-2.5 s: longer than its
//                   etcd lease (2 s), another hub takes over and the old
//                   one, resumed, must refuse (fenced)
//   hub-failover    SIGKILL of the leader, restarted as a standby 0.2-1 s
//                   later: a standby takes over within about a lease and
//                   rebuilds the table from the workers' reports
//
// After each round it checks:
//   * every fetch that succeeded returned exactly the published bytes (the
//     content of version V is derived from (seed, V), so the driver knows its
//     digest without a copy), and never a version that was aborted;
//   * every committed version that a live worker holds can be fetched by the
//     auditor once the faults are over (after a hub restart too: the hub
//     rebuilds its table from the workers);
//   * no call outlived its deadline: each worker measures its own calls, and a
//     call may exceed its timeout only by a fixed slack plus the time its own
//     process was stopped; a call that never answers is a violation;
//   * no worker ended without being killed (a crash, or a library such as
//     UCX aborting the process).
// The schedule (which fault, when, on whom, how long) is drawn from the seed
// before each round, so a failing seed replays the same schedule (thread
// timing on a loaded machine still varies).
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "chaos_hostile.h"
#include "cli_util.h"
#include "common/log.h"
#include "demo_model.h"
#include "etcd_process.h"
#include "fetch_pause.h"
#include "ha/etcd_client.h"
#include "ha/etcd_keys.h"
#include "subprocess.h"

namespace tensorhub::cli {
namespace {

constexpr char kModel[] = "chaos-model";
constexpr int64_t kFetchTimeoutMs = 6000;
constexpr int64_t kPublishTimeoutMs = 5000;
constexpr int64_t kUnpublishTimeoutMs = 4000;
// Allowed beyond a call's own timeout: scheduling on a loaded 2-core machine.
constexpr int64_t kSlackMs = 1500;
// The longest a fault keeps a process stopped.
constexpr int64_t kMaxFaultMs = 2500;
// How long the auditor keeps trying after a round (the hub may be rebuilding
// its table, a stopped holder renewing its lease).
constexpr int64_t kSettleMs = 20000;

// The processes this run started, so that an interrupted run (SIGINT,
// SIGTERM) leaves none behind: workers end on their own when their stdin
// closes, but the hub waits for a signal and a stopped worker would stay
// stopped. Slots are cleared once a process is reaped (its pid may be reused).
constexpr int kMaxTracked = 128;
std::atomic<pid_t> g_children[kMaxTracked];

void Track(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t empty = 0;
    if (slot.compare_exchange_strong(empty, pid)) return;
  }
}

void Untrack(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t want = pid;
    if (slot.compare_exchange_strong(want, 0)) return;
  }
}

extern "C" void KillChildrenAndExit(int sig) {
  for (auto& slot : g_children) {
    pid_t pid = slot.load();
    if (pid > 0) {
      ::kill(pid, SIGCONT);
      ::kill(pid, SIGKILL);
    }
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

std::vector<TensorSpec> ChaosLayout(uint64_t bytes) {
  std::vector<TensorSpec> specs;
  for (int i = 0; i < 16; ++i)
    specs.push_back({"norm." + std::to_string(i), DType::kBF16, {512}});
  uint64_t left = bytes > 16 * 1024 ? bytes - 16 * 1024 : 2;
  for (int i = 0; left >= 2; ++i) {
    uint64_t n = std::min<uint64_t>(left, 1ull << 20) / 2;
    specs.push_back({"w." + std::to_string(i), DType::kBF16, {n}});
    left -= n * 2;
  }
  return specs;
}

// The content of version `v` in a run of `seed`.
uint64_t ContentKey(uint64_t seed, uint64_t v) {
  return seed * 0x9E3779B97F4A7C15ull + v;
}

// A decimal that std::stoll and std::stoull take whole.
bool IsNumber(const std::string& w) {
  return !w.empty() && w.size() <= 18 &&
         std::all_of(w.begin(), w.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

std::vector<std::string> Words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> w;
  for (std::string s; in >> s;) w.push_back(s);
  return w;
}

// ---------------------------------------------------------------------------
// The worker process. Every reply starts with its word and the call's time.
//
//   publish V RANK GROUP TIMEOUT_MS
//       -> ok MS DIGEST | error MS CODE: message
//   unpublish V TIMEOUT_MS
//       -> ok MS | error MS ...
//   fetch V|latest TIMEOUT_MS SERVE [PAUSE_AFTER]
//       -> fetched MS V DIGEST RETRIES STOLEN SOURCES TRANSPORTS
//          | error MS ...
//       TRANSPORTS: the data-plane transports the chunks came over, sorted,
//       comma-separated ("tcp", "ucx", "tcp,ucx"). With PAUSE_AFTER > 0,
//       first "paused N" once N >= PAUSE_AFTER chunks are in; the fetch
//       goes on at the line "go".
//   describe V
//       -> state MS NAME | error MS ...
//   address
//       -> address MS HOST:PORT (its data server)
//
// The worker serves and reads the transports of $TENSORHUB_TRANSPORTS
// (ClientOptions::transports; tcp when unset), over UCX's wires of $UCX_TLS.

// "ucx", "tcp,ucx", ...: the transports a fetch's chunks came over.
std::string SourceTransports(const FetchStats& st) {
  std::set<std::string> names;
  for (const FetchSourceStats& s : st.sources) names.insert(s.transport);
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ",") + n;
  return out.empty() ? "-" : out;
}

struct ChaosWorkerFlags {
  std::string hub;
  std::string name = "worker";
  uint64_t bytes = 4 << 20;
  uint64_t chunk_bytes = 64 << 10;
  uint64_t seed = 1;
  std::string data_listen = "127.0.0.1:0";
};

int RunChaosWorker(const ChaosWorkerFlags& f) {
  SetLogPrefix(f.name.c_str());
  SyntheticModel model(ChaosLayout(f.bytes));
  ClientOptions o;
  o.hub_address = f.hub;
  o.name = f.name;
  o.heartbeat_interval_ms = 200;
  o.rpc_timeout_ms = 1000;
  o.connect_timeout_ms = 20000;
  o.data_listen_address = f.data_listen;
  // A test bed's worker (tests/testbed/failover_smoke.sh) listens on its
  // host's address, which needs the run's secret ($TENSORHUB_SECRET).
  auto secret = ReadSecret("");
  if (!secret.ok()) return Fail(secret.status());
  o.secret = *secret;
  auto client = Client::Connect(o);
  if (!client.ok()) return Fail(client.status());
  Reply("ready");
  std::string line;
  while (std::getline(std::cin, line)) {
    std::vector<std::string> w = Words(line);
    if (w.empty()) continue;
    int64_t t0 = NowMs();
    auto ms = [&] { return std::to_string(NowMs() - t0); };
    auto error = [&](const Status& s) {
      Reply("error " + ms() + " " + s.ToString());
    };
    if (w[0] == "publish" && w.size() == 5) {
      uint64_t v = std::stoull(w[1]);
      model.Fill(ContentKey(f.seed, v));
      PublishOptions po;
      po.rank = static_cast<uint32_t>(std::stoul(w[2]));
      po.group_size = static_cast<uint32_t>(std::stoul(w[3]));
      po.timeout_ms = std::stoll(w[4]);
      po.chunk_bytes = f.chunk_bytes;
      Status s = (*client)->Publish(kModel, Version(v), model.tensors(), po);
      s.ok() ? Reply("ok " + ms() + " " + Hex(model.Digest())) : error(s);
    } else if (w[0] == "unpublish" && w.size() == 3) {
      Status s = (*client)->Unpublish(kModel, Version(std::stoull(w[1])),
                                      std::stoll(w[2]));
      s.ok() ? Reply("ok " + ms()) : error(s);
    } else if (w[0] == "fetch" && (w.size() == 4 || w.size() == 5)) {
      FetchOptions fo;
      fo.timeout_ms = std::stoll(w[2]);
      fo.serve = w[3] == "1";
      Version v =
          w[1] == "latest" ? Version::Latest() : Version(std::stoull(w[1]));
      // PAUSE_AFTER: stop pulling after that many chunks, say "paused N" and
      // wait for "go" (the test bed injects its fault meanwhile).
      std::optional<FetchPause> pause;
      if (w.size() == 5 && std::stoull(w[4]) > 0) {
        pause.emplace(
            std::stoull(w[4]),
            [](uint64_t n) { Reply("paused " + std::to_string(n)); },
            [] {
              for (std::string go; std::getline(std::cin, go) && go != "go";) {
              }
            });
      }
      auto st = (*client)->Fetch(kModel, v, model.tensors(), fo);
      pause.reset();
      st.ok()
          ? Reply(
                "fetched " + ms() + " " + std::to_string(st->version.value()) +
                " " + Hex(model.Digest()) + " " +
                std::to_string(st->chunk_retries) + " " +
                std::to_string(st->chunks_stolen) + " " +
                std::to_string(st->sources_used) + " " + SourceTransports(*st))
          : error(st.status());
    } else if (w[0] == "address" && w.size() == 1) {
      Reply("address " + ms() + " " + (*client)->data_address());
    } else if (w[0] == "describe" && w.size() == 2) {
      auto info = (*client)->Describe(kModel, Version(std::stoull(w[1])));
      info.ok() ? Reply("state " + ms() + " " +
                        std::string(VersionStateName(info->state)))
                : error(info.status());
    } else {
      Reply("error 0 INVALID_ARGUMENT: unknown command '" + line + "'");
    }
  }
  return 0;
}

// ---------------------------------------------------------------------------
// The driver.

enum Fault {
  kKillHolder,
  kKillReader,
  kKillTrainer,
  kStop,
  kSlow,
  kHubRestart,
  kHubStop,
  kHubFailover,  // drawn only with --ha
  kFloodHub,     // hostile peers without the secret (chaos_hostile.h)
  kFloodHolder,
  kPartition,  // network faults: drawn only with --testbed
  kCrawl,
  kNumFaults
};
const char* const kFaultNames[] = {
    "kill-holder", "kill-reader",  "kill-trainer", "stop",
    "slow",        "hub-restart",  "hub-stop",     "hub-failover",
    "flood-hub",   "flood-holder", "partition",    "crawl"};
static_assert(std::size(kFaultNames) == kNumFaults);

// What a flood may cost its target: memory (the hub reads no request of a
// caller without the secret, however large) and, once the attacker is gone,
// descriptors left over.
constexpr uint64_t kMaxFloodRssBytes = 64ull << 20;
constexpr size_t kFloodFdSlack = 64;
// The rate of a crawling link.
constexpr int kCrawlMbit = 1;

uint64_t RssBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

size_t Descriptors(pid_t pid) {
  DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (d == nullptr) return 0;
  size_t n = 0;
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

// The test bed of --testbed (bench/testbed.sh's state file).
struct TestBed {
  std::string prefix;
  std::vector<std::string> names, ips;
  int host_mbit = 0;
  std::string switch_ns;
};

Result<TestBed> LoadTestBed(const std::string& prefix) {
  const std::string path = "/run/tensorhub-testbed-" + prefix + ".env";
  std::ifstream in(path);
  if (!in) {
    return NotFound("no test bed '" + prefix + "' (" + path +
                    "): bench/testbed.sh up --prefix " + prefix +
                    " --hosts 6 first");
  }
  TestBed tb;
  tb.prefix = prefix;
  std::string line;
  auto value = [](const std::string& l) {
    std::string v = l.substr(l.find('=') + 1);
    if (v.size() >= 2 && v.front() == '"') v = v.substr(1, v.size() - 2);
    return v;
  };
  while (std::getline(in, line)) {
    if (line.rfind("TB_HOST_NAMES=", 0) == 0) tb.names = Words(value(line));
    if (line.rfind("TB_HOST_IPS=", 0) == 0) tb.ips = Words(value(line));
    if (line.rfind("TB_HOST_MBIT=", 0) == 0)
      tb.host_mbit = std::stoi(value(line));
    if (line.rfind("TB_SWITCH_NS=", 0) == 0) tb.switch_ns = value(line);
  }
  if (tb.names.size() < 6 || tb.names.size() != tb.ips.size() ||
      tb.host_mbit <= 0 || tb.switch_ns.empty()) {
    return InvalidArgument("test bed '" + prefix +
                           "' needs 6 hosts or more (bench/testbed.sh up "
                           "--prefix " +
                           prefix + " --hosts 6)");
  }
  return tb;
}

// Runs `cmd` (ip, tc) and says whether it succeeded.
bool Sh(const std::string& cmd) { return std::system(cmd.c_str()) == 0; }

// tbf on a device's egress, as bench/testbed.sh shapes it.
std::string ShapeCommand(const std::string& ns, const std::string& dev,
                         int mbit) {
  const int64_t burst =
      std::max<int64_t>(65536, int64_t{mbit} * 1000 * 1000 / 8 * 2 / 1000);
  return "tc -n " + ns + " qdisc replace dev " + dev + " root tbf rate " +
         std::to_string(mbit) + "mbit burst " + std::to_string(burst) +
         " latency 20ms";
}

struct Proc {
  std::string name;
  bool reader = true;
  int host = -1;             // its test-bed host (-1: loopback)
  std::string data_address;  // its data server (HOST:PORT)
  std::unique_ptr<Subprocess> sub;
  std::atomic<bool> killed{false};
  std::atomic<int64_t> stopped_ms{0};  // total time it was kept stopped
  std::mutex mu;                       // guards holds
  std::optional<uint64_t> holds;       // committed version it serves
  // A version whose unpublish ran out of time: fenced (no longer served),
  // still draining; the trainer unpublishes it again before publishing.
  std::optional<uint64_t> draining;  // trainer thread only
};

struct Reply_ {
  bool answered = false;
  std::vector<std::string> words;
  int64_t call_ms = 0;
};

class Chaos {
 public:
  // ha: the number of hubs of an HA set on etcd, or 0 for one hub.
  // transport: the data plane every worker serves and reads, "tcp" or "ucx"
  // (then over UCX's wires of $UCX_TLS, which the workers inherit).
  // testbed: the prefix of a test bed to run on ("": loopback).
  Chaos(uint64_t seed, int rounds, int readers, uint64_t bytes, bool verbose,
        int ha, std::string transport, std::string testbed)
      : seed_(seed),
        rounds_(rounds),
        num_readers_(readers),
        bytes_(bytes),
        ha_(ha),
        transport_(std::move(transport)),
        testbed_prefix_(std::move(testbed)),
        rng_(seed) {
    env_ = {verbose ? "TENSORHUB_LOG=warn" : "TENSORHUB_LOG=error"};
    // One secret for every process of the run, as a deployment has: the
    // hostile peers do not know it.
    std::random_device rd;
    char secret[33];
    std::snprintf(secret, sizeof(secret), "%08x%08x%08x%08x", rd(), rd(), rd(),
                  rd());
    env_.push_back(std::string("TENSORHUB_SECRET=") + secret);
    for (int f = 0; f < kNumFaults; ++f) {
      if (f == kHubFailover && ha_ == 0) continue;
      if ((f == kPartition || f == kCrawl) && testbed_prefix_.empty()) continue;
      enabled_.push_back(static_cast<Fault>(f));
    }
    // UCX first, TCP as every worker's fallback: a worker whose UCX could
    // not start serves TCP only, which CheckFetched reports. Set either way:
    // the caller's own TENSORHUB_TRANSPORTS does not leak into a tcp run.
    env_.push_back(transport_ == "ucx" ? "TENSORHUB_TRANSPORTS=ucx,tcp"
                                       : "TENSORHUB_TRANSPORTS=tcp");
    // Its workers share one host, whose holders are read over TCP unless
    // this says otherwise.
    env_.push_back(transport_ == "ucx" ? "TENSORHUB_UCX_SAME_HOST=1"
                                       : "TENSORHUB_UCX_SAME_HOST=0");
    // Chaos runs UCX over tcp and shared memory, wires whose gets nothing
    // checks, which a worker uses only when told (docs/security.md).
    env_.push_back(transport_ == "ucx" ? "TENSORHUB_UCX_EMULATED_GETS=allow"
                                       : "TENSORHUB_UCX_EMULATED_GETS=refuse");
  }

  int Run() {
    int64_t t0 = NowMs();
    if (!testbed_prefix_.empty()) {
      if (ha_ > 0) return Fatal("--testbed runs one hub: leave --ha out");
      Result<TestBed> tb = LoadTestBed(testbed_prefix_);
      if (!tb.ok()) return Fatal(tb.status().ToString());
      testbed_ = std::move(tb).value();
    }
    if (ha_ > 0) {
      auto etcd = lab::EtcdProcess::Start();
      if (!etcd.ok()) return Fail(etcd.status());
      etcd_ = std::move(etcd).value();
      auto client = ha::EtcdClient::Create(etcd_->endpoint());
      if (!client.ok()) return Fail(client.status());
      etcd_client_ = std::move(client).value();
    }
    for (int i = 0; i < std::max(1, ha_); ++i) {
      if (testbed_.has_value()) {
        ports_.push_back(7300 + i);  // its own host: any port is free
      } else {
        Result<int> port = FreeLoopbackPort();
        if (!port.ok()) return Fail(port.status());
        ports_.push_back(*port);
      }
      hub_address_ += (i > 0 ? "," : "") + HubAddress(i);
    }
    hubs_.resize(ports_.size());
    for (size_t i = 0; i < ports_.size(); ++i) {
      if (!StartHub(static_cast<int>(i))) return 1;
    }
    trainer_ = Spawn(false);
    auditor_ = Spawn(true, "auditor");
    for (int i = 0; i < num_readers_; ++i) {
      readers_.push_back(Spawn(true, "", ReaderHost(i)));
    }
    if (!trainer_->sub || !auditor_->sub)
      return Fatal("could not start the workers");
    for (int r = 1; r <= rounds_; ++r) {
      round_ = r;
      RunRound();
      Audit();
      if (r % 10 == 0 || r == rounds_) {
        std::printf("chaos: round %d/%d, %d faults, %d violations (%.0f s)\n",
                    r, rounds_, TotalFaults(), violations_.load(),
                    (NowMs() - t0) / 1000.0);
        std::fflush(stdout);
      }
    }
    Shutdown();
    PrintSummary((NowMs() - t0) / 1000.0);
    return violations_.load() == 0 ? 0 : 1;
  }

 private:
  int Fatal(const std::string& why) {
    std::fprintf(stderr, "chaos: %s\n", why.c_str());
    Shutdown();
    return 1;
  }

  void Violation(const std::string& what) {
    ++violations_;
    std::lock_guard<std::mutex> l(print_mu_);
    std::printf("chaos: VIOLATION (seed %" PRIu64 ", round %d): %s\n", seed_,
                round_, what.c_str());
    std::fflush(stdout);
  }

  // Whether hub `i` accepts connections: on loopback, or from inside its
  // test-bed host's network namespace (a thread of this process enters it).
  bool Listening(int i) const {
    const std::string ip = HubIp();
    const int port = ports_[i];
    auto probe = [ip, port] {
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
      a.sin_port = htons(static_cast<uint16_t>(port));
      bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
      ::close(fd);
      return ok;
    };
    if (!testbed_.has_value()) return probe();
    bool ok = false;
    std::thread t([&] {
      const std::string ns = "/run/netns/" + testbed_->names[HubHost()];
      int nsfd = ::open(ns.c_str(), O_RDONLY | O_CLOEXEC);
      if (nsfd < 0) return;
      if (::setns(nsfd, CLONE_NEWNET) == 0) ok = probe();
      ::close(nsfd);
    });
    t.join();
    return ok;
  }

  // Test-bed hosts (--testbed): the hub on the last, the attacker before
  // it, the trainer on the first, readers and the auditor in between.
  int HubHost() const { return static_cast<int>(testbed_->names.size()) - 1; }
  int AttackerHost() const { return HubHost() - 1; }
  int ReaderHost(int i) const {
    return testbed_.has_value() ? 1 + i % (AttackerHost() - 1) : -1;
  }
  std::string HubIp() const {
    return testbed_.has_value() ? testbed_->ips[HubHost()] : "127.0.0.1";
  }
  std::vector<std::string> Wrapper(int host) const {
    if (!testbed_.has_value() || host < 0) return {};
    return {"ip", "netns", "exec", testbed_->names[host]};
  }

  std::string HubAddress(int i) const {
    return HubIp() + ":" + std::to_string(ports_[i]);
  }

  // Starts hub `i` (again) on its port; with --ha, one of the set.
  bool StartHub(int i) {
    std::vector<std::string> args = {"serve", "--listen", HubAddress(i),
                                     "--lease-ms", "2000"};
    if (ha_ > 0) {
      args.insert(args.end(),
                  {"--etcd", etcd_->endpoint(), "--etcd-lease-ms", "2000"});
    }
    auto hub = Subprocess::Spawn(
        args, env_, Wrapper(testbed_.has_value() ? HubHost() : -1));
    if (!hub.ok()) {
      Violation("hub did not start: " + hub.status().ToString());
      return false;
    }
    if (hubs_[i]) Untrack(hubs_[i]->pid());
    hubs_[i] = std::make_unique<Subprocess>(std::move(hub).value());
    Track(hubs_[i]->pid());
    Deadline d = Deadline::AfterMs(15000);
    while (!d.expired()) {
      if (Listening(i)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    Violation("hub did not listen within 15 s");
    return false;
  }

  // The hub etcd names the leader now; with one hub (or none named, an
  // election under way) hub `fallback`.
  int LeaderOr(int fallback) {
    if (ha_ == 0) return 0;
    auto r = etcd_client_->Range(ha::LeaderKey("/tensorhub/"), "", 0, 0,
                                 Deadline::AfterMs(2000));
    if (r.ok() && !r->kvs.empty()) {
      for (size_t i = 0; i < ports_.size(); ++i) {
        if (HubAddress(static_cast<int>(i)) == r->kvs[0].value) {
          return static_cast<int>(i);
        }
      }
    }
    return fallback;
  }

  // SIGKILL of hub `i`, restarted on its port after `pause_ms`.
  void KillAndRestartHub(int i, int64_t pause_ms) {
    ::kill(hubs_[i]->pid(), SIGCONT);
    ::kill(hubs_[i]->pid(), SIGKILL);
    hubs_[i]->Stop(1000);
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    StartHub(i);
  }

  // A worker; on a test bed, on `host` (-1: the trainer's or the
  // auditor's, by its role).
  std::unique_ptr<Proc> Spawn(bool reader, std::string name = "",
                              int host = -1) {
    auto p = std::make_unique<Proc>();
    p->reader = reader;
    p->name = name.empty() ? (reader ? "reader-" : "trainer-") +
                                 std::to_string(++spawned_)
                           : name;
    std::vector<std::string> args = {"_chaos-worker",
                                     "--hub",
                                     hub_address_,
                                     "--bytes",
                                     std::to_string(bytes_),
                                     "--seed",
                                     std::to_string(seed_),
                                     "--name",
                                     p->name};
    if (testbed_.has_value()) {
      if (host < 0) host = reader ? AttackerHost() - 1 : 0;
      p->host = host;
      args.insert(args.end(), {"--data-listen", testbed_->ips[host] + ":0"});
    }
    auto sub = Subprocess::Spawn(args, env_, Wrapper(p->host));
    if (!sub.ok()) {
      Violation("could not start " + p->name + ": " + sub.status().ToString());
      return p;
    }
    p->sub = std::make_unique<Subprocess>(std::move(sub).value());
    Track(p->sub->pid());
    auto ready = p->sub->ReadLine(Deadline::AfterMs(30000));
    if (!ready.ok() || *ready != "ready") {
      Violation(p->name + " did not come up: " +
                (ready.ok() ? *ready : ready.status().ToString()));
      p->sub.reset();
      return p;
    }
    // Where it serves, for the floods (asked before any traffic uses its
    // pipe).
    Reply_ a = Call(*p, "address", 5000);
    if (a.answered && a.words.size() == 3 && a.words[0] == "address") {
      p->data_address = a.words[2];
    }
    return p;
  }

  // Whether `p`'s process ended without the driver killing it: gone, or a
  // zombie (not reaped here: Subprocess::Stop does that).
  static bool DiedOnItsOwn(const Proc& p) {
    if (!p.sub || p.killed.load()) return false;
    std::ifstream stat("/proc/" + std::to_string(p.sub->pid()) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return true;
    // pid (comm) STATE ...: comm may hold spaces and parentheses.
    const size_t close = line.rfind(')');
    return close == std::string::npos || close + 2 >= line.size() ||
           line[close + 2] == 'Z' || line[close + 2] == 'X';
  }

  // Sends one command and waits for its reply; checks the call's time.
  Reply_ Call(Proc& p, const std::string& cmd, int64_t timeout_ms) {
    Reply_ r;
    if (!p.sub || p.killed.load()) return r;
    int64_t stopped0 = p.stopped_ms.load();
    if (!p.sub->Send(cmd).ok()) {
      if (!p.killed.load()) {
        Violation(p.name + " is gone, not killed by the driver (a crash: " +
                  "its stderr says why); '" + cmd + "' not sent");
      }
      return r;
    }
    // The driver's own bound: the worker's deadline, the slack, and the
    // longest its process can be stopped by one fault, twice.
    auto line = p.sub->ReadLine(
        Deadline::AfterMs(timeout_ms + kSlackMs + 2 * kMaxFaultMs));
    if (!line.ok()) {
      if (!p.killed.load()) {
        Violation(p.name + ": '" + cmd + "' did not answer (" +
                  line.status().ToString() + ")");
      }
      return r;
    }
    r.answered = true;
    r.words = Words(*line);
    // Anything else on the worker's stdout (a library printing there) is a
    // violation, not a crash of the driver.
    if (r.words.size() < 2 || !IsNumber(r.words[1]) ||
        (r.words[0] == "fetched" &&
         (r.words.size() < 4 || !IsNumber(r.words[2])))) {
      Violation(p.name + ": bad reply '" + *line + "' to '" + cmd + "'");
      r.answered = false;
      return r;
    }
    r.call_ms = std::stoll(r.words[1]);
    int64_t allowed = timeout_ms + kSlackMs + (p.stopped_ms.load() - stopped0);
    {
      std::lock_guard<std::mutex> l(stats_mu_);
      max_over_ms_ = std::max(max_over_ms_, r.call_ms - timeout_ms);
    }
    if (r.call_ms > allowed) {
      Violation(p.name + ": '" + cmd + "' took " + std::to_string(r.call_ms) +
                " ms, deadline " + std::to_string(timeout_ms) + " ms (+" +
                std::to_string(allowed - timeout_ms) + " allowed): " + *line);
    }
    if (r.words[0] == "error") {
      std::lock_guard<std::mutex> l(stats_mu_);
      ++errors_by_code_[r.words.size() > 2 ? r.words[2] : "?"];
    }
    return r;
  }

  uint64_t ExpectedDigest(uint64_t v) {
    std::lock_guard<std::mutex> l(digest_mu_);
    auto it = digests_.find(v);
    if (it != digests_.end()) return it->second;
    SyntheticModel m(ChaosLayout(bytes_));
    m.Fill(ContentKey(seed_, v));
    return digests_[v] = m.Digest();
  }

  // Checks a "fetched MS V DIGEST ..." reply; returns the version or nullopt.
  std::optional<uint64_t> CheckFetched(const Proc& p, const Reply_& r) {
    if (r.words.size() < 4) {
      Violation(p.name + ": bad fetch reply");
      return std::nullopt;
    }
    uint64_t v = std::stoull(r.words[2]);
    if (r.words[3] != Hex(ExpectedDigest(v))) {
      Violation(p.name + " fetched version " + std::to_string(v) +
                " with digest " + r.words[3] + ", published " +
                Hex(ExpectedDigest(v)));
    }
    std::lock_guard<std::mutex> l(stats_mu_);
    if (aborted_.count(v)) {
      Violation(p.name + " fetched version " + std::to_string(v) +
                " whose trainer died before commit");
    }
    // Every worker serves the run's transport: a chunk that came over
    // another one means a worker did not, and the run tests less than it
    // says.
    if (r.words.size() > 7 && r.words[7] != "-" && r.words[7] != transport_) {
      Violation(p.name + " fetched version " + std::to_string(v) + " over " +
                r.words[7] + " in a " + transport_ + " run");
    }
    return v;
  }

  void SetHolds(Proc& p, std::optional<uint64_t> v) {
    std::lock_guard<std::mutex> l(p.mu);
    p.holds = v;
  }

  struct Plan {
    std::vector<std::pair<Fault, int64_t>>
        faults;  // kind, start (ms into the round)
    std::vector<int64_t> reader_delay_ms;
    std::vector<int> reader_pick;  // 0 latest, 1 an older held version
    std::vector<bool> reader_unpublish;
    std::vector<uint64_t> targets;   // raw draws for picking victims
    std::vector<int64_t> durations;  // per fault
    bool trainer_group = false;
  };

  Plan Draw() {
    Plan p;
    int n = 1 + static_cast<int>(rng_() % 3 == 0);
    for (int i = 0; i < n; ++i) {
      Fault f = enabled_[rng_() % enabled_.size()];
      if (f == kKillTrainer) p.trainer_group = true;
      p.faults.push_back({f, static_cast<int64_t>(rng_() % 400)});
      p.targets.push_back(rng_());
      p.durations.push_back(500 +
                            static_cast<int64_t>(rng_() % (kMaxFaultMs - 500)));
    }
    std::sort(p.faults.begin(), p.faults.end(),
              [](const auto& a, const auto& b) { return a.second < b.second; });
    for (int i = 0; i < num_readers_; ++i) {
      p.reader_delay_ms.push_back(static_cast<int64_t>(rng_() % 300));
      p.reader_pick.push_back(rng_() % 5 == 0 ? 1 : 0);
      p.reader_unpublish.push_back(rng_() % 6 == 0);
    }
    return p;
  }

  std::vector<std::pair<uint64_t, std::string>> HeldVersions() {
    std::vector<std::pair<uint64_t, std::string>> out;
    auto add = [&](Proc& p) {
      std::lock_guard<std::mutex> l(p.mu);
      if (p.sub && !p.killed.load() && p.holds)
        out.push_back({*p.holds, p.name});
    };
    add(*trainer_);
    for (auto& r : readers_) add(*r);
    return out;
  }

  void TrainerTraffic(bool group) {
    Proc& t = *trainer_;
    std::optional<uint64_t> held;
    {
      std::lock_guard<std::mutex> l(t.mu);
      held = t.holds;
    }
    if (!held) held = t.draining;
    if (held) {
      Reply_ r = Call(t,
                      "unpublish " + std::to_string(*held) + " " +
                          std::to_string(kUnpublishTimeoutMs),
                      kUnpublishTimeoutMs);
      Count(r, &unpublish_ok_, &unpublish_failed_);
      // Refused or not, the registration is fenced: it serves no more.
      SetHolds(t, std::nullopt);
      if (!r.answered || r.words[0] != "ok") {
        t.draining = held;  // publishing into it would be refused
        return;
      }
      t.draining.reset();
    }
    uint64_t v = ++next_version_;
    Reply_ r =
        Call(t,
             "publish " + std::to_string(v) + " 0 " + (group ? "2 " : "1 ") +
                 std::to_string(kPublishTimeoutMs),
             kPublishTimeoutMs);
    Count(r, &publish_ok_, &publish_failed_);
    if (r.answered && r.words[0] == "ok") {
      if (group) {
        std::lock_guard<std::mutex> l(stats_mu_);
        aborted_.insert(v);
        pending_published_ = true;
        pending_cv_.notify_all();
      } else {
        SetHolds(t, v);
      }
    }
  }

  void ReaderTraffic(Proc& p, int64_t delay_ms, int pick, bool unpublish,
                     std::optional<uint64_t> older) {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    std::string which = pick == 1 && older ? std::to_string(*older) : "latest";
    std::optional<uint64_t> held;
    {
      std::lock_guard<std::mutex> l(p.mu);
      held = p.holds;
      p.holds.reset();  // the fetch unpublishes what the buffer served
    }
    Reply_ r =
        Call(p, "fetch " + which + " " + std::to_string(kFetchTimeoutMs) + " 1",
             kFetchTimeoutMs);
    Count(r, &fetch_ok_, &fetch_failed_, "fetched");
    if (!r.answered) return;
    if (r.words[0] == "fetched") {
      std::optional<uint64_t> v = CheckFetched(p, r);
      SetHolds(p, v);
      if (unpublish && v) {
        Reply_ u = Call(p,
                        "unpublish " + std::to_string(*v) + " " +
                            std::to_string(kUnpublishTimeoutMs),
                        kUnpublishTimeoutMs);
        Count(u, &unpublish_ok_, &unpublish_failed_);
        SetHolds(p, std::nullopt);  // fenced even if the drain ran out of time
      }
    }
    (void)held;
  }

  void Count(const Reply_& r, std::atomic<int>* ok, std::atomic<int>* failed,
             const char* ok_word = "ok") {
    if (!r.answered) {
      ++calls_lost_to_kill_;
    } else if (r.words[0] == ok_word) {
      ++*ok;
    } else {
      ++*failed;
    }
  }

  Proc* PickTarget(uint64_t draw, bool holders_only) {
    std::vector<Proc*> c;
    auto consider = [&](Proc& p) {
      if (!p.sub || p.killed.load()) return;
      std::lock_guard<std::mutex> l(p.mu);
      if (!holders_only || p.holds) c.push_back(&p);
    };
    consider(*trainer_);
    for (auto& r : readers_) consider(*r);
    if (c.empty()) return nullptr;
    return c[draw % c.size()];
  }

  void Kill(Proc& p) {
    p.killed.store(true);
    ::kill(p.sub->pid(), SIGCONT);  // a stopped process dies only once it runs
    ::kill(p.sub->pid(), SIGKILL);
  }

  void StopFor(Proc& p, int64_t ms, bool duty_cycle) {
    Deadline d = Deadline::AfterMs(ms);
    while (!d.expired() && !p.killed.load()) {
      int64_t t = NowMs();
      ::kill(p.sub->pid(), SIGSTOP);
      int64_t stop = duty_cycle ? 40 : std::max<int64_t>(d.remaining_ms(), 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(stop));
      ::kill(p.sub->pid(), SIGCONT);
      p.stopped_ms += NowMs() - t;
      if (duty_cycle)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  void Inject(Fault f, uint64_t draw, int64_t duration_ms) {
    switch (f) {
      case kKillHolder:
      case kStop:
      case kSlow: {
        Proc* p = PickTarget(draw, /*holders_only=*/true);
        if (p == nullptr) p = PickTarget(draw, false);
        if (p == nullptr) return;
        ++faults_[f];
        if (f == kKillHolder) {
          Kill(*p);
        } else {
          StopFor(*p, duration_ms, f == kSlow);
        }
        return;
      }
      case kKillReader: {
        Proc& p = *readers_[draw % readers_.size()];
        if (!p.sub || p.killed.load()) return;
        ++faults_[f];
        Kill(p);
        return;
      }
      case kKillTrainer: {
        // Wait for rank 0 of the group to be published, then kill it.
        std::unique_lock<std::mutex> l(stats_mu_);
        pending_cv_.wait_for(
            l, std::chrono::milliseconds(kPublishTimeoutMs + kSlackMs),
            [&] { return pending_published_; });
        if (!pending_published_) return;
        l.unlock();
        ++faults_[f];
        Kill(*trainer_);
        return;
      }
      case kHubRestart: {
        ++faults_[f];
        KillAndRestartHub(static_cast<int>(draw % hubs_.size()),
                          200 + duration_ms % 800);
        return;
      }
      case kHubStop: {
        ++faults_[f];
        const int i = LeaderOr(static_cast<int>(draw % hubs_.size()));
        ::kill(hubs_[i]->pid(), SIGSTOP);
        std::this_thread::sleep_for(std::chrono::milliseconds(duration_ms));
        ::kill(hubs_[i]->pid(), SIGCONT);
        return;
      }
      case kHubFailover: {
        ++faults_[f];
        KillAndRestartHub(LeaderOr(static_cast<int>(draw % hubs_.size())),
                          200 + duration_ms % 800);
        return;
      }
      case kFloodHub: {
        const int i = LeaderOr(static_cast<int>(draw % hubs_.size()));
        ++faults_[f];
        Flood(hubs_[i]->pid(), HubAddress(i), "hub", duration_ms, draw);
        return;
      }
      case kFloodHolder: {
        Proc* p = PickTarget(draw, /*holders_only=*/true);
        if (p == nullptr) p = PickTarget(draw, false);
        if (p == nullptr || p->data_address.empty()) return;
        ++faults_[f];
        Flood(p->sub->pid(), p->data_address, "data", duration_ms, draw);
        return;
      }
      case kPartition:
      case kCrawl: {
        // Any host with a worker or the hub on it (not the attacker's).
        std::vector<int> hosts = {0, HubHost()};
        for (int h = 1; h < AttackerHost(); ++h) hosts.push_back(h);
        const int h = hosts[draw % hosts.size()];
        ++faults_[f];
        const std::string& ns = testbed_->names[h];
        const std::string peer = "h" + std::to_string(h);  // bench/testbed.sh
        bool ok = true;
        if (f == kPartition) {
          ok = Sh("ip -n " + ns + " link set eth0 down");
          std::this_thread::sleep_for(std::chrono::milliseconds(duration_ms));
          ok = Sh("ip -n " + ns + " link set eth0 up") && ok;
        } else {
          ok = Sh(ShapeCommand(ns, "eth0", kCrawlMbit)) &&
               Sh(ShapeCommand(testbed_->switch_ns, peer, kCrawlMbit));
          std::this_thread::sleep_for(std::chrono::milliseconds(duration_ms));
          ok = Sh(ShapeCommand(ns, "eth0", testbed_->host_mbit)) &&
               Sh(ShapeCommand(testbed_->switch_ns, peer,
                               testbed_->host_mbit)) &&
               ok;
        }
        if (!ok)
          Violation(std::string(kFaultNames[f]) + " of " + ns + " failed");
        return;
      }
      case kNumFaults:
        return;
    }
  }

  // A hostile peer without the secret attacks `address` (a hub, or a
  // holder's data port) of process `pid` for `ms`. Nothing may be served
  // to it; the target's memory may grow by kMaxFloodRssBytes at most; its
  // descriptors come back (within kFloodFdSlack) once the attacker is
  // gone. Every other check of the round (deadlines, bytes, availability)
  // runs as usual meanwhile.
  void Flood(pid_t pid, const std::string& address, const std::string& kind,
             int64_t ms, uint64_t draw) {
    const uint64_t rss0 = RssBytes(pid);
    const size_t fds0 = Descriptors(pid);
    std::vector<std::string> args = {
        "_chaos-attacker",  "--target", address,
        "--kind",           kind,       "--ms",
        std::to_string(ms), "--seed",   std::to_string(draw)};
    // Another address than the workers': on loopback 127.0.0.2, on a test
    // bed a host of its own.
    if (!testbed_.has_value()) args.insert(args.end(), {"--from", "127.0.0.2"});
    auto sub =
        Subprocess::Spawn(args, env_without_secret(),
                          Wrapper(testbed_.has_value() ? AttackerHost() : -1));
    if (!sub.ok()) {
      Violation("the attacker did not start: " + sub.status().ToString());
      return;
    }
    Track(sub->pid());
    uint64_t rss_peak = rss0;
    size_t fds_peak = fds0;
    Result<std::string> line = Unavailable("not yet");
    const Deadline d = Deadline::AfterMs(ms + 20000);
    while (!d.expired()) {
      line = sub->ReadLine(Deadline::AfterMs(50));
      rss_peak = std::max(rss_peak, RssBytes(pid));
      fds_peak = std::max(fds_peak, Descriptors(pid));
      if (line.ok() || line.status().code() != StatusCode::kDeadlineExceeded) {
        break;
      }
    }
    sub->Stop(1000);
    Untrack(sub->pid());
    if (!line.ok()) {
      Violation("the " + kind +
                " attacker did not finish: " + line.status().ToString());
      return;
    }
    std::vector<std::string> w = Words(*line);
    std::map<std::string, uint64_t> n;
    for (size_t i = 2; i < w.size(); ++i) {
      const size_t eq = w[i].find('=');
      if (eq != std::string::npos && IsNumber(w[i].substr(eq + 1))) {
        n[w[i].substr(0, eq)] = std::stoull(w[i].substr(eq + 1));
      }
    }
    if (w.empty() || w[0] != "attacked" || n.count("served") == 0) {
      Violation("the " + kind + " attacker said '" + *line + "'");
      return;
    }
    if (n["served"] > 0) {
      Violation("a peer without the secret was served by " + address + ": " +
                *line);
    }
    // Gone with the attacker: the target's descriptors come back. The
    // target may have been killed or restarted meanwhile (then no check).
    size_t fds_after = Descriptors(pid);
    const Deadline settle = Deadline::AfterMs(15000);
    while (fds_after > fds0 + kFloodFdSlack && !settle.expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      fds_after = Descriptors(pid);
    }
    const uint64_t grew = rss_peak > rss0 ? rss_peak - rss0 : 0;
    if (rss0 > 0 && grew > kMaxFloodRssBytes) {
      Violation(kind + " flood: " + address + "'s memory grew by " +
                std::to_string(grew >> 20) + " MiB (bound " +
                std::to_string(kMaxFloodRssBytes >> 20) + " MiB)");
    }
    if (fds_after > 0 && fds_after > fds0 + kFloodFdSlack) {
      Violation(kind + " flood: " + address + " holds " +
                std::to_string(fds_after) + " descriptors 15 s after it, " +
                std::to_string(fds0) + " before");
    }
    std::lock_guard<std::mutex> l(stats_mu_);
    FloodStats& fs = kind == "hub" ? hub_floods_ : holder_floods_;
    fs.max_rss_growth = std::max(fs.max_rss_growth, grew);
    fs.max_fd_growth = std::max<size_t>(fs.max_fd_growth,
                                        fds_peak > fds0 ? fds_peak - fds0 : 0);
    fs.refused += n["refused"];
    fs.tries += n["tries"];
    fs.idle += n["idle"] + n["reopened"];
    fs.garbage += n["garbage"];
  }

  std::vector<std::string> env_without_secret() const {
    std::vector<std::string> env;
    for (const std::string& e : env_) {
      if (e.rfind("TENSORHUB_SECRET=", 0) != 0) env.push_back(e);
    }
    env.push_back("TENSORHUB_SECRET=");
    return env;
  }

  void RunRound() {
    Plan plan = Draw();
    {
      std::lock_guard<std::mutex> l(stats_mu_);
      pending_published_ = false;
    }
    std::vector<std::pair<uint64_t, std::string>> held = HeldVersions();
    std::vector<std::thread> traffic;
    traffic.emplace_back([this, g = plan.trainer_group] { TrainerTraffic(g); });
    for (int i = 0; i < num_readers_; ++i) {
      std::optional<uint64_t> older;
      if (!held.empty()) older = held[plan.targets[0] % held.size()].first;
      traffic.emplace_back([this, i, &plan, older] {
        ReaderTraffic(*readers_[i], plan.reader_delay_ms[i],
                      plan.reader_pick[i], plan.reader_unpublish[i], older);
      });
    }
    int64_t start = NowMs();
    for (size_t i = 0; i < plan.faults.size(); ++i) {
      int64_t wait = plan.faults[i].second - (NowMs() - start);
      if (wait > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(wait));
      Inject(plan.faults[i].first, plan.targets[i], plan.durations[i]);
    }
    for (std::thread& t : traffic) t.join();
    if (plan.trainer_group && !trainer_->killed.load() && trainer_->sub) {
      // The kill did not happen (the publish failed or came too late): end
      // the group's version the ordinary way, which aborts it too.
      Reply_ r = Call(*trainer_,
                      "unpublish " + std::to_string(next_version_) + " " +
                          std::to_string(kUnpublishTimeoutMs),
                      kUnpublishTimeoutMs);
      Count(r, &unpublish_ok_, &unpublish_failed_);
    }
    // A worker that ended without being killed crashed: a violation (a
    // library aborting the process counts), then replaced like the killed.
    for (Proc* p : std::vector<Proc*>{trainer_.get(), auditor_.get()}) {
      if (DiedOnItsOwn(*p)) {
        Violation(p->name + " died without being killed (a crash: its " +
                  "stderr says why)");
        p->killed.store(true);
      }
    }
    for (auto& r : readers_) {
      if (DiedOnItsOwn(*r)) {
        Violation(r->name +
                  " died without being killed (a crash: its stderr says why)");
        r->killed.store(true);
      }
    }
    if (auditor_->killed.load()) {
      auditor_->sub->Stop(1000);
      Untrack(auditor_->sub->pid());
      auditor_ = Spawn(true, "auditor");
    }
    // Replace what was killed (a fresh process holds nothing).
    if (trainer_->killed.load()) {
      trainer_->sub->Stop(1000);
      Untrack(trainer_->sub->pid());
      trainer_ = Spawn(false);
    }
    for (auto& r : readers_) {
      if (r->killed.load()) {
        r->sub->Stop(1000);
        Untrack(r->sub->pid());
        r = Spawn(true, "", r->host);
      }
    }
    for (Proc* p : std::vector<Proc*>{trainer_.get(), auditor_.get()}) {
      if (!p->sub) Violation("a worker could not be restarted");
    }
  }

  // After the faults: every committed version a live worker holds is
  // fetchable with the right bytes; every aborted version stays invisible.
  void Audit() {
    std::map<uint64_t, std::vector<std::string>> held;
    for (auto& [v, who] : HeldVersions()) held[v].push_back(who);
    Deadline settle = Deadline::AfterMs(kSettleMs);
    for (auto& [v, who] : held) {
      std::string last;
      bool ok = false;
      while (!ok && !settle.expired()) {
        Reply_ r =
            Call(*auditor_, "fetch " + std::to_string(v) + " 8000 0", 8000);
        if (!r.answered) break;
        if (r.words[0] == "fetched") {
          CheckFetched(*auditor_, r);
          ok = true;
        } else {
          last.clear();
          for (size_t i = 2; i < r.words.size(); ++i) last += r.words[i] + " ";
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
      }
      if (ok) {
        ++audits_ok_;
      } else {
        std::string names;
        for (auto& n : who) names += n + " ";
        Violation("committed version " + std::to_string(v) + " held by live " +
                  names + "could not be fetched within " +
                  std::to_string(kSettleMs) + " ms: " + last);
      }
    }
    std::set<uint64_t> aborted;
    {
      std::lock_guard<std::mutex> l(stats_mu_);
      aborted = aborted_;
    }
    for (uint64_t v : aborted) {
      if (audited_aborted_.count(v)) continue;
      std::string state;
      while (!settle.expired()) {
        Reply_ r = Call(*auditor_, "describe " + std::to_string(v), 1000);
        if (!r.answered) break;
        state = r.words.size() > 2 ? r.words[2] : "?";
        // Still pending (the lease of the dead rank has not run out), or the
        // hub not answering yet (restarting, stopped): ask again.
        if ((r.words[0] == "state" && state == "PENDING") ||
            (r.words[0] == "error" &&
             (state == "UNAVAILABLE:" || state == "DEADLINE_EXCEEDED:"))) {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          continue;
        }
        break;
      }
      // Aborted, or forgotten by a restarted hub (NOT_FOUND): never visible.
      if (state != "ABORTED" && state != "NOT_FOUND:") {
        Violation("version " + std::to_string(v) +
                  " whose trainer died before commit is '" + state +
                  "', not aborted");
      }
      Reply_ f =
          Call(*auditor_, "fetch " + std::to_string(v) + " 2000 0", 2000);
      if (f.answered && f.words[0] == "fetched") {
        Violation("version " + std::to_string(v) +
                  " whose trainer died before commit was fetched");
      } else if (f.answered) {
        ++aborted_refused_;
      }
      audited_aborted_.insert(v);
    }
  }

  int TotalFaults() const {
    int n = 0;
    for (const auto& f : faults_) n += f.load();
    return n;
  }

  void Shutdown() {
    auto stop = [](std::unique_ptr<Proc>& p) {
      if (p && p->sub) p->sub->Stop(3000);
    };
    stop(trainer_);
    stop(auditor_);
    for (auto& r : readers_) stop(r);
    for (auto& h : hubs_) {
      if (h) h->Stop(3000);
    }
  }

  // "tcp", or "ucx (UCX_TLS=...)".
  std::string DataPlaneName() const {
    if (transport_ != "ucx") return transport_;
    const char* tls = std::getenv("UCX_TLS");
    return "ucx (UCX_TLS=" + std::string(tls != nullptr ? tls : "all") + ")";
  }

  void PrintSummary(double seconds) {
    std::printf(
        "chaos: seed %" PRIu64
        ", %d rounds, %d readers, %s per version, %s, data plane %s, %.0f "
        "s\n",
        seed_, rounds_, num_readers_, FormatBytes(bytes_).c_str(),
        ha_ > 0
            ? ("an HA set of " + std::to_string(ha_) + " hubs on etcd").c_str()
        : testbed_.has_value()
            ? ("one hub, on test bed " + testbed_prefix_ + " (" +
               std::to_string(testbed_->names.size()) + " hosts, " +
               std::to_string(testbed_->host_mbit) + " Mbit/s links)")
                  .c_str()
            : "one hub",
        DataPlaneName().c_str(), seconds);
    std::printf("chaos: faults %d:", TotalFaults());
    for (Fault f : enabled_) {
      std::printf(" %s %d", kFaultNames[f], faults_[f].load());
    }
    std::printf("\n");
    for (const auto* fs : {&hub_floods_, &holder_floods_}) {
      std::printf(
          "chaos: %s floods: %llu connections held, %llu of garbage, %llu "
          "%s without the secret (%llu refused, 0 served); the target's "
          "memory +%.1f MiB at most (bound %llu MiB), descriptors +%zu at "
          "most\n",
          fs == &hub_floods_ ? "hub" : "holder",
          static_cast<unsigned long long>(fs->idle),
          static_cast<unsigned long long>(fs->garbage),
          static_cast<unsigned long long>(fs->tries),
          fs == &hub_floods_ ? "calls" : "handshakes",
          static_cast<unsigned long long>(fs->refused),
          fs->max_rss_growth / 1048576.0,
          static_cast<unsigned long long>(kMaxFloodRssBytes >> 20),
          fs->max_fd_growth);
    }
    std::printf(
        "chaos: fetches ok %d, failed cleanly %d; publishes ok %d, failed "
        "cleanly %d; "
        "unpublishes ok %d, failed cleanly %d; calls cut by a kill %d\n",
        fetch_ok_.load(), fetch_failed_.load(), publish_ok_.load(),
        publish_failed_.load(), unpublish_ok_.load(), unpublish_failed_.load(),
        calls_lost_to_kill_.load());
    std::printf(
        "chaos: audits: %d held versions fetched after their round, %d aborted "
        "versions refused\n",
        audits_ok_, aborted_refused_);
    std::printf("chaos: clean failures by code:");
    for (auto& [code, n] : errors_by_code_)
      std::printf(" %s %d", code.c_str(), n);
    std::printf("\nchaos: longest call beyond its deadline %" PRId64
                " ms (allowed %" PRId64 " ms + time its process was stopped)\n",
                std::max<int64_t>(max_over_ms_, 0), kSlackMs);
    std::printf("chaos: violations %d\n", violations_.load());
    std::fflush(stdout);
  }

  const uint64_t seed_;
  const int rounds_;
  const int num_readers_;
  const uint64_t bytes_;
  const int ha_;
  const std::string transport_;
  const std::string testbed_prefix_;
  std::optional<TestBed> testbed_;  // set by Run with --testbed
  std::vector<Fault> enabled_;      // the kinds this run draws
  std::mt19937_64 rng_;
  std::vector<std::string> env_;
  // --ha: etcd, and a client to ask it who leads (declared before the hubs:
  // it outlives them).
  std::unique_ptr<lab::EtcdProcess> etcd_;
  std::unique_ptr<ha::EtcdClient> etcd_client_;
  std::vector<int> ports_;   // one per hub
  std::string hub_address_;  // every hub's, comma-separated
  std::vector<std::unique_ptr<Subprocess>> hubs_;
  std::unique_ptr<Proc> trainer_, auditor_;
  std::vector<std::unique_ptr<Proc>> readers_;
  int spawned_ = 0;
  int round_ = 0;
  uint64_t next_version_ = 0;

  std::atomic<int> violations_{0};
  std::atomic<int> faults_[kNumFaults] = {};
  std::atomic<int> fetch_ok_{0}, fetch_failed_{0}, publish_ok_{0},
      publish_failed_{0};
  std::atomic<int> unpublish_ok_{0}, unpublish_failed_{0},
      calls_lost_to_kill_{0};
  int audits_ok_ = 0, aborted_refused_ = 0;
  std::set<uint64_t> audited_aborted_;

  std::mutex stats_mu_;
  std::condition_variable pending_cv_;
  bool pending_published_ = false;             // guarded by stats_mu_
  std::set<uint64_t> aborted_;                 // guarded by stats_mu_
  std::map<std::string, int> errors_by_code_;  // guarded by stats_mu_
  int64_t max_over_ms_ = 0;                    // guarded by stats_mu_
  struct FloodStats {
    uint64_t idle = 0, garbage = 0, tries = 0, refused = 0;
    uint64_t max_rss_growth = 0;
    size_t max_fd_growth = 0;
  };
  FloodStats hub_floods_, holder_floods_;  // guarded by stats_mu_
  std::mutex digest_mu_;
  std::map<uint64_t, uint64_t> digests_;  // guarded by digest_mu_
  std::mutex print_mu_;
};

struct ChaosFlags {
  uint64_t seed = 1;
  uint64_t rounds = 30;
  uint64_t readers = 4;
  uint64_t bytes = 0;
  bool verbose = false;
  uint64_t ha = 0;  // hubs of an HA set on a loopback etcd (0: one hub)
  std::string transport = "tcp";
  std::string testbed;
};

int RunChaos(const ChaosFlags& f) {
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGINT, KillChildrenAndExit);
  ::signal(SIGTERM, KillChildrenAndExit);
  SetLogPrefix("chaos");
  Chaos chaos(f.seed, static_cast<int>(f.rounds), static_cast<int>(f.readers),
              f.bytes, f.verbose, static_cast<int>(f.ha), f.transport,
              f.testbed);
  return chaos.Run();
}

}  // namespace

void AddChaosCommands(CommandLine& cl) {
  auto f = std::make_shared<ChaosFlags>();
  CLI::App* c = cl.Add(
      "chaos",
      "seeded fault injection (kill, stop, slow, hub stop/restart, hostile "
      "peers without the secret; on a test bed, link cuts and crawls) on "
      "real processes; checks bytes, deadlines, availability, what the "
      "attackers got; exit 1 on any violation",
      [f] { return RunChaos(*f); });
  c->add_option("--seed", f->seed, "the fault schedule's seed (replays it)")
      ->capture_default_str();
  c->add_option("--rounds", f->rounds, "rounds of faults")
      ->check(CLI::Range(uint64_t{1}, uint64_t{100000}))
      ->capture_default_str();
  c->add_option("--readers", f->readers, "reader processes")
      ->check(CLI::Range(uint64_t{1}, uint64_t{32}))
      ->capture_default_str();
  AddBytesOption(c, "--bytes", &f->bytes, "4MiB", "the version's size")
      ->check(CLI::Range(uint64_t{64} << 10, uint64_t{1} << 30));
  c->add_flag("--verbose", f->verbose, "print every step");
  c->add_option("--ha", f->ha,
                "an HA set of N hubs on a loopback etcd, with hub failovers "
                "(0: one hub)")
      ->check(CLI::IsMember({0, 2, 3, 4, 5}))
      ->type_name("N")
      ->capture_default_str();
  c->add_option("--transport", f->transport,
                "the data plane every worker serves and reads: tcp, or ucx "
                "(over UCX's wires of $UCX_TLS; TCP stays each worker's "
                "fallback, and a fetch that used it is a violation)")
      ->check(CLI::IsMember({"tcp", "ucx"}))
      ->capture_default_str();
  c->add_option("--testbed", f->testbed,
                "run every process on the hosts of this test bed "
                "(bench/testbed.sh up --prefix P --hosts 6), with network "
                "faults: a host's link cut and healed, slowed to a crawl")
      ->type_name("PREFIX");

  auto w = std::make_shared<ChaosWorkerFlags>();
  c = cl.Add("_chaos-worker", "a worker process of chaos",
             [w] { return RunChaosWorker(*w); });
  c->add_option("--hub", w->hub)->required();
  c->add_option("--name", w->name);
  c->add_option("--bytes", w->bytes);
  c->add_option("--chunk-bytes", w->chunk_bytes);
  c->add_option("--seed", w->seed);
  c->add_option("--data-listen", w->data_listen);
  AddAttackerCommand(cl);
}

}  // namespace tensorhub::cli
