// The TCP data plane: framed range reads (wire/frame.h), zero-copy on both
// ends. The holder sends straight from its registered buffers with one
// sendmsg over [header, pieces...]; the reader receives straight into its
// destination with recvmsg over the destination pieces.
//
// Intra-host path: when reader and holder run on the same host (same boot
// id, pid namespace and network namespace), the reader asks for a local
// read and the holder answers with its pid and the addresses of the pinned
// bytes instead of the bytes; the reader copies them with process_vm_readv
// and then releases the lease over the same connection (docs/wire.md). If
// the copy is refused (ptrace permissions, the holder died), that holder is
// read over TCP from then on, logged once at INFO.
#ifndef TENSORHUB_TRANSPORT_TCP_TCP_TRANSPORT_H_
#define TENSORHUB_TRANSPORT_TCP_TCP_TRANSPORT_H_

#include <memory>
#include <optional>
#include <string>

#include "transport/tcp/cma.h"
#include "transport/transport.h"

namespace tensorhub::tls {
class Context;  // tls/tls.h
}  // namespace tensorhub::tls

namespace tensorhub::transport {

struct TcpTransportOptions {
  // Offer (as a holder) and ask for (as a reader) cross-memory-attach reads
  // with peers on the same host.
  bool local_reads = true;
  // Test seams: the copy (default process_vm_readv) and this process's host
  // identity (default read from /proc), e.g. to play "another host".
  CrossMemoryCopyFn copy_fn;
  std::optional<wire::HostIdentity> identity;
  // Shared secret both ends prove they know on every new connection
  // (transport/tcp/auth.h). Empty: the empty key, which only matches peers
  // without a secret.
  std::string secret;
  // Data-plane TLS: with a context (tls::Context::ForDataPlane), the server
  // announces TLS and accepts only TLS readers, and connections run TLS
  // (mutual: both ends show a certificate of the deployment's CA), the
  // secret's challenge-response inside it. Kernel TLS where the kernel has
  // it (sends then stay zero-copy), else OpenSSL in user space, said once
  // in the log. Null: plain TCP. A peer of the other kind is refused with
  // FAILED_PRECONDITION, saying so.
  std::shared_ptr<const tls::Context> tls;

  // Defaults, with local_reads off when the environment has
  // TENSORHUB_NO_CMA=1 (to measure the difference).
  static TcpTransportOptions FromEnv();
};

// MakeTcpTransport() == MakeTcpTransport(TcpTransportOptions::FromEnv()).
std::unique_ptr<Transport> MakeTcpTransport();
std::unique_ptr<Transport> MakeTcpTransport(const TcpTransportOptions& options);

}  // namespace tensorhub::transport

#endif  // TENSORHUB_TRANSPORT_TCP_TCP_TRANSPORT_H_
