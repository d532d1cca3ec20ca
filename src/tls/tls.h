// TLS on OpenSSL (libssl), for both planes. Three parts:
//  * Credentials: PEM files read and checked when a hub or worker starts, so
//    that a missing file, a key that does not match its certificate, or an
//    expired certificate is reported then, naming the file and its option,
//    not later as an opaque handshake failure. The control plane hands the
//    PEM text to gRPC, which does its own TLS.
//  * Context: the data plane's SSL_CTX pair. Mutual TLS: both ends present a
//    certificate and verify the other's against the deployment's CA. Kernel
//    TLS (kTLS) is allowed, so that after the handshake a holder's sends are
//    encrypted by the kernel and keep going straight from its buffers.
//  * Session: one TLS connection over a connected non-blocking socket, every
//    call bounded by a deadline (and transfers by a no-progress bound), as
//    transport/tcp/socket_util.h is for plain sockets.
// Threat model and what each option means: docs/security.md.
#ifndef TENSORHUB_TLS_TLS_H_
#define TENSORHUB_TLS_TLS_H_

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/deadline.h"
#include "tensorhub/status.h"

typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;

namespace tensorhub::tls {

// The files one end uses (paths; empty: not given), and the names of the
// options they came from, for messages ("tls_cert (--tls-cert)").
struct PemFiles {
  std::string cert;
  std::string key;
  std::string ca;
  const char* cert_option = "tls_cert";
  const char* key_option = "tls_key";
  const char* ca_option = "tls_ca";
};

// PEM text, checked: `cert_chain` holds at least one certificate (the first
// is this end's, any others its chain), `key` the matching unencrypted
// private key, `ca` at least one CA certificate. Empty where not given.
struct Credentials {
  std::string cert_chain;
  std::string key;
  std::string ca;
  bool has_identity() const { return !cert_chain.empty(); }
};

// Reads and checks what `files` names. INVALID_ARGUMENT, naming the file and
// its option, if a file cannot be read, is larger than 1 MiB, holds no
// certificate (or key), if the key does not match the certificate, if a
// certificate is expired or not yet valid, or if only one of cert and key
// is given.
Result<Credentials> LoadCredentials(const PemFiles& files);

// Whether this kernel offers kernel TLS: "tls" among the TCP upper-layer
// protocols (/proc/sys/net/ipv4/tcp_available_ulp). If not, `why` says what
// to do. The module may also load on first use, so a session's
// kernel_send() is the final word.
struct KernelTlsSupport {
  bool available = false;
  std::string why;
};
KernelTlsSupport KernelTls();

// The data plane's contexts: mutual TLS, TLS 1.2 or newer (1.3 preferred,
// AES-128-GCM first: the cheapest cipher that kTLS offloads), no session
// tickets (nothing to resume, and no post-handshake message to confuse a
// kernel receive path), kTLS enabled. The peer's certificate must chain to
// creds.ca; its host name is not checked (a worker is known by the hub's
// table, its certificate proves it belongs to the deployment: see
// docs/security.md). Thread-safe, shared by every connection.
class Context {
 public:
  // INVALID_ARGUMENT unless creds has an identity and a CA.
  static Result<std::shared_ptr<const Context>> ForDataPlane(
      const Credentials& creds);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  SSL_CTX* server() const { return server_; }
  SSL_CTX* client() const { return client_; }

 private:
  Context() = default;
  SSL_CTX* server_ = nullptr;
  SSL_CTX* client_ = nullptr;
};

// One TLS connection on a connected socket `fd` (not owned: it must outlive
// the session; set O_NONBLOCK). One thread at a time, except that another
// thread may shutdown(2) the socket to make a call end soon.
class Session {
 public:
  enum class Role { kServer, kClient };

  // Runs the handshake within `deadline`. PERMISSION_DENIED if the peer's
  // certificate is not trusted or the peer refused ours (the message says
  // which, and why); UNAVAILABLE on I/O errors or a peer that does not
  // speak TLS; DEADLINE_EXCEEDED.
  static Result<std::unique_ptr<Session>> Handshake(SSL_CTX* ctx, Role role,
                                                    int fd,
                                                    const Deadline& deadline);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Every byte of `iov`, through OpenSSL, before the deadline; `stall_ms`
  // (if > 0) also fails the call when no byte moves for that long.
  // UNAVAILABLE if the peer closed the connection or on I/O errors.
  Status Write(std::span<const iovec> iov, const Deadline& deadline,
               int64_t stall_ms = 0);
  Status Read(std::span<const iovec> iov, const Deadline& deadline,
              int64_t stall_ms = 0);

  // Received bytes OpenSSL holds (decrypted or not) that poll(2) on the
  // socket cannot see.
  bool HasBufferedInput() const;
  // The kernel encrypts this end's sends (kTLS): the application may then
  // write plaintext to the socket itself (sendmsg), and OpenSSL's Write
  // goes to the kernel too.
  bool kernel_send() const;
  // The kernel decrypts what this end receives.
  bool kernel_recv() const;
  // "TLSv1.3 TLS_AES_128_GCM_SHA256".
  std::string description() const;

 private:
  Session(SSL* ssl, int fd);
  Status Transfer(std::span<const iovec> iov, const Deadline& deadline,
                  int64_t stall_ms, bool write);
  SSL* ssl_;
  int fd_;
};

// What one TLS handshake with a server showed, to explain why a gRPC
// channel to the hub failed (client/hub_probe.cc).
struct ProbeResult {
  // A TLS handshake message came back: the server speaks TLS.
  bool server_speaks_tls = false;
  // It asked for a client certificate (mutual TLS).
  bool certificate_requested = false;
  // The handshake finished (on this end: with TLS 1.3 the server may still
  // refuse our certificate afterwards).
  bool handshake_done = false;
  // Our check of its certificate failed: why (else empty).
  std::string verify_error;
  // The alert the server sent, e.g. "certificate required" (else empty).
  std::string alert;
  // After the handshake it answered our HTTP/2 preface: it accepted us.
  bool accepted = false;
  // After the handshake it closed the connection without a word (gRPC's
  // TLS sends no alert when it refuses a client certificate).
  bool closed_after_handshake = false;
  // OpenSSL's or the socket's last error, for messages.
  std::string error;
};

// Runs a TLS client handshake on connected socket `fd` (not owned) as
// gRPC would: ALPN "h2", server name `host` (a name or an IP address).
// `creds` null: trusts anything (only to learn whether the server speaks
// TLS). Else verifies the server against creds->ca and `host`, presents
// creds' identity if it has one, and after the handshake sends an HTTP/2
// preface to see whether the server accepts the connection or refuses our
// certificate (TLS 1.3 refuses after the client's handshake has finished).
ProbeResult Probe(int fd, const Credentials* creds, const std::string& host,
                  const Deadline& deadline);

// Whether a server bound to HOST:PORT `address` is reachable only from this
// machine: 127.0.0.0/8, ::1 or localhost. 0.0.0.0, [::], other addresses and
// names: no.
bool IsLoopbackListen(const std::string& address);

// The OpenSSL errors queued on this thread, as one line (and clears them).
std::string DrainErrors();

}  // namespace tensorhub::tls

#endif  // TENSORHUB_TLS_TLS_H_
