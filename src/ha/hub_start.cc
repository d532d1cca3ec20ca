// Hub::Start (include/tensorhub/hub.h): a single hub, or one of an HA set
// elected through etcd. The only code that knows both the hub's service
// (src/hub/, which takes any coordinator: hub/coordinator.h) and etcd's
// coordinator (src/ha/), so neither depends on the other.
#include <memory>
#include <string>

#include "ha/etcd_coordinator.h"
#include "hub/start_hub.h"
#include "tensorhub/hub.h"

namespace tensorhub {
namespace {

// The etcd coordinator of a hub of an HA set, its advertised address
// checked first: clients must reach the leader at the address it writes.
Result<std::unique_ptr<hub::Coordinator>> EtcdCoordinatorFor(
    const HubOptions& options) {
  ha::EtcdCoordinatorOptions eo;
  eo.endpoints = options.etcd_endpoints;
  eo.prefix = options.etcd_prefix;
  eo.advertise = options.advertise_address.empty() ? options.listen_address
                                                   : options.advertise_address;
  eo.lease_ms = options.etcd_lease_ms;
  eo.secret = options.secret;
  const std::string host = eo.advertise.substr(0, eo.advertise.rfind(':'));
  if (options.advertise_address.empty() &&
      (host == "0.0.0.0" || host == "[::]" || host.empty())) {
    return InvalidArgument(
        "a hub of an HA set listening on " + options.listen_address +
        " needs the address clients reach it at (--advertise HOST:PORT)");
  }
  if (eo.advertise.substr(eo.advertise.rfind(':') + 1) == "0") {
    return InvalidArgument(
        "a hub of an HA set needs a fixed port to advertise (got " +
        eo.advertise + ")");
  }
  return ha::MakeEtcdCoordinator(eo);
}

}  // namespace

Result<std::unique_ptr<Hub>> Hub::Start(const HubOptions& options) {
  if (options.etcd_endpoints.empty()) return hub::StartHub(options, nullptr);
  return hub::StartHub(options,
                       [&options] { return EtcdCoordinatorFor(options); });
}

}  // namespace tensorhub
