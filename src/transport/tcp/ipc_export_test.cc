// What a holder exports by CUDA IPC to a same-host reader, on the host: the
// TCP server runs for real, its device calls go to a fake over host memory
// (cuda::DeviceApi), and a raw reader asks with the cuda_ipc flag. The fake
// names each "allocation" by a handle, so the tests see which memory a
// reader would have opened, read-write, for as long as it liked.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "cuda/device.h"
#include "transport/tcp/auth.h"
#include "transport/tcp/socket_util.h"
#include "transport/tcp/tcp_transport.h"

namespace tensorhub::transport {
namespace {

constexpr int64_t kGenerousMs = 30000;

// Device memory played by host memory: allocations are named by a handle
// whose first 8 bytes are a serial; copies are memcpy.
class FakeDevice final : public cuda::DeviceApi {
 public:
  class Buffer final : public cuda::DeviceBuffer {
   public:
    explicit Buffer(size_t bytes) : bytes_(bytes) {}
    uint8_t* data() const override {
      return const_cast<uint8_t*>(bytes_.data());
    }
    size_t size() const override { return bytes_.size(); }
    int device() const override { return 0; }

   private:
    std::vector<uint8_t> bytes_;
  };
  class FakeStream final : public cuda::Stream {
   public:
    int device() const override { return 0; }
    Status CopyAsync(void* dst, const void* src, size_t bytes) override {
      std::memcpy(dst, src, bytes);
      return Status::Ok();
    }
    Status Synchronize() override { return Status::Ok(); }
    Result<uint64_t> Checksum(ChunkChecksum kind,
                              std::span<const iovec> pieces) override {
      return ChunkSum(kind, pieces);
    }
  };

  // Makes [base, base + bytes) one allocation; returns its handle.
  cuda::IpcHandle Register(const uint8_t* base, size_t bytes) {
    std::lock_guard<std::mutex> l(mu_);
    cuda::IpcHandle h;
    const uint64_t id = ++serial_;
    std::memcpy(h.bytes.data(), &id, sizeof(id));
    allocations_[base] = {bytes, h};
    return h;
  }
  size_t allocations() const {
    std::lock_guard<std::mutex> l(mu_);
    return allocations_.size();
  }

  Result<std::unique_ptr<cuda::Stream>> CreateStream(int) override {
    return std::unique_ptr<cuda::Stream>(new FakeStream());
  }
  Result<std::unique_ptr<cuda::DeviceBuffer>> Allocate(int,
                                                       size_t bytes) override {
    auto b = std::make_unique<Buffer>(bytes);
    Register(b->data(), bytes);
    return std::unique_ptr<cuda::DeviceBuffer>(std::move(b));
  }
  Result<cuda::IpcExport> Export(const void* ptr, int) override {
    std::lock_guard<std::mutex> l(mu_);
    const auto* p = static_cast<const uint8_t*>(ptr);
    auto it = allocations_.upper_bound(p);
    if (it == allocations_.begin()) return InvalidArgument("not device memory");
    --it;
    if (p >= it->first + it->second.bytes) {
      return InvalidArgument("not device memory");
    }
    return cuda::IpcExport{it->second.handle,
                           static_cast<uint64_t>(p - it->first),
                           it->second.bytes};
  }

 private:
  struct Allocation {
    size_t bytes;
    cuda::IpcHandle handle;
  };
  mutable std::mutex mu_;
  uint64_t serial_ = 0;
  std::map<const uint8_t*, Allocation> allocations_;
};

// Staging buffers are kept per DeviceApi for the life of the process.
FakeDevice& Device() {
  static FakeDevice* d = new FakeDevice();
  return *d;
}

wire::HostIdentity Identity() {
  wire::HostIdentity id;
  id.boot_id.fill(7);
  id.pid_ns = 1007;
  id.net_ns = 2007;
  return id;
}

// "Device memory" of cuda:0: one allocation of `alloc_bytes`, of which
// [published_offset, + published_bytes) is published as model m, part 0.
class DeviceSource final : public ReadSource {
 public:
  DeviceSource(size_t alloc_bytes, size_t published_offset,
               size_t published_bytes)
      : memory_(alloc_bytes),
        published_(memory_.data() + published_offset),
        published_bytes_(published_bytes),
        registration_(std::vector<iovec>{{published_, published_bytes}},
                      MemoryLocation::Cuda(0)) {
    std::mt19937 rng(20261128);
    for (uint8_t& b : memory_) b = static_cast<uint8_t>(rng());
    handle_ = Device().Register(memory_.data(), memory_.size());
  }
  Result<ServeLease> BeginRead(const wire::ReadRequest& req) override {
    if (req.offset > published_bytes_ ||
        req.length > published_bytes_ - req.offset) {
      return InvalidArgument("past the part");
    }
    ServeLease l;
    l.pieces.push_back({published_ + req.offset, req.length});
    l.memory = MemoryLocation::Cuda(0);
    l.registration = &registration_;  // what was published: CoveredBy
    return l;
  }
  const cuda::IpcHandle& handle() const { return handle_; }
  std::vector<uint8_t> Published(uint64_t offset, uint64_t length) const {
    return {published_ + offset, published_ + offset + length};
  }

 private:
  std::vector<uint8_t> memory_;
  uint8_t* published_;
  size_t published_bytes_;
  Registration registration_;
  cuda::IpcHandle handle_;
};

struct Holder {
  std::unique_ptr<Transport> transport;
  std::unique_ptr<Server> server;
};

Holder Serve(DeviceSource& source, CudaIpcPolicy policy,
             uint64_t staging_bytes = kDefaultIpcStagingBytes) {
  TcpTransportOptions o;
  o.identity = Identity();
  o.cuda_ipc = policy;
  o.ipc_staging_bytes = staging_bytes;
  o.device_api = &Device();
  Holder h{MakeTcpTransport(o), nullptr};
  auto server = h.transport->Listen("127.0.0.1:0", &source, {});
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  if (server.ok()) h.server = std::move(server).value();
  return h;
}

// A same-host reader by hand, on one connection.
class RawReader {
 public:
  explicit RawReader(const std::string& address) {
    auto fd = ConnectTcp(address, Deadline::AfterMs(kGenerousMs));
    EXPECT_TRUE(fd.ok());
    if (!fd.ok()) return;
    fd_ = std::move(fd).value();
    EXPECT_TRUE(
        ClientHandshake(fd_.get(), "", Deadline::AfterMs(kGenerousMs)).ok());
  }

  // Asks for [offset, offset + length) by CUDA IPC: the reply, or nullopt
  // (and the header in *h) if the holder answered otherwise.
  std::optional<wire::CudaIpcReply> Ask(uint64_t offset, uint64_t length,
                                        wire::ResponseHeader* h = nullptr) {
    wire::ReadRequest r;
    r.model = "m";
    r.version = 1;
    r.epoch = 1;
    r.offset = offset;
    r.length = length;
    const wire::HostIdentity id = Identity();
    std::string frame = wire::EncodeReadRequest(r, &id, true);
    iovec out{frame.data(), frame.size()};
    EXPECT_TRUE(
        WriteAll(fd_.get(), {&out, 1}, Deadline::AfterMs(kGenerousMs)).ok());
    uint8_t hdr[wire::kResponseHeaderBytes];
    EXPECT_TRUE(
        ReadExact(fd_.get(), hdr, sizeof(hdr), Deadline::AfterMs(kGenerousMs))
            .ok());
    auto header = wire::DecodeResponseHeader(hdr, sizeof(hdr));
    EXPECT_TRUE(header.ok());
    if (!header.ok()) return std::nullopt;
    if (h != nullptr) *h = *header;
    if (!header->cuda_ipc) return std::nullopt;
    std::string body(header->payload_len, '\0');
    EXPECT_TRUE(ReadExact(fd_.get(), body.data(), body.size(),
                          Deadline::AfterMs(kGenerousMs))
                    .ok());
    auto reply = wire::DecodeCudaIpcReply(
        reinterpret_cast<const uint8_t*>(body.data()), body.size(), length);
    EXPECT_TRUE(reply.ok()) << reply.status().ToString();
    if (!reply.ok()) return std::nullopt;
    return *reply;
  }

  void Release() {
    auto release = wire::EncodeRelease(wire::ReleaseOutcome::kCopied);
    iovec v{release.data(), release.size()};
    EXPECT_TRUE(
        WriteAll(fd_.get(), {&v, 1}, Deadline::AfterMs(kGenerousMs)).ok());
  }

 private:
  Fd fd_;
};

// What a reader with the handle of a piece can reach: the whole allocation
// the handle names (here in this process's memory, by the piece's address).
std::vector<uint8_t> BytesOf(const wire::CudaIpcPiece& p) {
  const auto* at = reinterpret_cast<const uint8_t*>(p.address);
  return {at, at + p.length};
}

// The hole this closes (issue 27, item 6): before, a holder whose published
// regions covered an allocation handed a same-host reader that
// allocation's own handle, read-write, for as long as the reader kept it.
// By default now the reader gets a handle of a holder-owned staging buffer
// holding a copy; writing through it leaves the published bytes alone.
TEST(IpcExportTest, AReaderGetsACopyNeverThePublishedAllocation) {
  DeviceSource source(1 << 20, 0, 1 << 20);  // covered: all of it published
  Holder h = Serve(source, CudaIpcPolicy::kStaged);
  ASSERT_NE(h.server, nullptr);
  RawReader reader(h.server->address());
  const uint64_t off = 4096, len = 256 << 10;
  auto reply = reader.Ask(off, len);
  ASSERT_TRUE(reply.has_value()) << "no CUDA IPC reply";
  ASSERT_EQ(reply->pieces.size(), 1u);
  const wire::CudaIpcPiece piece = reply->pieces[0];
  EXPECT_NE(piece.handle, source.handle().bytes)
      << "the reader was handed the published allocation itself";
  EXPECT_EQ(piece.offset, 0u);
  EXPECT_EQ(BytesOf(piece), source.Published(off, len));
  // A hostile reader writes through its handle, then releases.
  const std::vector<uint8_t> before = source.Published(0, 1 << 20);
  std::memset(reinterpret_cast<void*>(piece.address), 0xEE, len);
  reader.Release();
  EXPECT_EQ(source.Published(0, 1 << 20), before)
      << "the reader's write reached the published memory";
  // Its next read on the connection gets the same buffer back (its handle
  // is open already), with the published bytes copied afresh.
  auto again = reader.Ask(off, len);
  ASSERT_TRUE(again.has_value());
  ASSERT_EQ(again->pieces.size(), 1u);
  EXPECT_EQ(again->pieces[0].handle, piece.handle);
  EXPECT_EQ(BytesOf(again->pieces[0]), source.Published(off, len));
  reader.Release();
}

// A read larger than one staging buffer takes several, in order.
TEST(IpcExportTest, AReadSpanningBuffersIsCopiedIntoEachInOrder) {
  const uint64_t len = kIpcStagingBufferBytes * 2 + 12345;
  DeviceSource source(len + 100, 100, len);
  Holder h = Serve(source, CudaIpcPolicy::kStaged);
  ASSERT_NE(h.server, nullptr);
  RawReader reader(h.server->address());
  auto reply = reader.Ask(0, len);
  ASSERT_TRUE(reply.has_value());
  ASSERT_EQ(reply->pieces.size(), 3u);
  std::vector<uint8_t> got;
  for (const wire::CudaIpcPiece& p : reply->pieces) {
    EXPECT_NE(p.handle, source.handle().bytes);
    std::vector<uint8_t> b = BytesOf(p);
    got.insert(got.end(), b.begin(), b.end());
  }
  EXPECT_EQ(reply->pieces[2].length, 12345u);
  EXPECT_EQ(got, source.Published(0, len));
  reader.Release();
}

// Trusted hosts opt in: the covered allocation itself, at the read's
// offset inside it. An allocation that holds more than the published
// regions is still never shared: the reader gets a copy.
TEST(IpcExportTest, DirectSharesOnlyAnAllocationThePublishedRegionsCover) {
  DeviceSource covered(1 << 20, 0, 1 << 20);
  Holder h = Serve(covered, CudaIpcPolicy::kDirect);
  ASSERT_NE(h.server, nullptr);
  RawReader reader(h.server->address());
  auto reply = reader.Ask(4096, 8192);
  ASSERT_TRUE(reply.has_value());
  ASSERT_EQ(reply->pieces.size(), 1u);
  EXPECT_EQ(reply->pieces[0].handle, covered.handle().bytes);
  EXPECT_EQ(reply->pieces[0].offset, 4096u);
  reader.Release();

  DeviceSource larger(1 << 20, 4096, 64 << 10);  // unpublished bytes around
  Holder h2 = Serve(larger, CudaIpcPolicy::kDirect);
  ASSERT_NE(h2.server, nullptr);
  RawReader reader2(h2.server->address());
  auto reply2 = reader2.Ask(0, 8192);
  ASSERT_TRUE(reply2.has_value());
  ASSERT_EQ(reply2->pieces.size(), 1u);
  EXPECT_NE(reply2->pieces[0].handle, larger.handle().bytes);
  EXPECT_EQ(BytesOf(reply2->pieces[0]), larger.Published(0, 8192));
  reader2.Release();
}

// The staging buffers are bounded: a read that finds too few free is not
// exported (the holder sends the bytes, or refuses where it cannot stage
// through host memory either) and nothing waits; once the lease holding
// them ended, they serve the next read. With none, nothing is exported.
TEST(IpcExportTest, StagingBuffersAreBoundedAndReusedAfterTheLease) {
  DeviceSource source(1 << 20, 0, 1 << 20);
  Holder h = Serve(source, CudaIpcPolicy::kStaged, kIpcStagingBufferBytes);
  ASSERT_NE(h.server, nullptr);
  RawReader a(h.server->address()), b(h.server->address());
  auto first = a.Ask(0, 4096);  // holds the one buffer until released
  ASSERT_TRUE(first.has_value());
  wire::ResponseHeader hdr;
  EXPECT_FALSE(b.Ask(0, 4096, &hdr).has_value());
  EXPECT_FALSE(hdr.cuda_ipc) << "a second buffer was exported";
  a.Release();
  // A refused read on the same connection: its answer comes after the
  // holder took the release and ended that lease (one request at a time).
  EXPECT_FALSE(a.Ask(2 << 20, 4096, &hdr).has_value());
  EXPECT_NE(hdr.status, StatusCode::kOk);
  RawReader c(h.server->address());
  auto later = c.Ask(8192, 4096);
  ASSERT_TRUE(later.has_value()) << "the buffer was not given back";
  EXPECT_EQ(later->pieces[0].handle, first->pieces[0].handle);
  EXPECT_EQ(BytesOf(later->pieces[0]), source.Published(8192, 4096));
  c.Release();

  Holder none = Serve(source, CudaIpcPolicy::kStaged, 0);
  ASSERT_NE(none.server, nullptr);
  RawReader d(none.server->address());
  EXPECT_FALSE(d.Ask(0, 4096, &hdr).has_value());
  EXPECT_FALSE(hdr.cuda_ipc);
}

// Off: no handle at all; the holder sends the bytes (or, where it cannot
// stage device memory through pinned host buffers, as in a build or a
// machine without CUDA, refuses the read).
TEST(IpcExportTest, OffHandsOutNoHandle) {
  DeviceSource source(1 << 20, 0, 1 << 20);
  Holder h = Serve(source, CudaIpcPolicy::kOff);
  ASSERT_NE(h.server, nullptr);
  RawReader reader(h.server->address());
  wire::ResponseHeader hdr;
  EXPECT_FALSE(reader.Ask(0, 4096, &hdr).has_value());
  EXPECT_FALSE(hdr.cuda_ipc);
}

}  // namespace
}  // namespace tensorhub::transport
