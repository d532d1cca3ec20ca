#include "tls/tls.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

namespace tensorhub::tls {
namespace {

constexpr size_t kMaxPemFileBytes = 1 << 20;
// TLS 1.3 suites, cheapest first; all three are offloaded by kTLS.
constexpr char kCipherSuites[] =
    "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_"
    "SHA256";
// TLS 1.2: forward-secret AEAD suites only (the ones kTLS offloads).
constexpr char kCipherList[] = "ECDHE+AESGCM:ECDHE+CHACHA20";

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct CtxFree {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;
using CtxPtr = std::unique_ptr<SSL_CTX, CtxFree>;

BioPtr MemBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// Every certificate in `pem`, in order.
std::vector<X509Ptr> ParseCertificates(const std::string& pem) {
  std::vector<X509Ptr> out;
  BioPtr bio = MemBio(pem);
  while (bio) {
    X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
    if (x == nullptr) break;
    out.emplace_back(x);
  }
  ERR_clear_error();  // the end of the input reads as "no start line"
  return out;
}

// No passphrase: an encrypted key fails to load (and says so).
int NoPassword(char*, int, int, void*) { return 0; }

PkeyPtr ParseKey(const std::string& pem) {
  BioPtr bio = MemBio(pem);
  if (!bio) return nullptr;
  PkeyPtr k(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassword, nullptr));
  ERR_clear_error();
  return k;
}

std::string TimeText(const ASN1_TIME* t) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || ASN1_TIME_print(bio.get(), t) != 1) return "?";
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(std::max(0L, n)));
}

std::string SubjectText(X509* x) {
  char buf[256] = {0};
  X509_NAME_oneline(X509_get_subject_name(x), buf, sizeof(buf) - 1);
  return buf;
}

Status CheckValidity(X509* x, const std::string& where) {
  if (X509_cmp_current_time(X509_get0_notAfter(x)) < 0) {
    return InvalidArgument(where + ": certificate '" + SubjectText(x) +
                           "' expired on " + TimeText(X509_get0_notAfter(x)));
  }
  if (X509_cmp_current_time(X509_get0_notBefore(x)) > 0) {
    return InvalidArgument(where + ": certificate '" + SubjectText(x) +
                           "' is not valid before " +
                           TimeText(X509_get0_notBefore(x)));
  }
  return Status::Ok();
}

Result<std::string> ReadPemFile(const std::string& path, const char* option) {
  const std::string where = std::string(option) + " file '" + path + "'";
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return InvalidArgument("cannot read " + where + ": " +
                           std::strerror(errno));
  }
  std::string text(kMaxPemFileBytes + 1, '\0');
  size_t n = std::fread(text.data(), 1, text.size(), f);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return InvalidArgument("cannot read " + where);
  if (n > kMaxPemFileBytes) {
    return InvalidArgument(where + " is larger than 1 MiB: not a PEM file?");
  }
  text.resize(n);
  return text;
}

// Certificates of `pem` (at least one, each currently valid).
Status CheckCertificates(const std::string& pem, const std::string& where) {
  std::vector<X509Ptr> certs = ParseCertificates(pem);
  if (certs.empty()) {
    return InvalidArgument(where + " holds no PEM certificate");
  }
  for (const X509Ptr& x : certs)
    TH_RETURN_IF_ERROR(CheckValidity(x.get(), where));
  return Status::Ok();
}

Status UseIdentity(SSL_CTX* ctx, const Credentials& c) {
  std::vector<X509Ptr> chain = ParseCertificates(c.cert_chain);
  PkeyPtr key = ParseKey(c.key);
  if (chain.empty() || !key) return InvalidArgument("TLS identity is not PEM");
  if (SSL_CTX_use_certificate(ctx, chain[0].get()) != 1 ||
      SSL_CTX_use_PrivateKey(ctx, key.get()) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    return InvalidArgument("TLS identity refused: " + DrainErrors());
  }
  for (size_t i = 1; i < chain.size(); ++i) {
    if (SSL_CTX_add1_chain_cert(ctx, chain[i].get()) != 1) {
      return InvalidArgument("TLS certificate chain refused: " + DrainErrors());
    }
  }
  return Status::Ok();
}

Status TrustCas(SSL_CTX* ctx, const std::string& ca_pem) {
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  std::vector<X509Ptr> cas = ParseCertificates(ca_pem);
  if (cas.empty()) return InvalidArgument("TLS CA file holds no certificate");
  for (const X509Ptr& x : cas) {
    if (X509_STORE_add_cert(store, x.get()) != 1) {
      return InvalidArgument("TLS CA refused: " + DrainErrors());
    }
  }
  return Status::Ok();
}

// OpenSSL writes to the socket with write(2), which raises SIGPIPE when the
// peer has gone (and kills a process that did not ignore it): blocks SIGPIPE
// in this thread while OpenSSL may write, and takes back one it raised. A
// library must not change the process's signal handling; the plain socket
// path uses MSG_NOSIGNAL instead.
class ScopedNoSigpipe {
 public:
  ScopedNoSigpipe() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    was_pending_ = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~ScopedNoSigpipe() {
    if (sigismember(&old_, SIGPIPE)) return;  // blocked before: leave it
    sigset_t pending;
    sigemptyset(&pending);
    if (!was_pending_ && sigpending(&pending) == 0 &&
        sigismember(&pending, SIGPIPE)) {
      const timespec zero{0, 0};
      while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedNoSigpipe(const ScopedNoSigpipe&) = delete;
  ScopedNoSigpipe& operator=(const ScopedNoSigpipe&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
};

// Waits until `fd` is ready for `events`, or the deadline passes.
Status WaitFor(int fd, short events, const Deadline& deadline,
               const char* what) {
  while (true) {
    int64_t left = deadline.remaining_ms();
    if (left <= 0) return DeadlineExceeded(std::string("timed out ") + what);
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (rc > 0) return Status::Ok();
    if (rc < 0 && errno != EINTR) {
      return Unavailable(std::string("poll: ") + std::strerror(errno));
    }
  }
}

// Alerts sent and received on one SSL, recorded by its info callback (and
// whether the peer sent any handshake message, by its message callback).
struct Observed {
  int alert_received = -1;
  int alert_sent = -1;
  bool handshake_message_received = false;
  bool certificate_requested = false;  // the peer asked for ours
};

int ObservedIndex() {
  static const int index =
      SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return index;
}

void InfoCallback(const SSL* ssl, int where, int ret) {
  auto* o = static_cast<Observed*>(SSL_get_ex_data(ssl, ObservedIndex()));
  if (o == nullptr) return;
  // A close_notify is an orderly end, not a refusal.
  const int desc = ret & 0xff;
  if (desc == SSL_AD_CLOSE_NOTIFY) return;
  if ((where & SSL_CB_ALERT) == 0) return;
  if ((where & SSL_CB_READ) != 0) o->alert_received = desc;
  if ((where & SSL_CB_WRITE) != 0) o->alert_sent = desc;
}

void MessageCallback(int write_p, int, int content_type, const void* buf,
                     size_t len, SSL* ssl, void*) {
  auto* o = static_cast<Observed*>(SSL_get_ex_data(ssl, ObservedIndex()));
  if (o != nullptr && write_p == 0 && content_type == SSL3_RT_HANDSHAKE) {
    o->handshake_message_received = true;
    // A handshake message starts with its type.
    if (len > 0 &&
        static_cast<const uint8_t*>(buf)[0] == SSL3_MT_CERTIFICATE_REQUEST) {
      o->certificate_requested = true;
    }
  }
}

void Observe(SSL* ssl, Observed* o) {
  SSL_set_ex_data(ssl, ObservedIndex(), o);
  SSL_set_info_callback(ssl, InfoCallback);
  SSL_set_msg_callback(ssl, MessageCallback);
}

std::string AlertText(int desc) { return SSL_alert_desc_string_long(desc); }

bool IsCertificateAlert(int desc) {
  switch (desc) {
    case SSL_AD_BAD_CERTIFICATE:
    case SSL_AD_UNSUPPORTED_CERTIFICATE:
    case SSL_AD_CERTIFICATE_REVOKED:
    case SSL_AD_CERTIFICATE_EXPIRED:
    case SSL_AD_CERTIFICATE_UNKNOWN:
    case SSL_AD_UNKNOWN_CA:
    case SSL_AD_ACCESS_DENIED:
    case SSL_AD_HANDSHAKE_FAILURE:
    case SSL_AD_CERTIFICATE_REQUIRED:
      return true;
    default:
      return false;
  }
}

// The error of a failed handshake or transfer on `ssl` (SSL_get_error's
// `err`), as a status that says what went wrong in terms of certificates
// where that is the cause.
Status SslFailure(SSL* ssl, int err, const Observed& o, const char* what) {
  // Set by this end's check of the peer's certificate (which OpenSSL does
  // not keep when the check fails).
  const long verify = SSL_get_verify_result(ssl);
  if (verify != X509_V_OK && SSL_get_verify_mode(ssl) != SSL_VERIFY_NONE) {
    DrainErrors();
    return PermissionDenied(
        std::string("TLS: the peer's certificate is not trusted: ") +
        X509_verify_cert_error_string(verify) +
        " (every worker's certificate must be signed by a CA in tls_ca)");
  }
  if (o.alert_sent == SSL_AD_CERTIFICATE_REQUIRED) {
    DrainErrors();
    return PermissionDenied(
        "TLS: the peer presented no certificate (every worker needs tls_cert "
        "and tls_key for data-plane TLS)");
  }
  if (o.alert_received >= 0 && IsCertificateAlert(o.alert_received)) {
    DrainErrors();
    if (o.alert_received == SSL_AD_CERTIFICATE_REQUIRED) {
      return PermissionDenied(
          "TLS: the peer requires a certificate and this end presented none");
    }
    return PermissionDenied("TLS: the peer refused this end's certificate (" +
                            AlertText(o.alert_received) +
                            "): it must be signed by a CA the peer trusts");
  }
  if (err == SSL_ERROR_ZERO_RETURN) {
    DrainErrors();
    return Unavailable("peer closed the connection");
  }
  if (err == SSL_ERROR_SYSCALL) {
    const int e = errno;
    std::string queued = DrainErrors();
    if (!queued.empty())
      return Unavailable(std::string("TLS ") + what + ": " + queued);
    if (e == 0 || e == EPIPE || e == ECONNRESET) {
      return Unavailable("peer closed the connection");
    }
    return Unavailable(std::string(what) + ": " + std::strerror(e));
  }
  return Unavailable(std::string("TLS ") + what + ": " + DrainErrors());
}

bool IsIpAddress(const std::string& host) {
  in6_addr a6;
  in_addr a4;
  return ::inet_pton(AF_INET, host.c_str(), &a4) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), &a6) == 1;
}

}  // namespace

bool IsLoopbackListen(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") return true;
  in_addr a4;
  if (::inet_pton(AF_INET, host.c_str(), &a4) == 1) {
    return (ntohl(a4.s_addr) >> 24) == 127;
  }
  in6_addr a6;
  return ::inet_pton(AF_INET6, host.c_str(), &a6) == 1 &&
         IN6_IS_ADDR_LOOPBACK(&a6);
}

std::string DrainErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out;
}

Result<Credentials> LoadCredentials(const PemFiles& files) {
  Credentials c;
  if (files.cert.empty() != files.key.empty()) {
    return InvalidArgument(std::string(files.cert_option) + " and " +
                           files.key_option +
                           " go together: give both (this end's certificate "
                           "and its private key) or neither");
  }
  if (!files.cert.empty()) {
    const std::string cert_where =
        std::string(files.cert_option) + " file '" + files.cert + "'";
    const std::string key_where =
        std::string(files.key_option) + " file '" + files.key + "'";
    TH_ASSIGN_OR_RETURN(c.cert_chain,
                        ReadPemFile(files.cert, files.cert_option));
    TH_ASSIGN_OR_RETURN(c.key, ReadPemFile(files.key, files.key_option));
    TH_RETURN_IF_ERROR(CheckCertificates(c.cert_chain, cert_where));
    PkeyPtr key = ParseKey(c.key);
    if (!key) {
      return InvalidArgument(
          key_where +
          " holds no unencrypted PEM private key (an encrypted key needs its "
          "passphrase, which TensorHub does not ask for: decrypt it with "
          "`openssl pkey`)");
    }
    std::vector<X509Ptr> chain = ParseCertificates(c.cert_chain);
    if (X509_check_private_key(chain[0].get(), key.get()) != 1) {
      DrainErrors();
      return InvalidArgument(key_where + " is not the private key of " +
                             cert_where + " ('" + SubjectText(chain[0].get()) +
                             "')");
    }
  }
  if (!files.ca.empty()) {
    TH_ASSIGN_OR_RETURN(c.ca, ReadPemFile(files.ca, files.ca_option));
    TH_RETURN_IF_ERROR(CheckCertificates(
        c.ca, std::string(files.ca_option) + " file '" + files.ca + "'"));
  }
  return c;
}

KernelTlsSupport KernelTls() {
  KernelTlsSupport s;
  std::ifstream in("/proc/sys/net/ipv4/tcp_available_ulp");
  std::string word;
  bool readable = static_cast<bool>(in);
  while (in >> word) {
    if (word == "tls") {
      s.available = true;
      return s;
    }
  }
  s.why = readable
              ? "the kernel's 'tls' module is not loaded (`modprobe tls`; a "
                "kernel built without CONFIG_TLS has none)"
              : "cannot read /proc/sys/net/ipv4/tcp_available_ulp";
  return s;
}

Context::~Context() {
  SSL_CTX_free(server_);
  SSL_CTX_free(client_);
}

Result<std::shared_ptr<const Context>> Context::ForDataPlane(
    const Credentials& creds) {
  if (!creds.has_identity() || creds.ca.empty()) {
    return InvalidArgument(
        "data-plane TLS needs this worker's certificate and key (tls_cert, "
        "tls_key) and the deployment's CA (tls_ca)");
  }
  std::shared_ptr<Context> out(new Context());
  for (bool server : {true, false}) {
    CtxPtr ctx(SSL_CTX_new(server ? TLS_server_method() : TLS_client_method()));
    if (!ctx) return Internal("SSL_CTX_new: " + DrainErrors());
    SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
    SSL_CTX_set_options(ctx.get(), SSL_OP_ENABLE_KTLS | SSL_OP_NO_TICKET |
                                       SSL_OP_NO_RENEGOTIATION);
    if (server) SSL_CTX_set_num_tickets(ctx.get(), 0);
    SSL_CTX_set_mode(ctx.get(), SSL_MODE_ENABLE_PARTIAL_WRITE |
                                    SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (SSL_CTX_set_ciphersuites(ctx.get(), kCipherSuites) != 1 ||
        SSL_CTX_set_cipher_list(ctx.get(), kCipherList) != 1) {
      return Internal("TLS cipher configuration: " + DrainErrors());
    }
    TH_RETURN_IF_ERROR(UseIdentity(ctx.get(), creds));
    TH_RETURN_IF_ERROR(TrustCas(ctx.get(), creds.ca));
    SSL_CTX_set_verify(
        ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    (server ? out->server_ : out->client_) = ctx.release();
  }
  return std::shared_ptr<const Context>(std::move(out));
}

Session::Session(SSL* ssl, int fd) : ssl_(ssl), fd_(fd) {}

Session::~Session() {
  Observed* o = static_cast<Observed*>(SSL_get_ex_data(ssl_, ObservedIndex()));
  SSL_free(ssl_);
  delete o;
}

Result<std::unique_ptr<Session>> Session::Handshake(SSL_CTX* ctx, Role role,
                                                    int fd,
                                                    const Deadline& deadline) {
  ERR_clear_error();
  SSL* ssl = SSL_new(ctx);
  if (ssl == nullptr) return Internal("SSL_new: " + DrainErrors());
  std::unique_ptr<Session> s(new Session(ssl, fd));
  auto* observed = new Observed();
  Observe(ssl, observed);
  if (SSL_set_fd(ssl, fd) != 1) return Internal("SSL_set_fd: " + DrainErrors());
  if (role == Role::kServer) {
    SSL_set_accept_state(ssl);
  } else {
    SSL_set_connect_state(ssl);
  }
  ScopedNoSigpipe no_sigpipe;
  while (true) {
    ERR_clear_error();
    errno = 0;
    const int rc = SSL_do_handshake(ssl);
    if (rc == 1) return s;
    const int err = SSL_get_error(ssl, rc);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      TH_RETURN_IF_ERROR(WaitFor(fd,
                                 err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT,
                                 deadline, "in the TLS handshake"));
      continue;
    }
    Status st = SslFailure(ssl, err, *observed, "handshake");
    if (st.code() == StatusCode::kUnavailable &&
        !observed->handshake_message_received) {
      return Unavailable(
          "TLS handshake: the peer sent no TLS handshake message (it does not "
          "speak TLS here, or closed the connection): " +
          st.message());
    }
    return st;
  }
}

Status Session::Transfer(std::span<const iovec> iov, const Deadline& deadline,
                         int64_t stall_ms, bool write) {
  auto* observed =
      static_cast<Observed*>(SSL_get_ex_data(ssl_, ObservedIndex()));
  ScopedNoSigpipe no_sigpipe;  // a read may write too (alerts, key updates)
  for (const iovec& v : iov) {
    auto* p = static_cast<uint8_t*>(v.iov_base);
    size_t off = 0;
    while (off < v.iov_len) {
      ERR_clear_error();
      errno = 0;
      size_t n = 0;
      const size_t want = v.iov_len - off;
      const int rc = write ? SSL_write_ex(ssl_, p + off, want, &n)
                           : SSL_read_ex(ssl_, p + off, want, &n);
      if (rc == 1) {
        off += n;
        continue;
      }
      const int err = SSL_get_error(ssl_, rc);
      if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        Deadline wait = stall_ms > 0 ? deadline.Cap(stall_ms) : deadline;
        const bool stalled = wait.at_ms() < deadline.at_ms();
        TH_RETURN_IF_ERROR(WaitFor(
            fd_, err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, wait,
            stalled
                ? (write ? "sending (no progress)" : "receiving (no progress)")
                : (write ? "sending" : "receiving")));
        continue;
      }
      return SslFailure(ssl_, err, *observed, write ? "send" : "recv");
    }
  }
  return Status::Ok();
}

Status Session::Write(std::span<const iovec> iov, const Deadline& deadline,
                      int64_t stall_ms) {
  return Transfer(iov, deadline, stall_ms, true);
}

Status Session::Read(std::span<const iovec> iov, const Deadline& deadline,
                     int64_t stall_ms) {
  return Transfer(iov, deadline, stall_ms, false);
}

bool Session::HasBufferedInput() const { return SSL_has_pending(ssl_) == 1; }

bool Session::kernel_send() const {
  return BIO_get_ktls_send(SSL_get_wbio(ssl_));
}

bool Session::kernel_recv() const {
  return BIO_get_ktls_recv(SSL_get_rbio(ssl_));
}

std::string Session::description() const {
  return std::string(SSL_get_version(ssl_)) + " " +
         SSL_CIPHER_get_name(SSL_get_current_cipher(ssl_));
}

ProbeResult Probe(int fd, const Credentials* creds, const std::string& host,
                  const Deadline& deadline) {
  ProbeResult r;
  ERR_clear_error();
  CtxPtr ctx(SSL_CTX_new(TLS_client_method()));
  if (!ctx) {
    r.error = DrainErrors();
    return r;
  }
  static const unsigned char kAlpn[] = {2, 'h', '2'};
  SSL_CTX_set_alpn_protos(ctx.get(), kAlpn, sizeof(kAlpn));
  // A close without close_notify reads as SSL_ERROR_ZERO_RETURN.
  SSL_CTX_set_options(ctx.get(), SSL_OP_IGNORE_UNEXPECTED_EOF);
  if (creds != nullptr) {
    Status s = TrustCas(ctx.get(), creds->ca);
    if (s.ok() && creds->has_identity()) s = UseIdentity(ctx.get(), *creds);
    if (!s.ok()) {
      r.error = s.message();
      return r;
    }
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  } else {
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr);
  }
  SSL* ssl = SSL_new(ctx.get());
  if (ssl == nullptr) {
    r.error = DrainErrors();
    return r;
  }
  // Declared before the guard: the SSL's callbacks point at it until freed.
  Observed o;
  std::unique_ptr<SSL, void (*)(SSL*)> guard(ssl, SSL_free);
  Observe(ssl, &o);
  SSL_set_fd(ssl, fd);
  SSL_set_connect_state(ssl);
  if (!IsIpAddress(host)) SSL_set_tlsext_host_name(ssl, host.c_str());
  if (creds != nullptr) {
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
    if (IsIpAddress(host)) {
      X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str());
    } else {
      X509_VERIFY_PARAM_set1_host(param, host.c_str(), 0);
    }
  }
  ScopedNoSigpipe no_sigpipe;
  auto fail = [&](int err) {
    r.server_speaks_tls = o.handshake_message_received;
    r.certificate_requested = o.certificate_requested;
    const long verify = SSL_get_verify_result(ssl);
    if (verify != X509_V_OK && creds != nullptr) {
      r.verify_error = X509_verify_cert_error_string(verify);
    }
    if (o.alert_received >= 0) r.alert = AlertText(o.alert_received);
    r.error = SslFailure(ssl, err, o, "probe").message();
  };
  while (true) {
    ERR_clear_error();
    errno = 0;
    const int rc = SSL_do_handshake(ssl);
    if (rc == 1) break;
    const int err = SSL_get_error(ssl, rc);
    if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) {
      fail(err);
      return r;
    }
    Status w = WaitFor(fd, err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT,
                       deadline, "in the TLS handshake");
    if (!w.ok()) {
      r.server_speaks_tls = o.handshake_message_received;
      r.error = w.message();
      return r;
    }
  }
  r.server_speaks_tls = true;
  r.certificate_requested = o.certificate_requested;
  r.handshake_done = true;
  if (creds == nullptr) return r;
  auto fail_after_handshake = [&](int err) {
    fail(err);
    r.closed_after_handshake =
        r.alert.empty() &&
        (err == SSL_ERROR_ZERO_RETURN || err == SSL_ERROR_SYSCALL);
  };
  // The HTTP/2 client preface and an empty SETTINGS frame: a server that
  // accepted us answers with its SETTINGS; one that refused our
  // certificate has sent an alert instead.
  static const char kPreface[] =
      "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
  const size_t preface_bytes = sizeof(kPreface) - 1;
  size_t sent = 0;
  while (sent < preface_bytes) {
    ERR_clear_error();
    size_t n = 0;
    const int rc = SSL_write_ex(ssl, kPreface + sent, preface_bytes - sent, &n);
    if (rc == 1) {
      sent += n;
      continue;
    }
    const int err = SSL_get_error(ssl, rc);
    if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) {
      fail_after_handshake(err);
      return r;
    }
    if (!WaitFor(fd, err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline,
                 "sending")
             .ok()) {
      return r;
    }
  }
  while (true) {
    ERR_clear_error();
    errno = 0;
    char buf[64];
    size_t n = 0;
    const int rc = SSL_read_ex(ssl, buf, sizeof(buf), &n);
    if (rc == 1) {
      r.accepted = true;
      return r;
    }
    const int err = SSL_get_error(ssl, rc);
    if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) {
      fail_after_handshake(err);
      return r;
    }
    Status w = WaitFor(fd, err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT,
                       deadline, "waiting for the server's answer");
    if (!w.ok()) {
      r.error = w.message();
      return r;
    }
  }
}

}  // namespace tensorhub::tls
