#include "transport/tcp/auth.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/uio.h>

#include <cstring>

#include "transport/tcp/socket_util.h"

namespace tensorhub::transport {
namespace {

constexpr char kContext[] = "tensorhub-data-v1";

Status Send(int fd, const void* data, size_t n, const Deadline& deadline) {
  iovec v{const_cast<void*>(data), n};
  return WriteAll(fd, {&v, 1}, deadline);
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

Status ServerHandshake(int fd, const std::string& secret,
                       const Deadline& deadline) {
  wire::Nonce nonce;
  if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1) {
    return Internal("no randomness for the data-plane handshake");
  }
  auto challenge = wire::EncodeChallenge(nonce);
  TH_RETURN_IF_ERROR(Send(fd, challenge.data(), challenge.size(), deadline));
  uint8_t proof[wire::kProofBytes];
  TH_RETURN_IF_ERROR(ReadExact(fd, proof, sizeof(proof), deadline));
  TH_ASSIGN_OR_RETURN(wire::Mac got, wire::DecodeProof(proof, sizeof(proof)));
  wire::Mac want = HandshakeMac(secret, nonce);
  bool ok = CRYPTO_memcmp(got.data(), want.data(), want.size()) == 0;
  auto verdict =
      wire::EncodeVerdict(ok ? StatusCode::kOk : StatusCode::kPermissionDenied);
  Status sent = Send(fd, verdict.data(), verdict.size(), deadline);
  if (!ok) return PermissionDenied("wrong or missing shared secret");
  return sent;
}

Status ClientHandshake(int fd, const std::string& secret,
                       const Deadline& deadline) {
  uint8_t challenge[wire::kChallengeBytes];
  TH_RETURN_IF_ERROR(ReadExact(fd, challenge, sizeof(challenge), deadline));
  TH_ASSIGN_OR_RETURN(wire::Nonce nonce,
                      wire::DecodeChallenge(challenge, sizeof(challenge)));
  auto proof = wire::EncodeProof(HandshakeMac(secret, nonce));
  TH_RETURN_IF_ERROR(Send(fd, proof.data(), proof.size(), deadline));
  uint8_t verdict[wire::kVerdictBytes];
  TH_RETURN_IF_ERROR(ReadExact(fd, verdict, sizeof(verdict), deadline));
  TH_ASSIGN_OR_RETURN(StatusCode code,
                      wire::DecodeVerdict(verdict, sizeof(verdict)));
  if (code != StatusCode::kOk) {
    return PermissionDenied(
        "the holder refused this worker's shared secret (set the same "
        "secret on every worker and the hub)");
  }
  return Status::Ok();
}

}  // namespace tensorhub::transport
