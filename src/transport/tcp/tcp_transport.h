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
// read over TCP from then on, logged once at INFO. A reader of device
// memory asks for CUDA IPC instead, and by default gets handles of copies
// in the holder's own device staging buffers, never of the memory the
// holder publishes (cuda_ipc below, ipc_staging.h).
#ifndef TENSORHUB_TRANSPORT_TCP_TCP_TRANSPORT_H_
#define TENSORHUB_TRANSPORT_TCP_TCP_TRANSPORT_H_

#include <memory>
#include <optional>
#include <string>

#include "transport/tcp/cma.h"
#include "transport/tcp/ipc_staging.h"
#include "transport/transport.h"

namespace tensorhub::tls {
class Context;  // tls/tls.h
}  // namespace tensorhub::tls
namespace tensorhub::cuda {
class DeviceApi;  // cuda/device.h
}  // namespace tensorhub::cuda

namespace tensorhub::transport {

// Device staging buffers for CUDA IPC (TcpTransportOptions::
// ipc_staging_bytes): 4 MiB each, 256 MiB per device by default, enough
// for 4 MiB chunks read by 8 readers x 8 streams at once, or 64 MiB chunks
// by 4 streams; a read finding too few free goes through host staging
// instead of waiting.
inline constexpr uint64_t kIpcStagingBufferBytes = 4ull << 20;
inline constexpr uint64_t kDefaultIpcStagingBytes = 256ull << 20;

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
  // What this holder shares with same-host readers of its device memory
  // by CUDA IPC (ipc_staging.h; docs/security.md, "Same-host readers"):
  // kStaged (default) exports only copies in its own device staging
  // buffers, never the memory it publishes; kDirect (trusted hosts only)
  // exports a published allocation itself when the published regions cover
  // all of it; kOff stages every device read through pinned host memory
  // over the socket.
  CudaIpcPolicy cuda_ipc = CudaIpcPolicy::kStaged;
  // Device memory for those staging buffers, per device, in whole
  // kIpcStagingBufferBytes buffers (rounded down): allocated as same-host
  // device reads need it and kept until the process exits (a reader may
  // keep their handles open, and CUDA leaves freeing memory another
  // process still has open undefined). 0: none, so same-host device reads
  // go through host memory (unless kDirect shares the allocation).
  uint64_t ipc_staging_bytes = kDefaultIpcStagingBytes;
  // Test seam: the device calls (null: cuda::Runtime()). A holder's device
  // staging buffers are kept per DeviceApi and never freed, so one given
  // here must live as long as the process.
  cuda::DeviceApi* device_api = nullptr;

  // Defaults, with local_reads off when the environment has
  // TENSORHUB_NO_CMA=1 (to measure the difference), cuda_ipc from
  // TENSORHUB_CUDA_IPC (staged, direct or off) and ipc_staging_bytes from
  // TENSORHUB_CUDA_IPC_STAGING_MIB (a whole number of MiB). Another value of
  // either fails with INVALID_ARGUMENT naming the variable and what it may
  // hold: a worker never runs with a setting its user did not ask for.
  static Result<TcpTransportOptions> FromEnv();
};

// MakeTcpTransport() == MakeTcpTransport(TcpTransportOptions{}): the
// defaults, whatever the environment says (tests); a worker takes its
// options from TcpTransportOptions::FromEnv() (client/default_deps.cc).
std::unique_ptr<Transport> MakeTcpTransport();
std::unique_ptr<Transport> MakeTcpTransport(const TcpTransportOptions& options);

}  // namespace tensorhub::transport

#endif  // TENSORHUB_TRANSPORT_TCP_TCP_TRANSPORT_H_
