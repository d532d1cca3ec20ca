// Device memory: the device checksum against the host's, and device memory
// over the data plane across processes (device to device by CUDA IPC,
// device to host and host to device through pinned staging), byte for
// byte, including the drain of a reader that holds an IPC handle. Tests
// that need a GPU skip, saying why, where none is visible; the ones about
// refusing bad memory locations run everywhere.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <sstream>

#include "common/checksum.h"
#include "common/deadline.h"
#include "cuda/device.h"
#include "gpu_roles.h"
#include "hub/hub_service.h"
#include "process_util.h"
#include "subprocess.h"
#include "tensorhub/client.h"
#include "transport/tcp/auth.h"
#include "transport/tcp/cma.h"
#include "transport/tcp/socket_util.h"
#include "transport/tcp/tcp_transport.h"

namespace tensorhub::testing {
namespace {

// The value, or `fallback` if it failed.
template <typename T, typename U>
T OrElse(Result<T> r, U fallback) {
  return r.ok() ? std::move(r).value() : T(std::move(fallback));
}

using cli::Subprocess;

std::string NoDevice() {
  std::string why;
  return cuda::DeviceCount(&why) > 0 ? "" : why;
}

#define REQUIRE_GPU()                                              \
  do {                                                             \
    std::string why_ = NoDevice();                                 \
    if (!why_.empty()) GTEST_SKIP() << "no CUDA device: " << why_; \
  } while (0)

// ---- memory kinds (run everywhere) ------------------------------------------

TEST(MemoryKinds, BadLocationsAreRefusedWithTheirReason) {
  EXPECT_TRUE(cuda::CheckLocation(MemoryLocation::Host()).ok());
  Status neg = cuda::CheckLocation(MemoryLocation::Cuda(-1));
  EXPECT_EQ(neg.code(), StatusCode::kInvalidArgument) << neg.ToString();
  EXPECT_NE(neg.message().find("negative"), std::string::npos)
      << neg.ToString();
  Status far = cuda::CheckLocation(MemoryLocation::Cuda(4096));
  EXPECT_EQ(far.code(), StatusCode::kFailedPrecondition) << far.ToString();
  if (!cuda::Compiled()) {
    EXPECT_NE(far.message().find("built without CUDA"), std::string::npos)
        << far.ToString();
  } else if (!NoDevice().empty()) {
    EXPECT_NE(far.message().find("no CUDA device"), std::string::npos)
        << far.ToString();
  } else {
    EXPECT_NE(far.message().find("cuda:4096 does not exist"), std::string::npos)
        << far.ToString();
  }
  EXPECT_EQ(MemoryLocationName(MemoryLocation::Cuda(3)), "cuda:3");
  EXPECT_EQ(MemoryLocationName(MemoryLocation::Host()), "host");
  EXPECT_TRUE(MemoryLocation::Cuda(1) == MemoryLocation::Cuda(1));
  EXPECT_FALSE(MemoryLocation::Cuda(1) == MemoryLocation::Cuda(0));
  EXPECT_FALSE(MemoryLocation::Cuda(0) == MemoryLocation::Host());
}

TEST(MemoryKinds, PublishAndFetchRefuseBadOrdinalsAndMixedMemory) {
  auto hub = hub::HubServer::Start({"127.0.0.1:0", 5000, ""});
  ASSERT_TRUE(hub.ok()) << hub.status().ToString();
  ClientOptions o;
  o.hub_address = (*hub)->address();
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<uint8_t> a(4096), b(4096);
  TensorRef ra{
      {"a", DType::kU8, {4096}}, a.data(), 4096, MemoryLocation::Host()};
  TensorRef rb{
      {"b", DType::kU8, {4096}}, b.data(), 4096, MemoryLocation::Cuda(-2)};
  Status s = (*c)->Publish("m", Version(1), {rb});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("negative"), std::string::npos) << s.ToString();
  rb.memory = MemoryLocation::Cuda(4096);
  s = (*c)->Publish("m", Version(1), {rb});
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("publish"), std::string::npos) << s.ToString();
  s = (*c)->Publish("m", Version(1), {ra, rb});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("one call takes tensors of one memory"),
            std::string::npos)
      << s.ToString();
  // Host memory works in every build.
  ASSERT_TRUE((*c)->Publish("m", Version(1), {ra}).ok());
  auto f = (*c)->Fetch("m", Version(1), {rb});
  EXPECT_EQ(f.status().code(), StatusCode::kFailedPrecondition)
      << f.status().ToString();
  if (NoDevice().empty()) {
    // A host pointer labelled as device memory.
    rb.memory = MemoryLocation::Cuda(0);
    s = (*c)->Publish("m", Version(2), {rb});
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("not CUDA device memory"), std::string::npos)
        << s.ToString();
  }
}

// ---- the device checksum
// ------------------------------------------------------

// Pattern(n, seed) on the host and copied to cuda:0, with a stream.
struct Uploaded {
  std::vector<uint8_t> host;
  std::unique_ptr<cuda::DeviceBuffer> buf;
  std::unique_ptr<cuda::Stream> stream;
};
void Upload(size_t n, uint64_t seed, Uploaded* out) {
  out->host = Pattern(n, seed);
  auto buf = cuda::DeviceBuffer::Allocate(0, n);
  ASSERT_TRUE(buf.ok()) << buf.status().ToString();
  auto stream = cuda::Stream::Create(0);
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  out->buf = std::move(buf).value();
  out->stream = std::move(stream).value();
  ASSERT_TRUE(
      out->stream->CopyAsync(out->buf->data(), out->host.data(), n).ok());
  ASSERT_TRUE(out->stream->Synchronize().ok());
}

// Both device checksums of [off, off + len) of the upload equal the host's.
void ExpectDeviceSumsEqualHost(Uploaded& up, size_t off, size_t len) {
  iovec v{up.buf->data() + off, len};
  iovec hv{up.host.data() + off, len};
  for (ChunkChecksum kind : {ChunkChecksum::kXxh3, ChunkChecksum::kXxh3Tree}) {
    Result<uint64_t> got = up.stream->Checksum(kind, {&v, 1});
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(*got, ChunkSum(kind, {&hv, 1}))
        << ChunkChecksumName(kind) << " offset " << off << " length " << len;
  }
}

TEST(GpuChecksum, DeviceChecksumsEqualHostOverManySizes) {
  REQUIRE_GPU();
  const size_t n = (9 << 20) + 64;
  Uploaded up;
  ASSERT_NO_FATAL_FAILURE(Upload(n, 11, &up));
  std::vector<uint8_t>& host = up.host;
  cuda::Stream& s = *up.stream;
  int checked = 0;
  auto check = [&](size_t off, size_t len) {
    ASSERT_NO_FATAL_FAILURE(ExpectDeviceSumsEqualHost(up, off, len));
    ++checked;
  };
  for (size_t len = 0; len <= 2200; ++len) {
    check(0, len);
    check(5, len);
  }
  for (size_t blocks : {1, 2, 3, 64, 65, 128, 1024, 4096, 8192}) {
    for (long d : {-65, -64, -1, 0, 1, 63, 64, 240, 241}) {
      check(0, blocks * 1024 + d);
    }
  }
  std::mt19937_64 rng(20261123);
  for (int i = 0; i < 200; ++i) {
    size_t len = rng() % (9 << 20);
    check(rng() % 64, len);
  }
  // Several pieces hash as their concatenation.
  for (int i = 0; i < 50; ++i) {
    std::vector<iovec> pieces;
    std::vector<uint8_t> concat;
    for (int k = 0; k < 1 + static_cast<int>(rng() % 5); ++k) {
      size_t len = rng() % (1 << 20), off = rng() % (n - len);
      pieces.push_back({up.buf->data() + off, len});
      concat.insert(concat.end(), host.begin() + off, host.begin() + off + len);
    }
    iovec hv{concat.data(), concat.size()};
    for (ChunkChecksum kind :
         {ChunkChecksum::kXxh3, ChunkChecksum::kXxh3Tree}) {
      Result<uint64_t> got = s.Checksum(kind, pieces);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ASSERT_EQ(*got, ChunkSum(kind, {&hv, 1}))
          << ChunkChecksumName(kind) << " case " << i;
    }
    ++checked;
  }
  std::printf(
      "device == host for %d inputs, XXH3-64 and the XXH3-64 tree each\n",
      checked);
}

// A copy that checks what it copies (the same-host verified read): the
// bytes land and the checksum is the host's, for pieces at block
// boundaries (summed as they are copied) and not (copied, then hashed).
TEST(GpuChecksum, CopyAndChecksumCopiesAndEqualsHost) {
  REQUIRE_GPU();
  const size_t n = (9 << 20) + 777;
  Uploaded up;
  ASSERT_NO_FATAL_FAILURE(Upload(n, 13, &up));
  std::vector<uint8_t>& host = up.host;
  cuda::DeviceBuffer* src = up.buf.get();
  auto dst = cuda::DeviceBuffer::Allocate(0, n + 8);
  ASSERT_TRUE(dst.ok());
  cuda::Stream& s = *up.stream;
  std::mt19937_64 rng(20261128);
  int checked = 0;
  auto check = [&](std::vector<size_t> lengths, size_t src_off,
                   size_t dst_off) {
    std::vector<iovec> pieces;
    std::vector<uint8_t> want;
    size_t at = src_off;
    for (size_t l : lengths) {
      // Each piece from somewhere else in the source, as staging buffers
      // or allocations would be.
      pieces.push_back({src->data() + at, l});
      want.insert(want.end(), host.begin() + at, host.begin() + at + l);
      at = (at + l + 4096) % (n / 2);
    }
    ASSERT_TRUE(s.CopyAsync((*dst)->data(), host.data(), n).ok());  // junk
    uint8_t* to = (*dst)->data() + dst_off;
    for (ChunkChecksum kind :
         {ChunkChecksum::kXxh3, ChunkChecksum::kXxh3Tree}) {
      iovec wv{want.data(), want.size()};
      Result<uint64_t> got = s.CopyAndChecksum(kind, to, pieces);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(*got, ChunkSum(kind, {&wv, 1}))
          << ChunkChecksumName(kind) << " case " << checked;
      std::vector<uint8_t> back(want.size());
      ASSERT_TRUE(s.CopyAsync(back.data(), to, back.size()).ok());
      ASSERT_TRUE(s.Synchronize().ok());
      ASSERT_TRUE(back == want) << "bytes differ, case " << checked;
    }
    ++checked;
  };
  check({n / 2}, 0, 0);
  check({4 << 20, 4 << 20, 1001}, 0, 0);     // staging buffers
  check({1024, 1024 * 63, 65536, 1}, 8, 8);  // block starts, then a byte
  check({1000, 70000}, 0, 0);                // a piece off a block start
  check({200}, 0, 0);                        // short: no blocks
  check({241}, 0, 0);
  check({1025}, 3, 0);  // unaligned source
  check({5000}, 0, 4);  // unaligned destination
  check({0, 2048, 0, 3000}, 0, 0);
  for (int i = 0; i < 40; ++i) {
    std::vector<size_t> lengths;
    for (int k = 0; k < 1 + static_cast<int>(rng() % 6); ++k) {
      size_t l = rng() % (1 << 20);
      if (rng() % 2) l = (l / 1024 + 1) * 1024;
      lengths.push_back(l);
    }
    check(lengths, 8 * (rng() % 64), 8 * (rng() % 2));
  }
  std::printf("copy and checksum == host copy and checksum for %d cases\n",
              checked);
}

// Past 4 GiB: block and leaf indices, offsets and lengths beyond 32 bits
// (a model's whole part can be that large). Aligned and not (a 3-byte
// offset takes the gather path), a length that is no multiple of a leaf.
TEST(GpuChecksum, DeviceChecksumsEqualHostPast4GiB) {
  REQUIRE_GPU();
  const size_t n = (4ull << 30) + 65537 + 3;
  Uploaded up;
  ASSERT_NO_FATAL_FAILURE(Upload(n, 12, &up));
  for (size_t off : {size_t{0}, size_t{3}}) {
    EXPECT_NO_FATAL_FAILURE(ExpectDeviceSumsEqualHost(up, off, n - 3));
  }
  std::printf("device == host for %zu bytes at offsets 0 and 3\n", n - 3);
}

// ---- the data plane across processes
// -------------------------------------------

constexpr uint64_t kServeBytes = 24ull << 20;  // plus a 1001-byte tensor
constexpr uint64_t kServeTotal = kServeBytes + 1001;

struct Served {
  Subprocess proc;
  std::string address;
  uint64_t epoch = 0;
};

// Fails the test (ASSERT in the caller: address empty) if it did not start.
Served StartServeWith(const std::vector<std::string>& args) {
  Served s{MustSpawn(args), "", 0};
  auto line = s.proc.ReadLine(Deadline::AfterMs(60000));
  Result<ServeReady> ready =
      line.ok() ? ParseServeReady(*line) : Result<ServeReady>(line.status());
  EXPECT_TRUE(ready.ok()) << ready.status().ToString();
  if (ready.ok()) {
    s.address = ready->address;
    s.epoch = ready->epoch;
  }
  return s;
}

Served StartServe(const std::string& memory, int tensors = 3,
                  const std::string& cuda_ipc = "staged") {
  return StartServeWith({"--role=serve", "--memory", memory, "--bytes",
                         std::to_string(kServeBytes), "--tensors",
                         std::to_string(tensors), "--cuda-ipc", cuda_ipc});
}

// [served, local, staged] from the holder.
std::vector<uint64_t> Stats(Subprocess& p) {
  std::string line = Ask(p, "stats");
  EXPECT_EQ(Word(line, 0), "stats") << line;
  if (Word(line, 0) != "stats") return {0, 0, 0};
  return {std::stoull(Word(line, 1)), std::stoull(Word(line, 2)),
          std::stoull(Word(line, 3))};
}

// Reads the whole part in reads of `chunk` bytes into `dest` (device memory
// of cuda:0 when `device`), checking every read's checksum; returns the
// bytes as read back to the host.
std::vector<uint8_t> ReadAll(transport::Transport& t, const Served& s,
                             uint8_t* dest, bool device, uint64_t chunk) {
  const std::vector<uint8_t> want = Pattern(kServeTotal, 7);
  auto conn = t.Connect(s.address, Deadline::AfterMs(5000));
  EXPECT_TRUE(conn.ok()) << conn.status().ToString();
  if (!conn.ok()) return {};
  for (uint64_t off = 0; off < kServeTotal; off += chunk) {
    const uint64_t len = std::min(chunk, kServeTotal - off);
    // Two pieces per read, to exercise scatter on the reader's side; every
    // other read of device memory into one (the copy that checksums as it
    // copies, cuda::Stream::CopyAndChecksum).
    const bool split = !device || (off / chunk) % 2 == 0;
    const uint64_t half = split ? len / 2 : len;
    iovec dst[2] = {{dest + off, half}, {dest + off + half, len - half}};
    std::span<const iovec> into(dst, split ? 2 : 1);
    transport::ReadChecksum sum{.kind = kDefaultChunkChecksum};
    Status st = device
                    ? (*conn)->ReadDevice(ServedRead(s.epoch, off, len), into,
                                          0, Deadline::AfterMs(30000), &sum)
                    : (*conn)->Read(ServedRead(s.epoch, off, len), into,
                                    Deadline::AfterMs(30000), &sum);
    EXPECT_TRUE(st.ok()) << "read at " << off << ": " << st.ToString();
    EXPECT_EQ(sum.value, ChunkSum(sum.kind, want.data() + off, len))
        << "read at " << off;
  }
  std::vector<uint8_t> got(kServeTotal);
  if (!device) {
    std::memcpy(got.data(), dest, kServeTotal);
  } else {
    auto stream = cuda::Stream::Create(0);
    EXPECT_TRUE(stream.ok());
    EXPECT_TRUE((*stream)->CopyAsync(got.data(), dest, kServeTotal).ok());
    EXPECT_TRUE((*stream)->Synchronize().ok());
  }
  return got;
}

TEST(GpuDataPlane, DeviceToDeviceAcrossProcessesByCudaIpc) {
  REQUIRE_GPU();
  Served s = StartServe("cuda");
  ASSERT_FALSE(s.address.empty()) << "the holder process did not start";
  auto t = transport::MakeTcpTransport();
  auto dest = cuda::DeviceBuffer::Allocate(0, kServeTotal);
  ASSERT_TRUE(dest.ok());
  std::vector<uint8_t> got = ReadAll(*t, s, (*dest)->data(), true, 4 << 20);
  EXPECT_TRUE(got == Pattern(kServeTotal, 7)) << "bytes differ";
  std::vector<uint64_t> st = Stats(s.proc);
  EXPECT_EQ(st[0], kServeTotal);
  EXPECT_EQ(st[1], kServeTotal) << "not every byte went by CUDA IPC";
  EXPECT_EQ(st[2], 0u);
  std::printf("device->device: %lu bytes by CUDA IPC, byte-exact\n",
              static_cast<unsigned long>(st[1]));
}

TEST(GpuDataPlane, DeviceToDeviceWithSameHostReadsOffIsStagedBothWays) {
  REQUIRE_GPU();
  Served s = StartServe("cuda");
  ASSERT_FALSE(s.address.empty()) << "the holder process did not start";
  transport::TcpTransportOptions o;
  o.local_reads = false;
  auto t = transport::MakeTcpTransport(o);
  auto dest = cuda::DeviceBuffer::Allocate(0, kServeTotal);
  ASSERT_TRUE(dest.ok());
  // Reads larger than one staging buffer, so the pipeline turns over.
  std::vector<uint8_t> got = ReadAll(*t, s, (*dest)->data(), true, 11 << 20);
  EXPECT_TRUE(got == Pattern(kServeTotal, 7)) << "bytes differ";
  std::vector<uint64_t> st = Stats(s.proc);
  EXPECT_EQ(st[1], 0u);
  EXPECT_EQ(st[2], kServeTotal) << "the holder did not stage every byte";
}

TEST(GpuDataPlane, DeviceToHostIsStagedByTheHolder) {
  REQUIRE_GPU();
  Served s = StartServe("cuda");
  ASSERT_FALSE(s.address.empty()) << "the holder process did not start";
  auto t = transport::MakeTcpTransport();
  std::vector<uint8_t> dest(kServeTotal);
  std::vector<uint8_t> got = ReadAll(*t, s, dest.data(), false, 4 << 20);
  EXPECT_TRUE(got == Pattern(kServeTotal, 7)) << "bytes differ";
  std::vector<uint64_t> st = Stats(s.proc);
  EXPECT_EQ(st[2], kServeTotal);
}

TEST(GpuDataPlane, HostToDeviceIsStagedByTheReader) {
  REQUIRE_GPU();
  Served s = StartServe("host");
  ASSERT_FALSE(s.address.empty()) << "the holder process did not start";
  auto t = transport::MakeTcpTransport();
  auto dest = cuda::DeviceBuffer::Allocate(0, kServeTotal);
  ASSERT_TRUE(dest.ok());
  std::vector<uint8_t> got = ReadAll(*t, s, (*dest)->data(), true, 6 << 20);
  EXPECT_TRUE(got == Pattern(kServeTotal, 7)) << "bytes differ";
  std::vector<uint64_t> st = Stats(s.proc);
  EXPECT_EQ(st[0], kServeTotal);
  EXPECT_EQ(st[2], 0u);
}

// A same-host reader by hand: asks for [offset, offset + len) by CUDA IPC
// and returns the connection (the lease stays held until a release is
// written on it) and the holder's reply. ASSERTs in the caller: fd invalid
// on failure.
struct IpcAnswer {
  transport::Fd fd;
  wire::CudaIpcReply reply;
};
void AskIpc(const Served& s, uint64_t offset, uint64_t len, IpcAnswer* out) {
  auto fd = transport::ConnectTcp(s.address, Deadline::AfterMs(5000));
  ASSERT_TRUE(fd.ok());
  ASSERT_TRUE(
      transport::ClientHandshake(fd->get(), "", Deadline::AfterMs(5000)).ok());
  auto id = transport::ReadHostIdentity();
  ASSERT_TRUE(id.ok());
  std::string frame =
      wire::EncodeReadRequest(ServedRead(s.epoch, offset, len), &*id, true);
  iovec req{frame.data(), frame.size()};
  ASSERT_TRUE(
      transport::WriteAll(fd->get(), {&req, 1}, Deadline::AfterMs(5000)).ok());
  uint8_t hdr[wire::kResponseHeaderBytes];
  ASSERT_TRUE(
      transport::ReadExact(fd->get(), hdr, sizeof(hdr), Deadline::AfterMs(5000))
          .ok());
  auto h = wire::DecodeResponseHeader(hdr, sizeof(hdr));
  ASSERT_TRUE(h.ok() && h->cuda_ipc) << "the holder did not answer by CUDA IPC";
  std::string body(h->payload_len, '\0');
  ASSERT_TRUE(transport::ReadExact(fd->get(), body.data(), body.size(),
                                   Deadline::AfterMs(5000))
                  .ok());
  auto reply = wire::DecodeCudaIpcReply(
      reinterpret_cast<const uint8_t*>(body.data()), body.size(), len);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  out->fd = std::move(fd).value();
  out->reply = std::move(reply).value();
}

void Release(const transport::Fd& fd) {
  auto release = wire::EncodeRelease(wire::ReleaseOutcome::kCopied);
  iovec rv{release.data(), release.size()};
  ASSERT_TRUE(
      transport::WriteAll(fd.get(), {&rv, 1}, Deadline::AfterMs(5000)).ok());
}

// The mutability contract with an IPC handle open: the holder's drain waits
// for a reader that has the memory mapped and has not released its lease;
// after the release the drain ends; a read after the revoke is refused.
TEST(GpuDataPlane, UnpublishDrainsAReaderHoldingTheIpcHandle) {
  REQUIRE_GPU();
  Served s = StartServe("cuda", 1);
  ASSERT_FALSE(s.address.empty()) << "the holder process did not start";
  const std::vector<uint8_t> want = Pattern(kServeTotal, 7);
  // One staging buffer's worth: one piece, one handle.
  const uint64_t len = transport::kIpcStagingBufferBytes;
  IpcAnswer a;
  ASSERT_NO_FATAL_FAILURE(AskIpc(s, 4096, len, &a));
  const wire::CudaIpcReply* reply = &a.reply;
  ASSERT_EQ(reply->pieces.size(), 1u);
  cuda::IpcHandle handle{reply->pieces[0].handle};
  auto base = cuda::IpcImports::Open(handle, 0);
  ASSERT_TRUE(base.ok()) << base.status().ToString();

  // Unpublish while the reader holds the lease (and the mapping).
  EXPECT_EQ(Ask(s.proc, "revoke"), "revoked");
  auto t0 = SteadyClock::now();
  EXPECT_EQ(Ask(s.proc, "drain 400"), "drained DEADLINE_EXCEEDED");
  EXPECT_GE(std::chrono::duration<double>(SteadyClock::now() - t0).count(),
            0.35);
  // The memory is still the version's: copy, check, release.
  auto dest = cuda::DeviceBuffer::Allocate(0, len);
  auto stream = cuda::Stream::Create(0);
  ASSERT_TRUE(dest.ok() && stream.ok());
  ASSERT_TRUE(
      (*stream)
          ->CopyAsync((*dest)->data(), *base + reply->pieces[0].offset, len)
          .ok());
  iovec dv{(*dest)->data(), len};
  auto sum = (*stream)->Checksum(ChunkChecksum::kXxh3, {&dv, 1});
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(*sum, Xxh3(want.data() + 4096, len));
  ASSERT_NO_FATAL_FAILURE(Release(a.fd));
  EXPECT_EQ(Ask(s.proc, "drain 5000"), "drained OK");
  cuda::IpcImports::Close(handle);

  // A read after the unpublish is refused.
  auto t = transport::MakeTcpTransport();
  auto conn = t->Connect(s.address, Deadline::AfterMs(5000));
  ASSERT_TRUE(conn.ok());
  iovec d2{(*dest)->data(), 4096};
  Status late = (*conn)->ReadDevice(ServedRead(s.epoch, 0, 4096), {&d2, 1}, 0,
                                    Deadline::AfterMs(5000));
  EXPECT_TRUE(late.code() == StatusCode::kNotFound ||
              late.code() == StatusCode::kAborted)
      << late.ToString();
}

// A hostile same-host reader: it keeps its handle past its lease and writes
// through it. By default (CudaIpcPolicy::kStaged) the handle names a
// holder-owned copy, so the holder's published memory is untouched and a
// later read gets the published bytes. Before, a holder whose allocation
// the published regions covered (one tensor here) exported that allocation
// itself, and the write landed in its weights.
TEST(GpuDataPlane, AReaderWritingThroughItsHandleChangesOnlyACopy) {
  REQUIRE_GPU();
  Served s = StartServe("cuda", 1);
  ASSERT_FALSE(s.address.empty()) << "the holder process did not start";
  const uint64_t len = transport::kIpcStagingBufferBytes;  // one piece
  IpcAnswer a;
  ASSERT_NO_FATAL_FAILURE(AskIpc(s, 4096, len, &a));
  ASSERT_EQ(a.reply.pieces.size(), 1u);
  EXPECT_EQ(a.reply.pieces[0].offset, 0u)
      << "the handle names the published allocation, not a staging buffer";
  cuda::IpcHandle handle{a.reply.pieces[0].handle};
  auto base = cuda::IpcImports::Open(handle, 0);
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  auto stream = cuda::Stream::Create(0);
  ASSERT_TRUE(stream.ok());
  std::vector<uint8_t> junk(len, 0xEE);
  ASSERT_TRUE(
      (*stream)
          ->CopyAsync(*base + a.reply.pieces[0].offset, junk.data(), len)
          .ok());
  ASSERT_TRUE((*stream)->Synchronize().ok());
  ASSERT_NO_FATAL_FAILURE(Release(a.fd));
  // The handle stays open (as a hostile reader would keep it) while an
  // honest reader reads the whole part, checksums checked.
  auto t = transport::MakeTcpTransport();
  auto dest = cuda::DeviceBuffer::Allocate(0, kServeTotal);
  ASSERT_TRUE(dest.ok());
  std::vector<uint8_t> got = ReadAll(*t, s, (*dest)->data(), true, 4 << 20);
  EXPECT_TRUE(got == Pattern(kServeTotal, 7))
      << "the reader's write reached the holder's memory";
  cuda::IpcImports::Close(handle);
}

// Trusted hosts opt in to sharing a covered allocation itself (no copy):
// the piece then names the read's offset inside the published allocation.
// A read larger than one staging buffer takes several (staged policy).
TEST(GpuDataPlane, DirectSharesTheAllocationStagedCopiesIntoBuffers) {
  REQUIRE_GPU();
  Served direct = StartServe("cuda", 1, "direct");
  ASSERT_FALSE(direct.address.empty()) << "the holder process did not start";
  IpcAnswer d;
  ASSERT_NO_FATAL_FAILURE(AskIpc(direct, 4096, 1 << 20, &d));
  ASSERT_EQ(d.reply.pieces.size(), 1u);
  EXPECT_EQ(d.reply.pieces[0].offset, 4096u);
  ASSERT_NO_FATAL_FAILURE(Release(d.fd));

  Served staged = StartServe("cuda", 1);
  ASSERT_FALSE(staged.address.empty()) << "the holder process did not start";
  const uint64_t big = transport::kIpcStagingBufferBytes + 4096;
  IpcAnswer st;
  ASSERT_NO_FATAL_FAILURE(AskIpc(staged, 0, big, &st));
  ASSERT_EQ(st.reply.pieces.size(), 2u);
  EXPECT_NE(st.reply.pieces[0].handle, st.reply.pieces[1].handle);
  EXPECT_EQ(st.reply.pieces[0].length, transport::kIpcStagingBufferBytes);
  EXPECT_EQ(st.reply.pieces[1].length, 4096u);
  ASSERT_NO_FATAL_FAILURE(Release(st.fd));
  // And through the library, byte-exact, in reads of two buffers each.
  auto t = transport::MakeTcpTransport();
  auto dest = cuda::DeviceBuffer::Allocate(0, kServeTotal);
  ASSERT_TRUE(dest.ok());
  std::vector<uint8_t> got = ReadAll(*t, staged, (*dest)->data(), true, big);
  EXPECT_TRUE(got == Pattern(kServeTotal, 7)) << "bytes differ";
  std::vector<uint64_t> stats = Stats(staged.proc);
  EXPECT_EQ(stats[1], kServeTotal + big) << "not every byte by CUDA IPC";
}

// Tensors as PyTorch's caching allocator lays them out: at offsets of one
// cudaMalloc. With --cuda-ipc direct the holder shares that allocation only
// when the published tensors cover all of it, and then names the read's
// offset inside it; when the allocation holds more (other tensors of the
// engine), a reader gets a copy in a staging buffer instead. Either way the
// bytes are the published ones, read by hand and through the library.
TEST(GpuDataPlane,
     APooledAllocationIsSharedOnlyWhereThePublishedTensorsCoverIt) {
  REQUIRE_GPU();
  const std::vector<uint64_t> sizes = {1 << 20, 2 << 20, 512 << 10};
  const uint64_t total = (1 << 20) + (2 << 20) + (512 << 10);
  const std::vector<uint8_t> want = Pattern(total, 7);
  for (uint64_t slack : {uint64_t{0}, uint64_t{4096}}) {
    SCOPED_TRACE("slack " + std::to_string(slack));
    Served s = StartServeWith({"--role=serve", "--memory", "cuda", "--sizes",
                               "1048576,2097152,524288", "--cuda-ipc", "direct",
                               "--pool-slack", std::to_string(slack)});
    ASSERT_FALSE(s.address.empty()) << "the holder process did not start";
    // Across the first two tensors.
    const uint64_t off = (1 << 20) - 4096, len = 8192;
    IpcAnswer a;
    ASSERT_NO_FATAL_FAILURE(AskIpc(s, off, len, &a));
    ASSERT_EQ(a.reply.pieces.size(), 1u);
    if (slack == 0) {
      EXPECT_EQ(a.reply.pieces[0].offset, off)
          << "the covered allocation itself, at the read's offset";
    } else {
      EXPECT_EQ(a.reply.pieces[0].offset, 0u)
          << "a staging buffer: the allocation holds more than was published";
    }
    cuda::IpcHandle handle{a.reply.pieces[0].handle};
    auto base = cuda::IpcImports::Open(handle, 0);
    ASSERT_TRUE(base.ok()) << base.status().ToString();
    std::vector<uint8_t> got(len);
    auto stream = cuda::Stream::Create(0);
    ASSERT_TRUE(stream.ok());
    ASSERT_TRUE(
        (*stream)
            ->CopyAsync(got.data(), *base + a.reply.pieces[0].offset, len)
            .ok());
    ASSERT_TRUE((*stream)->Synchronize().ok());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin() + off))
        << "the handle's bytes are not the published ones";
    ASSERT_NO_FATAL_FAILURE(Release(a.fd));
    cuda::IpcImports::Close(handle);

    // The whole part through the library, in reads that cross tensors.
    auto t = transport::MakeTcpTransport();
    auto conn = t->Connect(s.address, Deadline::AfterMs(5000));
    ASSERT_TRUE(conn.ok()) << conn.status().ToString();
    auto dest = cuda::DeviceBuffer::Allocate(0, total);
    ASSERT_TRUE(dest.ok());
    const uint64_t step = 768 << 10;
    for (uint64_t at = 0; at < total; at += step) {
      const uint64_t n = std::min(step, total - at);
      iovec d{(*dest)->data() + at, n};
      transport::ReadChecksum sum{.kind = kDefaultChunkChecksum};
      Status st = (*conn)->ReadDevice(ServedRead(s.epoch, at, n), {&d, 1}, 0,
                                      Deadline::AfterMs(30000), &sum);
      ASSERT_TRUE(st.ok()) << "read at " << at << ": " << st.ToString();
      EXPECT_EQ(sum.value, ChunkSum(sum.kind, want.data() + at, n))
          << "read at " << at;
    }
    std::vector<uint8_t> all(total);
    ASSERT_TRUE((*stream)->CopyAsync(all.data(), (*dest)->data(), total).ok());
    ASSERT_TRUE((*stream)->Synchronize().ok());
    EXPECT_TRUE(all == want) << "bytes differ";
    EXPECT_EQ(Stats(s.proc)[1], total + len) << "not every byte by CUDA IPC";
  }
}

TEST(GpuDataPlane, OffStagesEveryDeviceReadThroughHostMemory) {
  REQUIRE_GPU();
  Served s = StartServe("cuda", 3, "off");
  ASSERT_FALSE(s.address.empty()) << "the holder process did not start";
  auto t = transport::MakeTcpTransport();
  auto dest = cuda::DeviceBuffer::Allocate(0, kServeTotal);
  ASSERT_TRUE(dest.ok());
  std::vector<uint8_t> got = ReadAll(*t, s, (*dest)->data(), true, 4 << 20);
  EXPECT_TRUE(got == Pattern(kServeTotal, 7)) << "bytes differ";
  std::vector<uint64_t> stats = Stats(s.proc);
  EXPECT_EQ(stats[1], 0u);
  EXPECT_EQ(stats[2], kServeTotal);
}

// ---- the whole library: hub, publish, fetch
// ---------------------------------------

// A "holder" role process that publishes m@`version` (gpu_roles.h) through
// the hub at `hub`; the caller checks that it says "published".
Subprocess SpawnHolder(const std::string& hub, const std::string& memory,
                       uint64_t bytes, int version,
                       std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--role=holder",
                                   "--hub",
                                   hub,
                                   "--memory",
                                   memory,
                                   "--bytes",
                                   std::to_string(bytes),
                                   "--version",
                                   std::to_string(version)};
  args.insert(args.end(), extra.begin(), extra.end());
  return MustSpawn(args);
}

std::string Published(Subprocess& p) {
  return OrElse(p.ReadLine(Deadline::AfterMs(60000)), "none");
}

TEST(GpuClient, PublishFromDeviceFetchIntoDeviceAndHostAndBack) {
  REQUIRE_GPU();
  auto hub = hub::HubServer::Start({"127.0.0.1:0", 5000, ""});
  ASSERT_TRUE(hub.ok());
  const std::string addr = (*hub)->address();
  const uint64_t bytes = 40ull << 20;
  const std::vector<TensorSpec> specs = GpuLayout(bytes);
  Subprocess dev_holder = SpawnHolder(addr, "cuda", bytes, 1);
  ASSERT_EQ(Published(dev_holder), "published");
  const std::vector<uint8_t> v1 = Pattern(bytes + 1101, 1);

  ClientOptions o;
  o.hub_address = addr;
  auto reader = Client::Connect(o);
  ASSERT_TRUE(reader.ok());
  // Device to device (CUDA IPC across processes).
  auto into_dev = Tensors::Make(specs, MemoryLocation::Cuda(0),
                                std::vector<uint8_t>(bytes + 1101));
  ASSERT_TRUE(into_dev.ok()) << into_dev.status().ToString();
  auto f = (*reader)->Fetch("m", Version(1), into_dev->refs());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_TRUE(OrElse(into_dev->Read(), std::vector<uint8_t>{}) == v1)
      << "device copy differs";

  // Device to host (staged by a device holder).
  ClientOptions o2 = o;
  auto reader2 = Client::Connect(o2);
  ASSERT_TRUE(reader2.ok());
  auto into_host = Tensors::Make(specs, MemoryLocation::Host(),
                                 std::vector<uint8_t>(bytes + 1101));
  ASSERT_TRUE(into_host.ok());
  FetchOptions fo;
  fo.serve = false;
  f = (*reader2)->Fetch("m", Version(1), into_host->refs(), fo);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_TRUE(OrElse(into_host->Read(), std::vector<uint8_t>{}) == v1)
      << "host copy differs";

  // Host to device.
  Subprocess host_holder = SpawnHolder(addr, "host", bytes, 2);
  ASSERT_EQ(Published(host_holder), "published");
  auto into_dev2 = Tensors::Make(specs, MemoryLocation::Cuda(0),
                                 std::vector<uint8_t>(bytes + 1101));
  ASSERT_TRUE(into_dev2.ok());
  f = (*reader2)->Fetch("m", Version(2), into_dev2->refs(), fo);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_TRUE(OrElse(into_dev2->Read(), std::vector<uint8_t>{}) ==
              Pattern(bytes + 1101, 2))
      << "device copy of the host version differs";

  // The device holder unpublishes: its drain returns, and a fetch of v1 is
  // then served by the reader that holds it in device memory.
  EXPECT_EQ(Ask(dev_holder, "unpublish"), "unpublished OK");
  auto into_host2 = Tensors::Make(specs, MemoryLocation::Host(),
                                  std::vector<uint8_t>(bytes + 1101));
  ASSERT_TRUE(into_host2.ok());
  f = (*reader2)->Fetch("m", Version(1), into_host2->refs(), fo);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_TRUE(OrElse(into_host2->Read(), std::vector<uint8_t>{}) == v1);
}

// A torch-like engine on both sides: the publisher's tensors at offsets of
// one allocation that also holds other memory, fetched into tensors at
// offsets of one allocation of the reader's (offsets 512-byte aligned, so
// that they differ from the tensors' offsets in the part).
TEST(GpuClient, PublishFromAndFetchIntoPooledAllocations) {
  REQUIRE_GPU();
  auto hub = hub::HubServer::Start({"127.0.0.1:0", 5000, ""});
  ASSERT_TRUE(hub.ok());
  const std::string addr = (*hub)->address();
  const uint64_t bytes = 24ull << 20;
  const std::vector<TensorSpec> specs = GpuLayout(bytes);
  Subprocess holder = SpawnHolder(addr, "cuda", bytes, 1,
                                  {"--pool-slack", std::to_string(1 << 20)});
  ASSERT_EQ(Published(holder), "published");
  ClientOptions o;
  o.hub_address = addr;
  auto reader = Client::Connect(o);
  ASSERT_TRUE(reader.ok());
  auto into = Tensors::Make(specs, MemoryLocation::Cuda(0),
                            std::vector<uint8_t>(bytes + 1101), 0);
  ASSERT_TRUE(into.ok()) << into.status().ToString();
  auto f = (*reader)->Fetch("m", Version(1), into->refs());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_TRUE(OrElse(into->Read(), std::vector<uint8_t>{}) ==
              Pattern(bytes + 1101, 1))
      << "the pooled device copy differs";
  EXPECT_EQ(Ask(holder, "unpublish"), "unpublished OK");
}

}  // namespace
}  // namespace tensorhub::testing

int main(int argc, char** argv) {
  return tensorhub::testing::RoleOrTestsMain(
      argc, argv, &tensorhub::testing::MaybeRunGpuRole);
}
