#include "transport/tcp/auth.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/uio.h>

#include <cstring>

#include "tls/tls.h"

namespace tensorhub::transport {
namespace {

constexpr char kContext[] = "tensorhub-data-v1";

Status Send(Stream& s, const void* data, size_t n, const Deadline& deadline) {
  iovec v{const_cast<void*>(data), n};
  return s.Write({&v, 1}, deadline);
}

}  // namespace

wire::Mac HandshakeMac(const std::string& secret, const wire::Nonce& nonce) {
  uint8_t msg[sizeof(kContext) - 1 + wire::kNonceBytes];
  std::memcpy(msg, kContext, sizeof(kContext) - 1);
  std::memcpy(msg + sizeof(kContext) - 1, nonce.data(), nonce.size());
  wire::Mac mac{};
  unsigned int len = 0;
  // An empty key is allowed by HMAC; a non-null pointer keeps OpenSSL happy.
  static const char kEmpty = 0;
  HMAC(EVP_sha256(), secret.empty() ? &kEmpty : secret.data(),
       static_cast<int>(secret.size()), msg, sizeof(msg), mac.data(), &len);
  return mac;
}

Status ServerHandshake(Stream& s, const std::string& secret,
                       const tls::Context* tls, const Deadline& deadline,
                       const std::function<bool()>& admit) {
  if (tls != nullptr) {
    auto start = wire::EncodeStartTls();
    TH_RETURN_IF_ERROR(Send(s, start.data(), start.size(), deadline));
    Result<std::unique_ptr<tls::Session>> session = tls::Session::Handshake(
        tls->server(), tls::Session::Role::kServer, s.fd(), deadline);
    if (!session.ok()) {
      return session.status().WithContext(
          "this holder uses TLS on the data plane (data_tls)");
    }
    s.Secure(std::move(session).value());
  }
  wire::Nonce nonce;
  if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1) {
    return Internal("no randomness for the data-plane handshake");
  }
  auto challenge = wire::EncodeChallenge(nonce);
  TH_RETURN_IF_ERROR(Send(s, challenge.data(), challenge.size(), deadline));
  uint8_t proof[wire::kProofBytes];
  TH_RETURN_IF_ERROR(s.ReadExact(proof, sizeof(proof), deadline));
  TH_ASSIGN_OR_RETURN(wire::Mac got, wire::DecodeProof(proof, sizeof(proof)));
  wire::Mac want = HandshakeMac(secret, nonce);
  const bool ok = CRYPTO_memcmp(got.data(), want.data(), want.size()) == 0;
  const bool admitted = ok && (!admit || admit());
  auto verdict = wire::EncodeVerdict(
      ok ? admitted ? StatusCode::kOk : StatusCode::kResourceExhausted
         : StatusCode::kPermissionDenied);
  Status sent = Send(s, verdict.data(), verdict.size(), deadline);
  if (!ok) return PermissionDenied("wrong or missing shared secret");
  if (!admitted) {
    return ResourceExhausted("serving as many readers as it may at once");
  }
  return sent;
}

Status ClientHandshake(Stream& s, const std::string& secret,
                       const tls::Context* tls, const Deadline& deadline) {
  uint8_t first[wire::kChallengeBytes];
  TH_RETURN_IF_ERROR(s.ReadExact(first, sizeof(first), deadline));
  TH_ASSIGN_OR_RETURN(wire::HolderHello hello,
                      wire::DecodeHolderHello(first, sizeof(first)));
  if (hello.start_tls) {
    if (tls == nullptr) {
      return FailedPrecondition(
          "the holder uses TLS on the data plane (its worker runs with "
          "data_tls, --data-tls) and this worker does not: run every worker "
          "of the deployment with data_tls and the same tls_ca");
    }
    TH_ASSIGN_OR_RETURN(
        std::unique_ptr<tls::Session> session,
        tls::Session::Handshake(tls->client(), tls::Session::Role::kClient,
                                s.fd(), deadline));
    s.Secure(std::move(session));
    TH_RETURN_IF_ERROR(s.ReadExact(first, sizeof(first), deadline));
    TH_ASSIGN_OR_RETURN(hello, wire::DecodeHolderHello(first, sizeof(first)));
    if (hello.start_tls) {
      return InvalidArgument("the holder asked for TLS twice");
    }
  } else if (tls != nullptr) {
    // Refused, not downgraded: whoever answers in plaintext gets nothing.
    return FailedPrecondition(
        "the holder does not use TLS on the data plane and this worker "
        "requires it (data_tls, --data-tls): run every worker of the "
        "deployment with data_tls, or none");
  }
  auto proof = wire::EncodeProof(HandshakeMac(secret, hello.nonce));
  TH_RETURN_IF_ERROR(Send(s, proof.data(), proof.size(), deadline));
  uint8_t verdict[wire::kVerdictBytes];
  TH_RETURN_IF_ERROR(s.ReadExact(verdict, sizeof(verdict), deadline));
  TH_ASSIGN_OR_RETURN(StatusCode code,
                      wire::DecodeVerdict(verdict, sizeof(verdict)));
  if (code == StatusCode::kResourceExhausted) {
    return Unavailable(
        "the holder serves as many readers as it may at once "
        "(max_serving_connections); another holder, or this one later");
  }
  if (code != StatusCode::kOk) {
    return PermissionDenied(
        "the holder refused this worker's shared secret (set the same "
        "secret on every worker and the hub)");
  }
  return Status::Ok();
}

Status ServerHandshake(int fd, const std::string& secret,
                       const Deadline& deadline) {
  Stream s(fd);
  return ServerHandshake(s, secret, nullptr, deadline);
}

Status ClientHandshake(int fd, const std::string& secret,
                       const Deadline& deadline) {
  Stream s(fd);
  return ClientHandshake(s, secret, nullptr, deadline);
}

}  // namespace tensorhub::transport
