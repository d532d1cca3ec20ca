// The UCX data plane (docs/design.md "UCX data plane"). Control on TCP,
// bytes by UCX tagged messages with rendezvous:
//
//  - Every connection starts on TCP with the same shared-secret proof as
//    the TCP transport (transport/tcp/auth.h); only then does the reader
//    send its UCX worker address, and the holder connects an endpoint to
//    it and answers with its own, to which the reader connects one too
//    (UCX pairs them: the reader can force-close its end, the only way to
//    stop a transfer a message has started). One worker per connection on
//    each side, used by one thread.
//  - A read is a ReadRequest on the TCP connection. The holder admits it
//    (ReadSource::BeginRead: epoch, range, fill state), keeps the lease,
//    answers with how it splits the range into messages (at most 4 MiB
//    each), and sends them from its registered memory; the reader receives
//    them straight into its destination (UCX's rendezvous: the reader pulls
//    the bytes, by cross-memory attach on one host and RDMA read across
//    hosts), checks the holder still holds the lease, hashes them, and
//    releases the lease (a Release frame). The lease ends only when the
//    release has come and every message was sent, so an unpublish's drain
//    waits for every UCX read in flight.
//  - Why not RMA (ucp_get): UCX 1.13 has no zero-copy RMA on one host for
//    memory it did not allocate itself (cma is not an RMA lane; posix/sysv
//    only map their own allocations), so gets of published tensors were
//    emulated with active messages over tcp, a fifth of what rendezvous
//    over cma moves (docs/benchmarks.md section 14).
//  - Memory is registered (ucp_mem_map) once per registration
//    (transport.h Registration), not per read, named in every send, and
//    unmapped when the registration is destroyed after its drain. A source
//    without registrations gets a registration per read, unmapped when the
//    lease ends.
//  - Every UCX progress loop is bounded by the call's deadline, wakes for
//    Cancel() and Stop(), and watches the TCP connection: a peer that
//    closes it or speaks out of turn ends the transfer. A read that stops
//    early cancels its receives and destroys its worker; a holder that
//    stops early force-closes its endpoint before the lease ends, so no
//    byte moves after Read returned or the lease ended.
//
// UCX picks the wire itself (UCX_TLS: rc/dc verbs, tcp, posix/sysv shared
// memory, cma); this transport is the same on all of them.
#ifndef TENSORHUB_TRANSPORT_UCX_UCX_TRANSPORT_H_
#define TENSORHUB_TRANSPORT_UCX_UCX_TRANSPORT_H_

#include <memory>
#include <string>

#include "transport/tcp/socket_util.h"
#include "transport/transport.h"

namespace tensorhub::transport {

struct UcxTransportOptions {
  // Shared secret both ends prove they know on every new connection, as
  // for TCP. Empty: the empty key, which only matches peers without one.
  std::string secret;
};

// Whether this build has the UCX transport (TH_UCX).
bool UcxAvailable();

// Fails (UNAVAILABLE) when UCX cannot be initialised here (no transport
// usable, or a build without TH_UCX).
Result<std::unique_ptr<Transport>> MakeUcxTransport(
    const UcxTransportOptions& options);

// Registrations (ucp_mem_map) alive in this process, for tests that check
// the unmap after a drain.
uint64_t UcxLiveMappingsForTest();

// For tests that play a bad peer: a TCP connection to the UCX data server
// at `address`, past the secret's handshake and the link set-up (the
// reader's hello with the address of a real UCX worker, the holder's
// ready), on which the caller writes raw frames. `keep` holds the worker
// the holder's endpoint points at, progressed by a thread of its own as a
// real reader's is (the holder aborts inside UCX 1.13 if it must destroy
// an endpoint whose wire-up to a worker that never progresses is pending:
// docs/design.md, UCX data plane); destroy it after `fd` and after the
// server.
struct RawUcxLinkForTest {
  Fd fd;
  std::shared_ptr<void> keep;
};
Result<RawUcxLinkForTest> OpenRawUcxLinkForTest(const std::string& address,
                                                const std::string& secret,
                                                const Deadline& deadline);

}  // namespace tensorhub::transport

#endif  // TENSORHUB_TRANSPORT_UCX_UCX_TRANSPORT_H_
