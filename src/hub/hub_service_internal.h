// The hub's gRPC service without a server around it, for the protobuf fuzz
// target (fuzz/hub_proto_fuzz.cc): the same message conversion, validation
// and state-machine calls that `tensorhub serve` runs, called directly.
// Not part of the public API.
#ifndef TENSORHUB_HUB_HUB_SERVICE_INTERNAL_H_
#define TENSORHUB_HUB_HUB_SERVICE_INTERNAL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "hub/coordinator.h"
#include "hub/hub_state.h"
#include "tensorhub.grpc.pb.h"

namespace tensorhub::hub {

// Every method is safe to call with a default-constructed ServerContext when
// `secret` is empty (the context is only read to log a refused peer).
// rebuild_ms: the window after `started_ms` (-1: now) in which an unknown
// or unheld version is answered UNAVAILABLE, "rebuilding" (HubOptions).
// `coord` (not owned, may be null: a single hub): the hub is one of an HA
// set; it answers as a standby until ElectService().
std::unique_ptr<v1::Hub::Service> NewHubService(const HubConfig& config,
                                                std::string secret,
                                                int64_t rebuild_ms = 0,
                                                int64_t started_ms = -1,
                                                Coordinator* coord = nullptr);

// Runs the lease-expiry pass of a service made by NewHubService.
void ExpireLeases(v1::Hub::Service* service);

// What the coordinator's callbacks do (coordinator.h), for tests that play
// the coordinator: install the durable facts in a fresh state machine, or
// drop the state.
Status ElectService(v1::Hub::Service* service, const DurableState& durable);
void DemoteService(v1::Hub::Service* service);

}  // namespace tensorhub::hub

#endif  // TENSORHUB_HUB_HUB_SERVICE_INTERNAL_H_
