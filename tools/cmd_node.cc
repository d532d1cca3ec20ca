// `tensorhub node`: the per-host agent that holds one host copy of each
// version for the engines of its host (src/node/node_agent.h; docs/design.md,
// "One host copy per node").
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

#include "cli_util.h"
#include "common/log.h"
#include "fetch_pause.h"
#include "node/node_agent.h"

namespace tensorhub::cli {
namespace {

struct NodeFlags {
  WorkerFlags worker;
  std::string socket;
  uint64_t max_sessions = 256;
  uint64_t replace_wait_ms = 60000;
  uint64_t memory_limit_bytes = 0;
  int connections = 4;
  uint64_t leave_timeout_ms = 10000;
  uint64_t pause_after_chunks = 0;  // hidden: tests (FetchPause)
};

int RunNode(const NodeFlags& f) {
  auto o = ClientOptionsFrom(f.worker);
  if (!o.ok()) return Fail(o.status());
  node::NodeAgentOptions no;
  no.client = *o;
  if (no.client.name.empty()) no.client.name = "node-agent";
  no.client.leave_timeout_ms = static_cast<int64_t>(f.leave_timeout_ms);
  if (!f.socket.empty()) no.socket = f.socket;
  no.max_sessions = f.max_sessions;
  no.replace_wait_ms = static_cast<int64_t>(f.replace_wait_ms);
  no.memory_limit_bytes = f.memory_limit_bytes;
  no.fetch_connections = f.connections;
  BlockStopSignals();
  SetLogPrefix("node");
  // A test's known point: the agent's first fetch stops after that many
  // chunks, says so on stderr, and pulls nothing more until a line (or EOF)
  // on stdin.
  std::unique_ptr<FetchPause> pause = FetchPause::OnStdio(f.pause_after_chunks);
  auto agent = node::NodeAgent::Start(no);
  if (!agent.ok()) return Fail(agent.status());
  std::printf("node agent %s at %s, serving other hosts from %s\n",
              (*agent)->worker().value().c_str(), (*agent)->socket().c_str(),
              (*agent)->data_address().c_str());
  std::fflush(stdout);
  const int sig = WaitForStopSignal();
  node::NodeAgentStats st = (*agent)->stats();
  TH_LOG(INFO) << "signal " << sig << ": stopping; fetched " << st.fetches
               << " version(s), handed out " << st.acquired << " copies, "
               << st.refused << " request(s) sent to fetch themselves";
  agent->reset();
  pause.reset();
  return 0;
}

}  // namespace

void AddNodeCommand(CommandLine& cl) {
  auto f = std::make_shared<NodeFlags>();
  CLI::App* c =
      cl.Add("node",
             "hold one host copy of each version for the engines of this host, "
             "until interrupted",
             [f] { return RunNode(*f); });
  c->add_option("--socket", f->socket,
                "where engines ask: @NAME for an abstract socket (one per "
                "network namespace), else a path (default @tensorhub-node)")
      ->envname("TENSORHUB_NODE")
      ->type_name("@NAME|PATH");
  c->add_option("--max-sessions", f->max_sessions,
                "engine connections at once; more are told to fetch "
                "themselves")
      ->check(CLI::Range(uint64_t{1}, uint64_t{4096}))
      ->capture_default_str();
  c->add_option("--replace-wait-ms", f->replace_wait_ms,
                "how long a newer version waits for engines still holding "
                "the older copy before those asking are told to fetch "
                "themselves")
      ->check(CLI::Range(uint64_t{0}, uint64_t{3600000}))
      ->capture_default_str();
  AddBytesOption(c, "--memory-limit", &f->memory_limit_bytes, "0",
                 "largest version held (0: no limit); engines fetch larger "
                 "ones themselves");
  c->add_option("--connections", f->connections,
                "parallel data streams of the agent's fetches")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  c->add_option("--leave-timeout-ms", f->leave_timeout_ms,
                "on exit, wait this long for a keeper to copy a retained "
                "version only this agent holds")
      ->check(CLI::Range(uint64_t{0}, uint64_t{600000}))
      ->capture_default_str();
  c->add_option("--pause-after-chunks", f->pause_after_chunks,
                "tests: pause the first fetch after N verified chunks until "
                "a line on stdin")
      ->group("");
  AddWorkerFlags(c, &f->worker);
}

}  // namespace tensorhub::cli
