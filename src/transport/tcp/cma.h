// Cross-memory attach (process_vm_readv) for same-host reads over the TCP
// transport: who counts as "the same host", and the copy itself. No sockets
// here; tcp_transport.cc does the framing (docs/wire.md, "Intra-host reads").
#ifndef TENSORHUB_TRANSPORT_TCP_CMA_H_
#define TENSORHUB_TRANSPORT_TCP_CMA_H_

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <functional>
#include <span>

#include "common/checksum.h"
#include "tensorhub/status.h"
#include "wire/frame.h"

namespace tensorhub::transport {

// Same signature and errno contract as process_vm_readv(2) with flags 0.
// Tests substitute it to refuse or to block a copy.
using CrossMemoryCopyFn =
    std::function<ssize_t(pid_t pid, const iovec* local, unsigned long nlocal,
                          const iovec* remote, unsigned long nremote)>;

// process_vm_readv itself.
ssize_t ProcessVmReadv(pid_t pid, const iovec* local, unsigned long nlocal,
                       const iovec* remote, unsigned long nremote);

// This process's boot id and pid/net namespace inodes, read from /proc.
// Fails where /proc is not mounted or not Linux-like.
Result<wire::HostIdentity> ReadHostIdentity();

// Merges pieces that are adjacent in memory and drops empty ones, so a read
// of tensors laid out back to back is described by few pieces.
std::vector<wire::LocalPiece> CoalescePieces(std::span<const iovec> pieces);

// Bytes per process_vm_readv call: small enough that the bytes are still in
// L2 when they are hashed, large enough to amortise page pinning.
inline constexpr size_t kCmaSegmentBytes = 1 << 20;

// Copies `remote` (in process `pid`) into `dest` (same total length; the
// caller checked) in segments of at most `segment_bytes` and IOV_MAX iovecs
// per side, updating `hash` (if not null) with each segment right after it
// lands. A failed or short copy returns an error naming errno; `dest` then
// holds an unspecified prefix of the bytes.
Status CopyFromProcess(pid_t pid, std::span<const wire::LocalPiece> remote,
                       std::span<const iovec> dest, size_t segment_bytes,
                       ChunkHash* hash, const CrossMemoryCopyFn& copy);

}  // namespace tensorhub::transport

#endif  // TENSORHUB_TRANSPORT_TCP_CMA_H_
