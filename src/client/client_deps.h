// What a Client is built on, and a way to build one on other seams: the
// data-plane transport, the control plane (the hub) and the clock, the way
// LevelDB's Options::env carries its OS. Client::Connect uses
// DefaultClientDeps; tests pass a fake transport, an in-memory control plane
// and a simulated clock (src/client/client_test.cc). Internal: not part of
// include/.
#ifndef TENSORHUB_CLIENT_CLIENT_DEPS_H_
#define TENSORHUB_CLIENT_CLIENT_DEPS_H_

#include <memory>

#include "client/control_plane.h"
#include "common/clock.h"
#include "tensorhub/client.h"
#include "tensorhub/status.h"
#include "transport/transport.h"

namespace tensorhub::client {

class ClientMetrics;  // client/client_metrics.h
class DeltaMaker;     // client/delta_maker.h

struct ClientDeps {
  // Owned by the client. Serves this worker's reads and reads from holders.
  std::unique_ptr<transport::Transport> transport;
  // Owned by the client. Every call to the hub goes through it.
  std::unique_ptr<ControlPlane> control;
  // Not owned; must outlive the client. The time of every deadline and
  // retry pause of the client's calls and of its fetches. The heartbeat
  // paces itself on real time whatever the clock (it is I/O pacing, not
  // policy a test checks).
  const Clock* clock = &Clock::Real();
};

// Today's product choice: the first of ClientOptions::transports (or
// TENSORHUB_TRANSPORTS) that runs here, UCX or TCP (TcpTransportOptions::
// FromEnv), with the options' secret; TCP with TLS when the options ask for
// data-plane TLS; the hub over gRPC (with TLS if the options ask for it);
// the real clock. INVALID_ARGUMENT for TLS files that are missing,
// unreadable or do not match (client/client_tls.h).
Result<ClientDeps> DefaultClientDeps(const ClientOptions& options);

// Builds a Client on the given seams (the one friend of Client).
class ClientFactory {
 public:
  // As Client::Connect: registers with the hub through deps.control and
  // starts serving through deps.transport. INVALID_ARGUMENT if a dependency
  // is missing.
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options,
                                                 ClientDeps deps);
  // The client's metrics (the keeper adds its own to the same registry).
  static ClientMetrics& Metrics(Client& client);
  // The client's delta maker (tests wait for its work: WaitIdle).
  static DeltaMaker& Deltas(Client& client);
  // The text its metrics endpoint serves (also without one), for tests.
  static std::string MetricsText(Client& client);
};

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_CLIENT_DEPS_H_
