// The HA coordinator on etcd: leader election with an etcd lease and a
// compare-and-swap on one leader key, fenced writes of the hub's durable
// facts, and their loading at takeover (docs/design.md, "A highly available
// hub"). Implements hub::Coordinator; the hub does not see etcd.
//
// Election: every hub keeps a lease of lease_ms (rounded up to etcd's unit,
// whole seconds) and tries a transaction "if the leader key does not exist
// (create_revision == 0), put it = my advertised address, attached to my
// lease". The winner loads the durable facts and leads; it renews the lease
// every third of its TTL and stops leading, by its own clock, once the TTL
// has run out since the last renewal it sent that etcd answered (so it
// stops before etcd can expire the lease and let another hub win). The
// others watch the key and try again when it is deleted (the leader's lease
// expired or was revoked).
//
// Fencing: every durable write is a transaction guarded by "the leader key's
// create_revision is the one my campaign created", so a hub that lost the
// key (and does not know it yet: stopped, partitioned) writes nothing.
#ifndef TENSORHUB_HA_ETCD_COORDINATOR_H_
#define TENSORHUB_HA_ETCD_COORDINATOR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "hub/coordinator.h"
#include "tensorhub/status.h"

namespace tensorhub::ha {

struct EtcdCoordinatorOptions {
  // etcd's client endpoints, "HOST:PORT[,HOST:PORT...]".
  std::string endpoints;
  // Every key of this hub set starts with it; ends with '/'.
  std::string prefix = "/tensorhub/";
  // The address clients dial to reach this hub (HOST:PORT); the leader
  // key's value while this hub leads.
  std::string advertise;
  // The leader's lease. etcd counts in whole seconds (at least its own
  // minimum, about 2 s on a default single member): rounded up.
  int64_t lease_ms = 3000;
  // Only SecretIdentity(secret) is written to etcd.
  std::string secret;
};

// INVALID_ARGUMENT for a malformed endpoint list, prefix or address.
// Connects lazily; Start() does the first call.
Result<std::unique_ptr<hub::Coordinator>> MakeEtcdCoordinator(
    const EtcdCoordinatorOptions& options);

}  // namespace tensorhub::ha

#endif  // TENSORHUB_HA_ETCD_COORDINATOR_H_
