// The UCX data plane (docs/design.md "UCX data plane"). Control on TCP,
// bytes by UCX active messages the holder sends:
//
//  - Every connection starts on TCP with the same shared-secret proof as
//    the TCP transport (transport/tcp/auth.h); only then does the holder
//    make a UCX worker for the connection and send its address, and the
//    reader answers with its own worker's address, which the holder
//    connects an endpoint to.
//  - A read is a ReadRequest on the TCP connection. The holder admits it
//    (ReadSource::BeginRead: epoch, range, fill state), keeps the lease,
//    grants it (a read id and the piece size) and sends the range's bytes
//    from its memory as active messages (ucp_am_send_nbx), one per piece
//    of at most 1 MiB; UCX sends a small one eagerly and a large one by
//    rendezvous, which the reader receives straight into its destination.
//    The reader takes a piece only where the read in flight asked for it
//    (its read id, at a piece boundary inside the range, the exact length,
//    once) and fails the read on any other: a holder writes nothing outside
//    the destination. It hashes the pieces in order as they land, checks
//    the holder still holds the lease, and releases it (a Release frame).
//    Only then does the lease end, so an unpublish's drain waits for every
//    UCX read in flight; a lease that ends without a release has the
//    holder's endpoint closed first, which cancels its sends.
//  - No UCX context of this transport asks for UCP_FEATURE_RMA, so no
//    worker has UCX's handlers of gets and puts, which copy from and to
//    any address a peer names; nothing is registered or handed out as a
//    remote key by this code (UCX registers what a rendezvous moves).
//  - Every UCX progress loop is bounded by the call's deadline and wakes
//    for Cancel(); a read that stops early closes its endpoint and worker
//    (force), so no byte lands in the destination after Read returned.
//
// UCX picks the wire itself (UCX_TLS: rc/dc verbs, tcp, posix/sysv shared
// memory, cma); this transport is the same on all of them, but by default
// runs only where they are all RDMA wires (ucx_wires.h;
// UcxTransportOptions::allow_emulated_gets says why).
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
  // A reader that gives up on a read with rendezvous receives outstanding
  // (cancelled, or past its deadline), over an endpoint that reports a
  // dead holder (tcp), keeps its worker up until they completed or the
  // holder dropped its worker, at most this long, before it tears it down:
  // so that the holder's sends end in an answer, not in an error against a
  // worker that vanished (docs/design.md, UCX data plane). What giving up
  // on a holder that does not answer at all costs a reader.
  int64_t give_up_linger_ms = 200;
  // The data plane's host (ClientOptions::data_listen_address without the
  // port). UCX's network devices are limited to the interface that holds
  // this address (as UCX_NET_DEVICES would), so that no UCX worker of this
  // process listens on another network (docs/security.md, "What a UCX peer
  // can reach"). Empty, or a wildcard (0.0.0.0, ::): every interface, as
  // the data plane itself. An explicit UCX_NET_DEVICES wins.
  std::string listen_host;
  // Use UCX's wires that check nothing in hardware (tcp, shared memory,
  // cma: ucx_wires.h). No context of this transport asks UCX for RMA, so
  // over them no peer running an unmodified UCX reaches more than the
  // bytes a holder sends it; but UCX 1.13's tcp wire itself writes a put
  // request's bytes to whatever address it names (uct_tcp_ep_handle_put_req,
  // whatever the context's features), so a peer that modifies its UCX can
  // write into this process's memory over tcp (docs/security.md, "What a
  // UCX peer can reach"). Off: the transport runs only where its UCX
  // context has RDMA wires alone (rc, dc; where UCX_TLS is unset or "all"
  // it is limited to them), and MakeUcxTransport fails with
  // FAILED_PRECONDITION elsewhere. The client's ucx_emulated_gets, or
  // TENSORHUB_UCX_EMULATED_GETS=allow (names kept from when these wires
  // carried UCX's emulated gets).
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
