// TLS credentials and sessions over loopback TCP, with certificates made by
// the openssl command (tls/throwaway_pki.h).
#include "tls/tls.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include "tls/pki_test_base.h"
#include "tls/throwaway_pki.h"

namespace tensorhub::tls {
namespace {

// Only matters if a call hangs; the tests check statuses, not the clock.
constexpr int64_t kGenerousMs = 30000;

bool Has(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

// A connected pair of non-blocking loopback TCP sockets (kTLS needs TCP).
struct SocketPair {
  int a = -1, b = -1;
  SocketPair() {
    int l = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (::bind(l, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(l, 1) != 0 ||
        ::getsockname(l, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ::close(l);
      return;
    }
    b = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(b, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::close(l);
      return;
    }
    a = ::accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
    ::close(l);
    for (int fd : {a, b})
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  ~SocketPair() {
    if (a >= 0) ::close(a);
    if (b >= 0) ::close(b);
  }
};

class TlsTest : public PkiTest {
 protected:
  static std::shared_ptr<const Context> DataContext(const std::string& cert,
                                                    const std::string& key,
                                                    const std::string& ca) {
    PemFiles f;
    f.cert = cert;
    f.key = key;
    f.ca = ca;
    Result<Credentials> c = LoadCredentials(f);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return nullptr;
    Result<std::shared_ptr<const Context>> ctx = Context::ForDataPlane(*c);
    EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
    return ctx.ok() ? *ctx : nullptr;
  }
};

TEST_F(TlsTest, LoadsCredentialsAndNamesEveryBadFileWithItsOption) {
  PemFiles f;
  f.cert = pki_->worker_cert;
  f.key = pki_->worker_key;
  f.ca = pki_->ca;
  f.cert_option = "tls_cert (--tls-cert)";
  f.key_option = "tls_key (--tls-key)";
  f.ca_option = "tls_ca (--tls-ca)";
  Result<Credentials> good = LoadCredentials(f);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_TRUE(good->has_identity());
  EXPECT_FALSE(good->ca.empty());

  PemFiles missing = f;
  missing.ca = pki_->Path("nope.pem");
  Status s = LoadCredentials(missing).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(s, "tls_ca (--tls-ca) file '" + missing.ca + "'"))
      << s.ToString();
  EXPECT_TRUE(Has(s, "No such file")) << s.ToString();

  PemFiles not_pem = f;
  not_pem.cert = pki_->not_pem;
  s = LoadCredentials(not_pem).status();
  EXPECT_TRUE(Has(
      s, "--tls-cert) file '" + pki_->not_pem + "' holds no PEM certificate"))
      << s.ToString();

  PemFiles key_not_pem = f;
  key_not_pem.key = pki_->not_pem;
  s = LoadCredentials(key_not_pem).status();
  EXPECT_TRUE(Has(s, "holds no unencrypted PEM private key")) << s.ToString();

  PemFiles wrong_key = f;
  wrong_key.key = pki_->worker2_key;
  s = LoadCredentials(wrong_key).status();
  EXPECT_TRUE(Has(s, "is not the private key of")) << s.ToString();

  PemFiles alone = f;
  alone.key.clear();
  s = LoadCredentials(alone).status();
  EXPECT_TRUE(Has(s, "go together")) << s.ToString();

  // A data-plane context needs both an identity and a CA.
  PemFiles ca_only;
  ca_only.ca = pki_->ca;
  Result<Credentials> c = LoadCredentials(ca_only);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(Context::ForDataPlane(*c).status().code(),
            StatusCode::kInvalidArgument);
}

// How TLS ran in one Echo.
struct EchoRun {
  bool server_kernel_send = false;
  bool client_kernel_send = false;
  bool client_kernel_recv = false;
};

// The command that runs the kernel TLS tests on a kernel that has kTLS: the
// skip message of each says it.
constexpr char kKernelTlsCommand[] =
    "on a kernel with the tls module: sudo modprobe tls && (cd build && "
    "ctest -R 'tls_unit_test|tls_transport_test|tls_integration_test' "
    "--output-on-failure)";

// Both ends with certificates of the deployment's CA: 8 MiB from the client
// to the server and back (in two pieces); the bytes must cross both ways
// intact.
void Echo(const Context& server_ctx, const Context& client_ctx, EchoRun* run) {
  SocketPair sp;
  ASSERT_GE(sp.a, 0);
  std::vector<uint8_t> sent(8 << 20);
  std::mt19937 rng(7);
  for (uint8_t& b : sent) b = static_cast<uint8_t>(rng());
  std::promise<bool> server_kernel_send;
  std::thread server([&] {
    auto s = Session::Handshake(server_ctx.server(), Session::Role::kServer,
                                sp.a, Deadline::AfterMs(kGenerousMs));
    server_kernel_send.set_value(s.ok() && (*s)->kernel_send());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    std::vector<uint8_t> got(sent.size());
    iovec v{got.data(), got.size()};
    ASSERT_TRUE((*s)->Read({&v, 1}, Deadline::AfterMs(kGenerousMs)).ok());
    // Echo it back in two pieces.
    iovec back[2] = {{got.data(), 12345},
                     {got.data() + 12345, got.size() - 12345}};
    Status w = (*s)->Write(back, Deadline::AfterMs(kGenerousMs));
    ASSERT_TRUE(w.ok()) << w.ToString();
  });
  auto c = Session::Handshake(client_ctx.client(), Session::Role::kClient, sp.b,
                              Deadline::AfterMs(kGenerousMs));
  if (!c.ok()) server.join();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_NE((*c)->description().find("TLSv1.3"), std::string::npos)
      << (*c)->description();
  run->client_kernel_send = (*c)->kernel_send();
  run->client_kernel_recv = (*c)->kernel_recv();
  iovec out{sent.data(), sent.size()};
  Status w = (*c)->Write({&out, 1}, Deadline::AfterMs(kGenerousMs));
  std::vector<uint8_t> echo(sent.size());
  iovec in{echo.data(), echo.size()};
  Status r = w.ok() ? (*c)->Read({&in, 1}, Deadline::AfterMs(kGenerousMs)) : w;
  server.join();
  ASSERT_TRUE(w.ok()) << w.ToString();
  ASSERT_TRUE(r.ok()) << r.ToString();
  EXPECT_TRUE(echo == sent);
  run->server_kernel_send = server_kernel_send.get_future().get();
}

// Bytes cross both ways intact, and each end reports kernel TLS for its
// sends exactly when this kernel offers it.
TEST_F(TlsTest, MutualSessionMovesBytesAndReportsKernelTls) {
  auto server_ctx = DataContext(pki_->worker_cert, pki_->worker_key, pki_->ca);
  auto client_ctx =
      DataContext(pki_->worker2_cert, pki_->worker2_key, pki_->ca);
  ASSERT_TRUE(server_ctx && client_ctx);
  EchoRun run;
  ASSERT_NO_FATAL_FAILURE(Echo(*server_ctx, *client_ctx, &run));
  const bool kernel = KernelTls().available;
  EXPECT_EQ(run.server_kernel_send, kernel);
  EXPECT_EQ(run.client_kernel_send, kernel);
}

// Kernel TLS: the kernel encrypts both ends' sends (the zero-copy send path
// of a holder), and the other end's OpenSSL decrypts those records. OpenSSL
// 3.0 (Debian 12) has no TLS 1.3 kernel receive, so receives are not
// required to be the kernel's. Skips where the kernel has no kTLS.
TEST_F(TlsTest, KernelTlsEncryptsTheSendsOfBothEnds) {
  KernelTlsSupport k = KernelTls();
  if (!k.available) {
    GTEST_SKIP() << "no kernel TLS here: " << k.why << "; "
                 << kKernelTlsCommand;
  }
  auto server_ctx = DataContext(pki_->worker_cert, pki_->worker_key, pki_->ca);
  auto client_ctx =
      DataContext(pki_->worker2_cert, pki_->worker2_key, pki_->ca);
  ASSERT_TRUE(server_ctx && client_ctx);
  EchoRun run;
  ASSERT_NO_FATAL_FAILURE(Echo(*server_ctx, *client_ctx, &run));
  EXPECT_TRUE(run.server_kernel_send)
      << "the kernel offers TLS but OpenSSL did not use it";
  EXPECT_TRUE(run.client_kernel_send)
      << "the kernel offers TLS but OpenSSL did not use it";
  std::printf("kernel TLS: sends both ends; the client's receives %s\n",
              run.client_kernel_recv ? "too" : "in OpenSSL");
}

// A peer whose certificate another CA signed is refused, by whichever end
// checks it, with PERMISSION_DENIED that says why.
TEST_F(TlsTest, CertificateOfAnotherCaIsRefused) {
  auto server_ctx = DataContext(pki_->worker_cert, pki_->worker_key, pki_->ca);
  // Trusts the right CA but shows a certificate of another one.
  auto rogue_ctx = DataContext(pki_->rogue_cert, pki_->rogue_key, pki_->ca);
  ASSERT_TRUE(server_ctx && rogue_ctx);
  SocketPair sp;
  ASSERT_GE(sp.a, 0);
  auto server = std::async(std::launch::async, [&] {
    return Session::Handshake(server_ctx->server(), Session::Role::kServer,
                              sp.a, Deadline::AfterMs(kGenerousMs))
        .status();
  });
  auto c = Session::Handshake(rogue_ctx->client(), Session::Role::kClient, sp.b,
                              Deadline::AfterMs(kGenerousMs));
  Status server_status = server.get();
  EXPECT_EQ(server_status.code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(Has(server_status, "not trusted")) << server_status.ToString();
  // TLS 1.3: the client's handshake ends before the server has judged its
  // certificate; the refusal comes with the first read.
  Status client_status = c.status();
  if (c.ok()) {
    uint8_t byte;
    iovec v{&byte, 1};
    client_status = (*c)->Read({&v, 1}, Deadline::AfterMs(kGenerousMs));
  }
  EXPECT_EQ(client_status.code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(Has(client_status, "refused this end's certificate"))
      << client_status.ToString();
}

TEST_F(TlsTest, ServerOfAnotherCaIsNotTrusted) {
  auto rogue_server =
      DataContext(pki_->rogue_cert, pki_->rogue_key, pki_->other_ca);
  auto client_ctx = DataContext(pki_->worker_cert, pki_->worker_key, pki_->ca);
  ASSERT_TRUE(rogue_server && client_ctx);
  SocketPair sp;
  ASSERT_GE(sp.a, 0);
  auto server = std::async(std::launch::async, [&] {
    return Session::Handshake(rogue_server->server(), Session::Role::kServer,
                              sp.a, Deadline::AfterMs(kGenerousMs))
        .status();
  });
  Status c = Session::Handshake(client_ctx->client(), Session::Role::kClient,
                                sp.b, Deadline::AfterMs(kGenerousMs))
                 .status();
  EXPECT_EQ(c.code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(Has(c, "not trusted")) << c.ToString();
  EXPECT_FALSE(server.get().ok());
}

// A peer that does not speak TLS: the handshake says so; a silent one ends
// at the deadline.
TEST_F(TlsTest, PlainPeerAndSilentPeer) {
  auto ctx = DataContext(pki_->worker_cert, pki_->worker_key, pki_->ca);
  ASSERT_TRUE(ctx);
  {
    SocketPair sp;
    ASSERT_GE(sp.a, 0);
    const char plain[] = "GET / HTTP/1.1\r\n\r\n";
    ASSERT_EQ(::send(sp.b, plain, sizeof(plain) - 1, MSG_NOSIGNAL),
              static_cast<ssize_t>(sizeof(plain) - 1));
    ::shutdown(sp.b, SHUT_WR);
    Status s = Session::Handshake(ctx->server(), Session::Role::kServer, sp.a,
                                  Deadline::AfterMs(kGenerousMs))
                   .status();
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    EXPECT_TRUE(Has(s, "does not speak TLS")) << s.ToString();
  }
  {
    SocketPair sp;
    ASSERT_GE(sp.a, 0);
    Status s = Session::Handshake(ctx->server(), Session::Role::kServer, sp.a,
                                  Deadline::AfterMs(100))
                   .status();
    EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  }
}

// OpenSSL writes with write(2): a peer that has gone must give an error,
// not a SIGPIPE that kills the process (nothing here ignores SIGPIPE).
TEST_F(TlsTest, WritingToAPeerThatLeftIsAnErrorNotASignal) {
  auto server_ctx = DataContext(pki_->worker_cert, pki_->worker_key, pki_->ca);
  auto client_ctx =
      DataContext(pki_->worker2_cert, pki_->worker2_key, pki_->ca);
  ASSERT_TRUE(server_ctx && client_ctx);
  SocketPair sp;
  ASSERT_GE(sp.a, 0);
  auto server = std::async(std::launch::async, [&] {
    return Session::Handshake(server_ctx->server(), Session::Role::kServer,
                              sp.a, Deadline::AfterMs(kGenerousMs));
  });
  auto c = Session::Handshake(client_ctx->client(), Session::Role::kClient,
                              sp.b, Deadline::AfterMs(kGenerousMs));
  auto s = server.get();
  ASSERT_TRUE(c.ok() && s.ok());
  c->reset();
  ::close(sp.b);  // the reader leaves
  sp.b = -1;
  std::vector<uint8_t> big(8 << 20, 7);
  iovec v{big.data(), big.size()};
  Status w;
  // The first writes may still land in the socket buffer; the peer's reset
  // then fails a later one.
  for (int i = 0; i < 64 && w.ok(); ++i) {
    w = (*s)->Write({&v, 1}, Deadline::AfterMs(kGenerousMs));
  }
  EXPECT_EQ(w.code(), StatusCode::kUnavailable) << w.ToString();
}

}  // namespace
}  // namespace tensorhub::tls
