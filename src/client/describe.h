// A hub's Resolve answer as the public VersionInfo (Client::Describe and
// HubWatcher::Describe share it). Pure: no I/O.
#ifndef TENSORHUB_CLIENT_DESCRIBE_H_
#define TENSORHUB_CLIENT_DESCRIBE_H_

#include <string_view>

#include "client/control_plane.h"
#include "tensorhub/client.h"

namespace tensorhub::client {

// The manifest's tensors in layout order (a logical tensor held as pieces
// once, with its global shape, at the first part holding some), every
// part's metadata (rank 0's first), and the holders Resolve listed.
VersionInfo ToVersionInfo(std::string_view model, const Resolved& r);

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_DESCRIBE_H_
