#include "test_roles.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "cli_util.h"
#include "client/keeper.h"
#include "common/deadline.h"
#include "common/log.h"
#include "common/test_point.h"
#include "demo_model.h"
#include "fetch_pause.h"
#include "hub/hub_service.h"
#include "subprocess.h"
#include "tensorhub/client.h"

namespace tensorhub::testing {
namespace {

using cli::Hex;
using cli::Reply;

constexpr char kModel[] = "test-model";

// Every role's flags (each role reads the ones it needs).
struct RoleFlags {
  std::string role;
  std::string hub;
  int port = 0;
  int64_t lease_ms = 2000;
  uint64_t bytes = 0;
  std::string name = "reader";
  std::string etcd;  // an HA hub set's etcd endpoints (ha_test.cc)
  int64_t etcd_lease_ms = 2000;
  int64_t rebuild_ms = -1;  // -1: the hub's default
  std::string secret;       // the shared secret, of every role
  // The hub's bounds (hostile_test.cc); 0: the hub's default.
  uint32_t max_connections_per_peer = 0;
  int64_t idle_connection_ms = 0;
  int64_t handshake_timeout_ms = 0;
  bool accept_request_secret = false;
  int connections = 0;  // a reader's fetch streams; 0: the default
  // A trainer holds each thread that serves a reader's second or later UCX
  // read right before it first progresses that connection's worker (the
  // test point "ucx.progress_next": the read's pieces are being sent),
  // says "held" once, and lets them go on "release". (Named when the
  // reader's gets waited there.)
  bool hold_answering_gets = false;
  // A reader says "issued" once one of its fetch streams was granted its
  // second or later UCX read and waits for its pieces (the test point
  // "ucx.read_granted"; named when the reader sent gets there).
  bool say_gets_issued = false;
};

int RunHub(const RoleFlags& f) {
  hub::HubServerOptions o;
  o.listen_address = "127.0.0.1:" + std::to_string(f.port);
  o.lease_ms = f.lease_ms;
  o.etcd_endpoints = f.etcd;
  o.etcd_lease_ms = f.etcd_lease_ms;
  if (f.rebuild_ms >= 0) o.rebuild_ms = f.rebuild_ms;
  o.secret = f.secret;
  if (f.max_connections_per_peer > 0) {
    o.max_connections_per_peer = f.max_connections_per_peer;
  }
  if (f.idle_connection_ms > 0) o.idle_connection_ms = f.idle_connection_ms;
  if (f.handshake_timeout_ms > 0) {
    o.handshake_timeout_ms = f.handshake_timeout_ms;
  }
  o.accept_request_secret = f.accept_request_secret;
  cli::BlockStopSignals();
  SetLogPrefix("hub");
  auto server = hub::HubServer::Start(o);
  if (!server.ok()) return cli::Fail(server.status());
  Reply("ready " + (*server)->address());
  // Its stdin closes when the test goes away, however it went (a test binary
  // that died keeps no hub running, whose inherited stderr would keep ctest
  // waiting for the test's output until its timeout).
  std::thread([] {
    std::string line;
    while (std::getline(std::cin, line)) {
    }
    ::kill(::getpid(), SIGTERM);
  }).detach();
  cli::WaitForStopSignal();
  (*server)->Shutdown();
  return 0;
}

Result<std::unique_ptr<Client>> Connect(const RoleFlags& f, const char* name) {
  ClientOptions o;
  o.hub_address = f.hub;
  o.name = name;
  o.heartbeat_interval_ms = 200;
  o.rpc_timeout_ms = 2000;
  o.secret = f.secret;
  return Client::Connect(o);
}

// --hold-answering-gets (RoleFlags): the threads of this process held at
// "ucx.progress_next" until "release".
class AnsweringHold {
 public:
  AnsweringHold() {
    testpoint::Arm("ucx.reply_sent", [](uint64_t) { ++t_replies; });
    testpoint::Arm("ucx.progress_next", [this](uint64_t) { MaybeHold(); });
  }
  ~AnsweringHold() {
    Release();
    testpoint::Disarm("ucx.reply_sent");
    testpoint::Disarm("ucx.progress_next");
  }
  void Release() {
    std::lock_guard<std::mutex> l(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  void MaybeHold() {
    // Only a serving thread between its reply and its first progress call
    // for it, on a connection whose endpoint is wired up (a second read).
    if (t_replies < 2 || t_held_for == t_replies) return;
    t_held_for = t_replies;
    std::unique_lock<std::mutex> l(mu_);
    if (released_) return;
    if (!said_) {
      said_ = true;
      Reply("held");
    }
    cv_.wait(l, [this] { return released_; });
  }
  static thread_local int t_replies;
  static thread_local int t_held_for;
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;  // guarded by mu_
  bool said_ = false;      // guarded by mu_
};
thread_local int AnsweringHold::t_replies = 0;
thread_local int AnsweringHold::t_held_for = 0;

int RunTrainer(const RoleFlags& f) {
  SetLogPrefix("trainer");
  cli::SyntheticModel model(TestLayout(f.bytes));
  auto client = Connect(f, "trainer");
  if (!client.ok()) return cli::Fail(client.status());
  // After the client: gone (its threads let go) before the client's server
  // joins them.
  std::optional<AnsweringHold> hold;
  if (f.hold_answering_gets) hold.emplace();
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    uint64_t v = 0;
    in >> cmd >> v;
    if (cmd == "publish") {
      model.Fill(v);
      PublishOptions po;
      if (!(in >> po.rank >> po.group_size)) po = PublishOptions{};
      Status s = (*client)->Publish(kModel, Version(v), model.tensors(), po);
      Reply(s.ok()
                ? "published " + std::to_string(v) + " " + Hex(model.Digest())
                : "error " + s.ToString());
    } else if (cmd == "unpublish") {
      Status s = (*client)->Unpublish(kModel, Version(v), 30000);
      Reply(s.ok() ? "unpublished " + std::to_string(v)
                   : "error " + s.ToString());
    } else if (cmd == "address") {
      Reply("address " + (*client)->data_address());
    } else if (cmd == "release" && hold.has_value()) {
      hold->Release();
      Reply("released");
    } else {
      break;
    }
  }
  return 0;
}

// "ucx", "tcp,ucx", ...: the transports a fetch's chunks came over.
std::string Transports(const FetchStats& st) {
  std::set<std::string> names;
  for (const FetchSourceStats& s : st.sources) names.insert(s.transport);
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ",") + n;
  return out.empty() ? "-" : out;
}

int RunReader(const RoleFlags& f) {
  const std::string& name = f.name;
  SetLogPrefix(name.c_str());
  cli::SyntheticModel model(TestLayout(f.bytes));
  auto client = Connect(f, name.c_str());
  if (!client.ok()) return cli::Fail(client.status());
  if (f.say_gets_issued) {
    testpoint::Arm("ucx.read_granted", [](uint64_t) {
      // Counted for the process: a connection's reads may come from more
      // than one fetch thread.
      static std::atomic<bool> said{false};
      static std::atomic<int> reads{0};
      if (reads.fetch_add(1) + 1 >= 2 && !said.exchange(true)) {
        Reply("issued");
      }
    });
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd, which;
    in >> cmd >> which;
    if (cmd != "fetch" && cmd != "fetchx" && cmd != "fetchwait") break;
    Version v =
        which == "latest" ? Version::Latest() : Version(std::stoull(which));
    FetchOptions fo;
    fo.timeout_ms = 60000;
    if (f.connections > 0) fo.connections = f.connections;
    if (cmd == "fetch") {
      auto st = (*client)->Fetch(kModel, v, model.tensors(), fo);
      Reply(st.ok() ? "fetched " + std::to_string(st->version.value()) + " " +
                          Hex(model.Digest())
                    : "error " + st.status().ToString());
      continue;
    }
    // fetchx V TIMEOUT_MS PAUSE_AFTER: with PAUSE_AFTER > 0 the fetch stops
    // pulling once that many chunks are verified, says "paused N" and waits
    // for the line "go" (see FetchPause), so that the test injects its fault
    // at that known point. "fetchwait V TIMEOUT_MS" says "waiting" the first
    // time the hub answers UNAVAILABLE (e.g. "rebuilding") and the fetch
    // retries.
    // fetchx V TIMEOUT_MS PAUSE_AFTER QUIET: with QUIET > 0, "paused N Q"
    // once QUIET streams wait between chunks (FetchPause's quiet_streams;
    // Q: how many did).
    uint64_t pause_after = 0;
    int quiet = 0;
    if (cmd == "fetchx") {
      in >> fo.timeout_ms >> pause_after;
      if (!(in >> quiet)) quiet = 0;
    }
    if (cmd == "fetchwait") {
      in >> fo.timeout_ms;
      std::atomic<bool> said{false};
      testpoint::Arm("fetch.hub_unavailable", [&said](uint64_t) {
        if (!said.exchange(true)) Reply("waiting");
      });
      int64_t t0 = NowMs();
      auto st = (*client)->Fetch(kModel, v, model.tensors(), fo);
      testpoint::Disarm("fetch.hub_unavailable");
      Reply(st.ok() ? "fetched " + std::to_string(st->version.value()) + " " +
                          Hex(model.Digest()) +
                          (said.load() ? " waited" : " at-once")
                    : "failed " + std::to_string(NowMs() - t0) + " " +
                          st.status().ToString());
      continue;
    }
    std::optional<cli::FetchPause> pause;
    if (pause_after > 0) {
      pause.emplace(
          pause_after,
          [&pause, quiet](uint64_t n) {
            Reply("paused " + std::to_string(n) +
                  (quiet > 0 ? " " + std::to_string(pause->streams_quiet())
                             : ""));
          },
          [] {
            std::string go;
            // Blocks until the test answers; EOF (the test went away) also
            // releases the fetch.
            while (std::getline(std::cin, go) && go != "go") {
            }
          },
          quiet);
    }
    int64_t t0 = NowMs();
    auto st = (*client)->Fetch(kModel, v, model.tensors(), fo);
    std::string ms = std::to_string(NowMs() - t0);
    uint64_t paused_at = pause.has_value() ? pause->paused_at() : 0;
    pause.reset();
    Reply(st.ok() ? "fetched " + std::to_string(st->version.value()) + " " +
                        Hex(model.Digest()) + " " +
                        std::to_string(st->chunk_retries) + " " +
                        std::to_string(st->chunks_stolen) + " " + ms + " " +
                        std::to_string(paused_at) + " " +
                        std::to_string(st->sources_used) + " " + Transports(*st)
                  : "failed " + ms + " " + st.status().ToString());
  }
  return 0;
}

// A keeper (client/keeper.h): "ready ID" once registered, then runs until
// killed or its stdin closes.
int RunKeeper(const RoleFlags& f) {
  SetLogPrefix("keeper");
  client::KeeperOptions ko;
  ko.client.hub_address = f.hub;
  ko.client.heartbeat_interval_ms = 200;
  ko.client.rpc_timeout_ms = 2000;
  ko.poll_wait_ms = 500;
  auto keeper = client::Keeper::Start(ko);
  if (!keeper.ok()) return cli::Fail(keeper.status());
  Reply("ready " + (*keeper)->id().value());
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}

}  // namespace

std::vector<TensorSpec> TestLayout(uint64_t bytes) {
  std::vector<TensorSpec> specs;
  // 64 tiny tensors (like norms and biases), then big ones for the rest.
  for (int i = 0; i < 64; ++i) {
    specs.push_back({"tiny." + std::to_string(i), DType::kBF16, {448}});
  }
  uint64_t left = bytes > 64 * 896 ? bytes - 64 * 896 : 4096;
  for (int i = 0; left > 0; ++i) {
    uint64_t n = std::min<uint64_t>(left, 48ull << 20) / 2;
    if (n == 0) break;
    specs.push_back({"big." + std::to_string(i), DType::kBF16, {n}});
    left -= n * 2;
  }
  return specs;
}

int FreePort() {
  Result<int> port = cli::FreeLoopbackPort();
  if (!port.ok()) {
    std::fprintf(stderr, "%s\n", port.status().ToString().c_str());
    std::abort();
  }
  return *port;
}

int MaybeRunRole(int argc, char** argv) {
  if (argc < 2 || std::strncmp(argv[1], "--role=", 7) != 0) return -1;
  RoleFlags f;
  CLI::App app("a role of a cross-component test (test_roles.h)", argv[0]);
  app.add_option("--role", f.role)
      ->check(CLI::IsMember({"hub", "trainer", "reader", "keeper"}))
      ->required();
  app.add_option("--hub", f.hub);
  app.add_option("--port", f.port);
  app.add_option("--lease-ms", f.lease_ms);
  app.add_option("--bytes", f.bytes);
  app.add_option("--name", f.name);
  app.add_option("--etcd", f.etcd);
  app.add_option("--etcd-lease-ms", f.etcd_lease_ms);
  app.add_option("--rebuild-ms", f.rebuild_ms);
  app.add_option("--secret", f.secret);
  app.add_option("--max-connections-per-peer", f.max_connections_per_peer);
  app.add_option("--idle-connection-ms", f.idle_connection_ms);
  app.add_option("--handshake-timeout-ms", f.handshake_timeout_ms);
  app.add_flag("--accept-request-secret", f.accept_request_secret);
  app.add_option("--connections", f.connections);
  app.add_flag("--hold-answering-gets", f.hold_answering_gets);
  app.add_flag("--say-gets-issued", f.say_gets_issued);
  if (std::optional<int> rc = cli::ParseFlags(app, argc, argv)) return *rc;
  if (f.role == "hub") return RunHub(f);
  if (f.role == "trainer") return RunTrainer(f);
  if (f.role == "reader") return RunReader(f);
  return RunKeeper(f);
}

}  // namespace tensorhub::testing
