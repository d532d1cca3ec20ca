// The hub process: the state machine (hub_state.h) behind a thin gRPC
// adapter, plus a thread that expires leases. The adapter converts messages,
// checks the shared secret, takes the one lock, and calls the state machine.
// The public face is tensorhub::Hub (include/tensorhub/hub.h); its Start
// (src/ha/hub_start.cc) picks the coordinator and calls StartHub
// (start_hub.h).
#ifndef TENSORHUB_HUB_HUB_SERVICE_H_
#define TENSORHUB_HUB_HUB_SERVICE_H_

#include "tensorhub/hub.h"

namespace tensorhub::hub {

using HubServerOptions = ::tensorhub::HubOptions;
using HubServer = ::tensorhub::Hub;

}  // namespace tensorhub::hub

#endif  // TENSORHUB_HUB_HUB_SERVICE_H_
