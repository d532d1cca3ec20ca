// Can other hosts reach a worker's data plane? The checks behind two
// messages about a common cross-host mistake, a worker that listens on (or
// advertises) a loopback address:
//  - the worker itself is warned when it starts serving, if its hub is on
//    another address (so readers on other hosts will come);
//  - a reader that fails to read from a holder advertising a loopback
//    address, from what looks like another host, says so in its error,
//    instead of reporting a series of failed connects to 127.0.0.1.
// Both name the fix: --data-listen 0.0.0.0:PORT --advertise-host HOST
// (ClientOptions::data_listen_address, data_advertise_host).
//
// Pure functions of addresses and labels, apart from HostIsLoopback, which
// resolves a host name.
#ifndef TENSORHUB_CLIENT_REACHABILITY_H_
#define TENSORHUB_CLIENT_REACHABILITY_H_

#include <string>
#include <string_view>

namespace tensorhub::client {

// The host of "HOST:PORT" ("[V6]:PORT" gives V6); `address` itself if it
// has no port.
std::string HostOf(std::string_view address);

// 127.0.0.0/8, ::1, ::ffff:127.x.y.z, "localhost" (and "*.localhost").
bool IsLoopbackHost(std::string_view host);
// 0.0.0.0 or ::, an address to listen on, which no other host can dial.
bool IsUnspecifiedHost(std::string_view host);
// Whether only this host can dial `host` (loopback or unspecified).
bool IsLocalOnlyHost(std::string_view host);

// IsLoopbackHost, and for a host name other than "localhost": whether every
// address it resolves to is loopback (a name that does not resolve counts
// as loopback: nothing to warn about). May block on a name lookup.
bool HostIsLoopback(const std::string& host);

// The warning for a worker whose data plane advertises `data_address` while
// its hub is at `hub_address`, or "" when there is none: `data_address` is
// local-only and the hub is not loopback (`hub_is_loopback`, see
// HostIsLoopback).
std::string LoopbackDataPlaneWarning(std::string_view hub_address,
                                     bool hub_is_loopback,
                                     std::string_view data_address);

// Why reads from holder `worker` at `holder_address` may fail from this
// reader, or "" when there is no such reason: the holder's address is
// local-only, and the reader is on another host as far as it can tell.
// When both host labels are set, that is when they differ; else when the
// reader's own data address is not local-only, or its hub is not loopback
// (`hub_is_loopback`: the workers then span hosts).
std::string LoopbackHolderHint(std::string_view worker,
                               std::string_view holder_address,
                               std::string_view holder_host_label,
                               std::string_view reader_host_label,
                               std::string_view reader_data_address,
                               std::string_view hub_address,
                               bool hub_is_loopback);

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_REACHABILITY_H_
