// What the units of one worker borrow (membership.h, serving.h, and the
// fetches in fetch/): its seams (client_deps.h), what it serves, its
// metrics, its addresses and its membership of the hub. Client::Impl owns
// every one of them, builds them before any unit and outlives every unit;
// a unit never sees Client::Impl itself.
#ifndef TENSORHUB_CLIENT_WORKER_CONTEXT_H_
#define TENSORHUB_CLIENT_WORKER_CONTEXT_H_

#include "client/addresses.h"
#include "client/client_metrics.h"
#include "client/control_plane.h"
#include "client/membership.h"
#include "client/registry.h"
#include "common/clock.h"
#include "tensorhub/client.h"
#include "transport/transport.h"

namespace tensorhub::client {

struct WorkerContext {
  const ClientOptions& options;
  // Deadlines and retry pauses (ClientDeps::clock).
  const Clock& clock;
  ControlPlane& hub;
  transport::Transport& transport;
  // What this worker serves; its data server reads from it.
  Registry& registry;
  ClientMetrics& metrics;
  const Addresses& addresses;
  // Its id, and the one path for what the hub must hear later.
  Membership& membership;
};

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_WORKER_CONTEXT_H_
