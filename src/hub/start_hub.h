// Starting a hub for any coordinator (coordinator.h): what Hub::Start
// (src/ha/hub_start.cc) calls once it has picked one. The hub's service
// knows its coordinator by this interface only.
#ifndef TENSORHUB_HUB_START_HUB_H_
#define TENSORHUB_HUB_START_HUB_H_

#include <functional>
#include <memory>

#include "hub/coordinator.h"
#include "tensorhub/hub.h"

namespace tensorhub::hub {

// Makes the coordinator of a hub of an HA set; called once, after the
// options were checked and before anything listens.
using CoordinatorFactory =
    std::function<Result<std::unique_ptr<Coordinator>>()>;

// Hub::Start's work: `make_coordinator` null (or making none) starts a
// single hub. Fails as Hub::Start documents.
Result<std::unique_ptr<Hub>> StartHub(
    const HubOptions& options, const CoordinatorFactory& make_coordinator);

}  // namespace tensorhub::hub

#endif  // TENSORHUB_HUB_START_HUB_H_
