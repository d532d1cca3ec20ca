// The node agent: one host copy of a version per host, shared by the
// host's engines (docs/design.md, "One host copy per node").
//
// A NodeAgent is a worker like any other (a Client: it registers with the
// hub, fetches, and serves what it holds to readers on other hosts, so it
// takes part in the fan-out as one reader per host), plus a Unix socket on
// which the engines of its host ask for versions (node_protocol.h). For
// each model it holds at most one version, in a memfd: an engine that asks
// gets a read-only descriptor of that memory and the tensors' places in it,
// maps it (copy-on-write: its writes stay its own) and loads straight from
// it, so the host keeps one copy however many engines load it.
//
// The copy of a version is never written after its fetch completed: a newer
// version goes into new memory, so an engine's mapping never sees a mix of
// two versions, even while the agent moves on. Before the newer one is
// fetched the older copy is withdrawn (unpublished, its reads drained) and
// freed, once no engine holds it: a host needs one copy per model, staging
// included, plus what engines still map. A request for the newer version
// waits (up to replace_wait_ms) for the older one's sessions to end; while
// it waits, requests for the older version are refused, as are requests
// for any version older than the one held: those engines fetch it
// themselves (the reply says so, `fallback`).
//
// Engines fall back to fetching themselves whenever no agent answers (none
// started, or it died: the socket closes and every session sees it). A
// mapping an engine already has stays valid after the agent is gone.
//
// Threads: one accepting thread and one thread per session (bounded by
// max_sessions); the fetch of a version runs on the thread of the session
// that asked first. All state is under one mutex.
#ifndef TENSORHUB_NODE_NODE_AGENT_H_
#define TENSORHUB_NODE_NODE_AGENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensorhub/client.h"
#include "tensorhub/status.h"

namespace tensorhub::node {

struct NodeAgentOptions {
  // The agent's worker: hub, secret, TLS, labels (its host's), data plane
  // (readers on other hosts dial it: --data-listen / --advertise-host).
  ClientOptions client;
  // "@NAME": NAME in the abstract namespace (one per network namespace);
  // else a filesystem path (created mode 0600).
  std::string socket = "@tensorhub-node";
  // Sessions (engine connections) at once; more are refused
  // (RESOURCE_EXHAUSTED), and those engines fetch themselves.
  size_t max_sessions = 256;
  // How long a request for a newer version waits for the sessions that
  // hold the older one to end before it is refused (fallback).
  int64_t replace_wait_ms = 60000;
  // Bytes one version may take (0: no limit); a larger one is refused
  // (fallback), and the engines fetch it themselves.
  uint64_t memory_limit_bytes = 0;
  int fetch_connections = 4;
};

struct NodeCopyStatus {
  std::string model;
  Version version;
  std::string state;  // "fetching", "ready"
  uint64_t bytes = 0;
  uint32_t sessions = 0;    // engines holding it now
  bool superseded = false;  // a newer version waits for it to be free
};

struct NodeAgentStats {
  uint64_t fetches = 0;  // versions fetched onto the host
  uint64_t fetch_failures = 0;
  uint64_t acquired = 0;  // copies handed to engines
  uint64_t refused = 0;   // requests answered "fetch it yourself"
  uint64_t sessions = 0;  // open now
  std::vector<NodeCopyStatus> copies;
};

class NodeAgent {
 public:
  // Connects the worker and listens on the socket. FAILED_PRECONDITION if
  // another agent listens there.
  static Result<std::unique_ptr<NodeAgent>> Start(NodeAgentOptions options);
  // Stop(), then the worker leaves the hub.
  ~NodeAgent();
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  // Stops accepting, ends every session (engines see the socket close),
  // waits for a fetch in progress to end (its deadline), withdraws the
  // copies. Idempotent.
  void Stop();

  NodeAgentStats stats() const;
  const std::string& socket() const;
  const WorkerId& worker() const;
  std::string data_address() const;

 private:
  class Impl;
  explicit NodeAgent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tensorhub::node

#endif  // TENSORHUB_NODE_NODE_AGENT_H_
