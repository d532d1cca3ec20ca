// The UCX data plane (docs/design.md "UCX data plane"). Control on TCP,
// bytes by UCX one-sided RMA:
//
//  - Every connection starts on TCP with the same shared-secret proof as
//    the TCP transport (transport/tcp/auth.h); only then does the holder
//    send its UCX worker address, and the reader connects a UCX endpoint
//    to it.
//  - A read is a ReadRequest on the TCP connection. The holder admits it
//    (ReadSource::BeginRead: epoch, range, fill state), keeps the lease and
//    answers with where the range lies in its registered memory and the
//    remote keys; the reader moves the bytes with ucp_get_nbx straight from
//    the holder's buffers into its destination, checks the holder still
//    holds the lease, hashes them, and releases the lease (a Release
//    frame). Only then does the lease end, so an unpublish's drain waits
//    for every UCX read in flight.
//  - Memory is registered (ucp_mem_map + a packed remote key) once per
//    registration (transport.h Registration), not per read, and unmapped
//    when the registration is destroyed after its drain: a key a reader
//    kept is useless afterwards. A source without registrations gets a
//    registration per read, unmapped when the lease ends.
//  - Every UCX progress loop is bounded by the call's deadline and wakes
//    for Cancel(); a read that stops early closes its endpoint and worker
//    (force), so no byte lands in the destination after Read returned.
//
// UCX picks the wire itself (UCX_TLS: rc/dc verbs, tcp, posix/sysv shared
// memory, cma); this transport is the same on all of them, but by default
// runs only where they are all RDMA wires, whose gets the NIC checks
// (ucx_wires.h; UcxTransportOptions::allow_emulated_gets).
#ifndef TENSORHUB_TRANSPORT_UCX_UCX_TRANSPORT_H_
#define TENSORHUB_TRANSPORT_UCX_UCX_TRANSPORT_H_

#include <memory>
#include <string>

#include "transport/transport.h"

namespace tensorhub::transport {

struct UcxTransportOptions {
  // Shared secret both ends prove they know on every new connection, as
  // for TCP. Empty: the empty key, which only matches peers without one.
  std::string secret;
  // Connect fails with FAILED_PRECONDITION for a holder on this host (the
  // same boot id, pid and network namespaces, which its hello names): TCP
  // reads it by cross-memory attach, which UCX 1.13 cannot match for user
  // memory, and a reader moves such a holder to its TCP address. Off for
  // tests and benchmarks of UCX on one host (the client's ucx_same_host).
  bool refuse_same_host = false;
  // A reader that gives up on a read with gets outstanding (cancelled, or
  // past its deadline) keeps its endpoint up until the holder answered them
  // or dropped the connection's worker, at most this long, before it tears
  // the endpoint down: over UCX's tcp wire UCX 1.13 aborts a holder whose
  // answer to a get fails because the reader's endpoint is gone
  // (docs/design.md, UCX data plane). What giving up on a holder that does
  // not answer at all costs a reader.
  int64_t give_up_linger_ms = 200;
  // The data plane's host (ClientOptions::data_listen_address without the
  // port). UCX's network devices are limited to the interface that holds
  // this address (as UCX_NET_DEVICES would), so that no UCX worker of this
  // process listens on another network (docs/security.md, "What a UCX peer
  // can reach"). Empty, or a wildcard (0.0.0.0, ::): every interface, as
  // the data plane itself. An explicit UCX_NET_DEVICES wins.
  std::string listen_host;
  // Use UCX's wires whose gets nothing checks (tcp, shared memory, cma:
  // ucx_wires.h), over which any peer that proved the secret can read and
  // write all of this process's memory. Off: the transport runs only where its
  // UCX context has RDMA wires alone (rc, dc; where UCX_TLS is unset or "all"
  // it is limited to them), and MakeUcxTransport fails with FAILED_PRECONDITION
  // elsewhere (docs/security.md, "What a UCX peer can reach"). The client's
  // ucx_emulated_gets, or TENSORHUB_UCX_EMULATED_GETS=allow.
  bool allow_emulated_gets = false;
};

// The network interface ("lo", "eth0") that holds `host` (an IP address or
// a name resolved to one); empty for a wildcard or an address no interface
// of this machine holds.
std::string InterfaceOf(const std::string& host);

// Whether this build has the UCX transport (TH_UCX).
bool UcxAvailable();

// Fails (UNAVAILABLE) when UCX cannot be initialised here (no transport
// usable, or a build without TH_UCX); FAILED_PRECONDITION, naming the wires
// and the opt-in, where only wires whose gets nothing checks are usable and
// `options.allow_emulated_gets` is off.
Result<std::unique_ptr<Transport>> MakeUcxTransport(
    const UcxTransportOptions& options);

// The features (ucp_params_t::features) every UCX context of this
// transport is made with, serving and reading alike, for the test that
// shows what they let a peer reach (0 without TH_UCX).
uint64_t UcxContextFeaturesForTest();

}  // namespace tensorhub::transport

#endif  // TENSORHUB_TRANSPORT_UCX_UCX_TRANSPORT_H_
