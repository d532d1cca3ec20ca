// Where a hub set keeps its durable facts in etcd, and how they are
// written: pure functions, no I/O (etcd_keys_test.cc checks them).
//
// Under a prefix P (HubOptions::etcd_prefix, default "/tensorhub/"):
//   P leader                     the leader's advertised address, attached
//                                to the leader's lease (the election)
//   P secret-id                  SecretIdentity(secret) of the hub set
//   P highest/MODEL              the model's highest version number
//   P pin/MODEL/VERSION          a Retain pin (empty value)
//   P group/MODEL/GROUP          a reader group's pins:
//                                "FORGOT_BELOW STEP=VERSION ..."
// MODEL and GROUP are escaped (EscapeKeyPart) so that a '/' in a name
// cannot be taken for a separator. Numbers are decimal.
#ifndef TENSORHUB_HA_ETCD_KEYS_H_
#define TENSORHUB_HA_ETCD_KEYS_H_

#include <optional>
#include <string>

#include "hub/hub_state.h"
#include "tensorhub/status.h"

namespace tensorhub::ha {

// A put (value set) or a delete (value nullopt) of one key.
struct KeyWrite {
  std::string key;
  std::optional<std::string> value;
};

// '%', '/' and bytes outside printable ASCII as %XX; reversible.
std::string EscapeKeyPart(const std::string& s);
Result<std::string> UnescapeKeyPart(const std::string& s);

// The key of the election under `prefix`, and of the secret's identity.
std::string LeaderKey(const std::string& prefix);
std::string SecretIdKey(const std::string& prefix);

// The write that records `change` under `prefix`.
KeyWrite EncodeChange(const std::string& prefix,
                      const hub::DurableChange& change);

// Adds what one key under `prefix` says to `state`. Keys that are not
// durable facts (the leader, the secret's identity, keys unknown to this
// version) are skipped; a durable key whose value does not parse is
// DATA_LOSS, naming the key.
Status DecodeInto(const std::string& prefix, const std::string& key,
                  const std::string& value, hub::DurableState& state);

// A hex SHA-256 of the secret with a fixed label: the hubs of one set must
// share a secret, and comparing this tells them apart without storing the
// secret itself in etcd. (It does not make a weak secret safe to show:
// etcd's contents are to be guarded like the secret.)
std::string SecretIdentity(const std::string& secret);

}  // namespace tensorhub::ha

#endif  // TENSORHUB_HA_ETCD_KEYS_H_
