// The hub's gRPC service without a server around it, for the protobuf fuzz
// target (fuzz/hub_proto_fuzz.cc): the same message conversion, validation
// and state-machine calls that `tensorhub serve` runs, called directly.
// Not part of the public API.
#ifndef TENSORHUB_HUB_HUB_SERVICE_INTERNAL_H_
#define TENSORHUB_HUB_HUB_SERVICE_INTERNAL_H_

#include <memory>
#include <string>

#include "hub/hub_state.h"
#include "tensorhub.grpc.pb.h"

namespace tensorhub::hub {

// Every method is safe to call with a default-constructed ServerContext when
// `secret` is empty (the context is only read to log a refused peer).
std::unique_ptr<v1::Hub::Service> NewHubService(const HubConfig& config, std::string secret);

// Runs the lease-expiry pass of a service made by NewHubService.
void ExpireLeases(v1::Hub::Service* service);

}  // namespace tensorhub::hub

#endif  // TENSORHUB_HUB_HUB_SERVICE_INTERNAL_H_
