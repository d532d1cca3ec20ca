#include "transport/tcp/cma.h"

#include <limits.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace tensorhub::transport {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<uint64_t> NamespaceInode(const char* path) {
  struct stat st {};
  if (::stat(path, &st) != 0) {
    return Unavailable(std::string("cannot stat ") + path + ": " +
                       std::strerror(errno));
  }
  return static_cast<uint64_t>(st.st_ino);
}

}  // namespace

ssize_t ProcessVmReadv(pid_t pid, const iovec* local, unsigned long nlocal,
                       const iovec* remote, unsigned long nremote) {
  return ::process_vm_readv(pid, local, nlocal, remote, nremote, 0);
}

Result<wire::HostIdentity> ReadHostIdentity() {
  wire::HostIdentity id;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string text;
  if (!in || !std::getline(in, text)) {
    return Unavailable("cannot read /proc/sys/kernel/random/boot_id");
  }
  size_t n = 0;
  for (size_t i = 0; i < text.size() && n < 32; ++i) {
    if (text[i] == '-') continue;
    int d = HexDigit(text[i]);
    if (d < 0) return Unavailable("boot_id '" + text + "' is not hex");
    id.boot_id[n / 2] = static_cast<uint8_t>(id.boot_id[n / 2] << 4 | d);
    ++n;
  }
  if (n != 32) return Unavailable("boot_id '" + text + "' is too short");
  TH_ASSIGN_OR_RETURN(id.pid_ns, NamespaceInode("/proc/self/ns/pid"));
  TH_ASSIGN_OR_RETURN(id.net_ns, NamespaceInode("/proc/self/ns/net"));
  return id;
}

std::vector<wire::LocalPiece> CoalescePieces(std::span<const iovec> pieces) {
  std::vector<wire::LocalPiece> out;
  out.reserve(pieces.size());
  for (const iovec& v : pieces) {
    if (v.iov_len == 0) continue;
    auto at = reinterpret_cast<uint64_t>(v.iov_base);
    if (!out.empty() && out.back().address + out.back().length == at) {
      out.back().length += v.iov_len;
    } else {
      out.push_back({at, v.iov_len});
    }
  }
  return out;
}

Status CopyFromProcess(pid_t pid, std::span<const wire::LocalPiece> remote,
                       std::span<const iovec> dest, size_t segment_bytes,
                       ChunkHash* hash, const CrossMemoryCopyFn& copy) {
  std::vector<iovec> liov, riov;
  liov.reserve(IOV_MAX);
  riov.reserve(IOV_MAX);
  size_t ri = 0, di = 0;        // current piece on each side
  uint64_t roff = 0, doff = 0;  // bytes of it already taken
  while (true) {
    // Skip exhausted (or empty) pieces.
    while (ri < remote.size() && roff == remote[ri].length) ++ri, roff = 0;
    while (di < dest.size() && doff == dest[di].iov_len) ++di, doff = 0;
    if (ri == remote.size() || di == dest.size()) break;
    liov.clear();
    riov.clear();
    uint64_t seg = 0;
    // Each step adds at most one iovec per side, so checking before the
    // step keeps both arrays within IOV_MAX.
    while (seg < segment_bytes && liov.size() < IOV_MAX &&
           riov.size() < IOV_MAX) {
      while (ri < remote.size() && roff == remote[ri].length) ++ri, roff = 0;
      while (di < dest.size() && doff == dest[di].iov_len) ++di, doff = 0;
      if (ri == remote.size() || di == dest.size()) break;
      uint64_t n = std::min({remote[ri].length - roff, dest[di].iov_len - doff,
                             segment_bytes - seg});
      uint64_t raddr = remote[ri].address + roff;
      auto* laddr = static_cast<uint8_t*>(dest[di].iov_base) + doff;
      if (!riov.empty() && reinterpret_cast<uint64_t>(riov.back().iov_base) +
                                   riov.back().iov_len ==
                               raddr) {
        riov.back().iov_len += n;
      } else {
        riov.push_back({reinterpret_cast<void*>(raddr), n});
      }
      if (!liov.empty() &&
          static_cast<uint8_t*>(liov.back().iov_base) + liov.back().iov_len ==
              laddr) {
        liov.back().iov_len += n;
      } else {
        liov.push_back({laddr, n});
      }
      roff += n;
      doff += n;
      seg += n;
    }
    errno = 0;
    ssize_t got = copy(pid, liov.data(), liov.size(), riov.data(), riov.size());
    if (got < 0) {
      int err = errno;
      return Status(err == EPERM || err == EACCES
                        ? StatusCode::kPermissionDenied
                        : StatusCode::kUnavailable,
                    "process_vm_readv from pid " + std::to_string(pid) +
                        " failed: " + std::strerror(err));
    }
    if (static_cast<uint64_t>(got) != seg) {
      return Unavailable("process_vm_readv from pid " + std::to_string(pid) +
                         " copied " + std::to_string(got) + " of " +
                         std::to_string(seg) + " bytes");
    }
    if (hash != nullptr) {
      for (const iovec& v : liov) hash->Update(v.iov_base, v.iov_len);
    }
  }
  if (ri != remote.size() || di != dest.size()) {
    return Internal("local copy: source and destination sizes differ");
  }
  return Status::Ok();
}

}  // namespace tensorhub::transport
