// The TCP data plane with TLS (TcpTransportOptions::tls) over loopback:
// reads are byte-exact, the shared secret's challenge still runs inside
// TLS, refusals say why, and a TLS end and a plain end refuse each other at
// once. Kernel TLS is checked where the kernel has it. Certificates from
// the openssl command (tls/throwaway_pki.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "tls/pki_test_base.h"
#include "tls/throwaway_pki.h"
#include "tls/tls.h"
#include "transport/tcp/tcp_transport.h"

namespace tensorhub::transport {
namespace {

using tls::ThrowawayPki;

// Only matters if a call hangs; the tests check statuses, not the clock.
constexpr int64_t kGenerousMs = 30000;

bool Has(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

// Serves model "m" version 1 epoch 1 part 0 from one buffer, in pieces.
class Source final : public ReadSource {
 public:
  explicit Source(size_t bytes) : data_(bytes) {
    std::mt19937 rng(3);
    for (uint8_t& b : data_) b = static_cast<uint8_t>(rng());
  }
  Result<ServeLease> BeginRead(const wire::ReadRequest& req) override {
    if (req.model != "m" || req.offset + req.length > data_.size()) {
      return NotFound("no such range");
    }
    ServeLease lease;
    const uint64_t half = req.length / 2;
    lease.pieces.push_back({data_.data() + req.offset, half});
    lease.pieces.push_back(
        {data_.data() + req.offset + half, req.length - half});
    return lease;
  }
  const std::vector<uint8_t>& data() const { return data_; }

 private:
  std::vector<uint8_t> data_;
};

wire::ReadRequest Req(uint64_t offset, uint64_t length) {
  wire::ReadRequest r;
  r.model = "m";
  r.version = 1;
  r.epoch = 1;
  r.part = 0;
  r.offset = offset;
  r.length = length;
  return r;
}

class TlsTransportTest : public tls::PkiTest {
 protected:
  // A transport with TLS on certificate `cert` (empty: plain TCP).
  static std::unique_ptr<Transport> Make(const std::string& cert,
                                         const std::string& key,
                                         const std::string& secret = "") {
    TcpTransportOptions o;
    o.local_reads = false;  // the bytes must cross the socket
    o.secret = secret;
    if (!cert.empty()) {
      tls::PemFiles f;
      f.cert = cert;
      f.key = key;
      f.ca = pki_->ca;
      auto creds = tls::LoadCredentials(f);
      EXPECT_TRUE(creds.ok()) << creds.status().ToString();
      auto ctx = tls::Context::ForDataPlane(*creds);
      EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
      o.tls = *ctx;
    }
    return MakeTcpTransport(o);
  }

  std::unique_ptr<Server> Listen(Transport& t) {
    auto s = t.Listen("127.0.0.1:0", &source_, ServerOptions());
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  Source source_{16 << 20};
};

TEST_F(TlsTransportTest, ReadsOverTlsAreByteExactAndKernelTlsIsUsedIfThere) {
  auto holder = Make(pki_->worker_cert, pki_->worker_key, "s");
  auto reader = Make(pki_->worker2_cert, pki_->worker2_key, "s");
  auto server = Listen(*holder);
  ASSERT_TRUE(server);
  auto conn =
      reader->Connect(server->address(), Deadline::AfterMs(kGenerousMs));
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  EXPECT_TRUE((*conn)->tls());
  // Two reads on one connection, the second across a piece boundary.
  for (uint64_t off : {uint64_t{0}, uint64_t{(4 << 20) + 17}}) {
    const uint64_t len = (8 << 20) + 5;
    std::vector<uint8_t> got(len);
    iovec v[2] = {{got.data(), 1000}, {got.data() + 1000, len - 1000}};
    ReadChecksum sum{.kind = ChunkChecksum::kXxh3Tree};
    Status s =
        (*conn)->Read(Req(off, len), v, Deadline::AfterMs(kGenerousMs), &sum);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(std::equal(got.begin(), got.end(),
                           source_.data().begin() + static_cast<long>(off)));
    EXPECT_EQ(sum.value, ChunkSum(sum.kind, source_.data().data() + off, len));
  }
  // A refusal by the holder comes back inside TLS and keeps the connection.
  std::vector<uint8_t> one(16);
  iovec v{one.data(), one.size()};
  wire::ReadRequest bad = Req(0, 16);
  bad.model = "other";
  EXPECT_EQ((*conn)->Read(bad, {&v, 1}, Deadline::AfterMs(kGenerousMs)).code(),
            StatusCode::kNotFound);
  EXPECT_FALSE((*conn)->broken());
  EXPECT_EQ(server->connections_tls(), 1u);
  EXPECT_EQ(server->bytes_served(), 2u * ((8 << 20) + 5));
  // Kernel TLS exactly where the kernel has it (the test below).
  EXPECT_EQ(server->connections_kernel_tls(),
            tls::KernelTls().available ? 1u : 0u);
}

// With kernel TLS the holder's sends are one sendmsg from its buffers, the
// kernel encrypting: a read is byte-exact and the holder counts the
// connection as kTLS. Skips where the kernel has no kTLS.
TEST_F(TlsTransportTest, KernelTlsSendsFromTheHoldersBuffers) {
  tls::KernelTlsSupport k = tls::KernelTls();
  if (!k.available) {
    GTEST_SKIP() << "no kernel TLS here: " << k.why
                 << "; on a kernel with the tls module: sudo modprobe tls && "
                    "(cd build && ctest -R tls_transport_test)";
  }
  auto holder = Make(pki_->worker_cert, pki_->worker_key, "s");
  auto reader = Make(pki_->worker2_cert, pki_->worker2_key, "s");
  auto server = Listen(*holder);
  ASSERT_TRUE(server);
  auto conn =
      reader->Connect(server->address(), Deadline::AfterMs(kGenerousMs));
  ASSERT_TRUE(conn.ok()) << conn.status().ToString();
  const uint64_t off = 4099, len = (8 << 20) + 5;
  std::vector<uint8_t> got(len);
  iovec v{got.data(), got.size()};
  Status s =
      (*conn)->Read(Req(off, len), {&v, 1}, Deadline::AfterMs(kGenerousMs));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(std::equal(got.begin(), got.end(),
                         source_.data().begin() + static_cast<long>(off)));
  EXPECT_EQ(server->connections_kernel_tls(), 1u)
      << "the kernel offers TLS, but the holder's sends did not use it";
}

TEST_F(TlsTransportTest, WrongSecretIsRefusedInsideTls) {
  auto holder = Make(pki_->worker_cert, pki_->worker_key, "right");
  auto reader = Make(pki_->worker2_cert, pki_->worker2_key, "wrong");
  auto server = Listen(*holder);
  ASSERT_TRUE(server);
  Status s = reader->Connect(server->address(), Deadline::AfterMs(kGenerousMs))
                 .status();
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_TRUE(Has(s, "shared secret")) << s.ToString();
}

TEST_F(TlsTransportTest, ReaderCertificateOfAnotherCaIsRefused) {
  auto holder = Make(pki_->worker_cert, pki_->worker_key);
  auto rogue = Make(pki_->rogue_cert, pki_->rogue_key);
  auto server = Listen(*holder);
  ASSERT_TRUE(server);
  Status s = rogue->Connect(server->address(), Deadline::AfterMs(kGenerousMs))
                 .status();
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.ToString();
  EXPECT_TRUE(Has(s, "certificate")) << s.ToString();
}

TEST_F(TlsTransportTest, PlainAndTlsEndsRefuseEachOtherAtOnce) {
  auto tls_end = Make(pki_->worker_cert, pki_->worker_key);
  auto plain_end = Make("", "");
  auto tls_server = Listen(*tls_end);
  auto plain_server = Listen(*plain_end);
  ASSERT_TRUE(tls_server && plain_server);
  Status s =
      plain_end->Connect(tls_server->address(), Deadline::AfterMs(kGenerousMs))
          .status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_TRUE(Has(s, "the holder uses TLS on the data plane")) << s.ToString();
  s = tls_end->Connect(plain_server->address(), Deadline::AfterMs(kGenerousMs))
          .status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_TRUE(Has(s, "the holder does not use TLS")) << s.ToString();
}

}  // namespace
}  // namespace tensorhub::transport
