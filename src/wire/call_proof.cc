#include "wire/call_proof.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace tensorhub::wire {
namespace {

constexpr char kVersion[] = "v1";
constexpr char kContext[] = "tensorhub-call-v1";
constexpr size_t kNonceBytes = 16;
constexpr size_t kMacBytes = 32;

std::string Hex(const uint8_t* p, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

// Lower-case hex only (as Hex writes it); false for anything else.
bool Unhex(std::string_view s, uint8_t* out, size_t n) {
  if (s.size() != 2 * n) return false;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < n; ++i) {
    const int hi = digit(s[2 * i]), lo = digit(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

// HMAC over "tensorhub-call-v1.<time>.<nonce hex>" as sent.
std::array<uint8_t, kMacBytes> Mac(const std::string& secret,
                                   std::string_view time,
                                   std::string_view nonce_hex) {
  std::string msg;
  msg.reserve(sizeof(kContext) + time.size() + nonce_hex.size() + 2);
  msg.append(kContext).append(".").append(time).append(".").append(nonce_hex);
  std::array<uint8_t, kMacBytes> mac{};
  unsigned int len = 0;
  static const char kEmpty = 0;  // HMAC allows an empty key, not a null one
  HMAC(EVP_sha256(), secret.empty() ? &kEmpty : secret.data(),
       static_cast<int>(secret.size()),
       reinterpret_cast<const uint8_t*>(msg.data()), msg.size(), mac.data(),
       &len);
  return mac;
}

Status Refuse(ProofRefusal r, ProofRefusal* why, const std::string& detail) {
  if (why != nullptr) *why = r;
  return PermissionDenied(detail);
}

}  // namespace

int64_t UnixNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string MakeCallProof(const std::string& secret, int64_t unix_ms) {
  uint8_t nonce[kNonceBytes];
  // Without randomness the nonce is zero: the proof still proves the
  // secret; only two proofs of one millisecond look alike.
  if (RAND_bytes(nonce, sizeof(nonce)) != 1)
    std::memset(nonce, 0, sizeof(nonce));
  const std::string time = std::to_string(unix_ms);
  const std::string nonce_hex = Hex(nonce, sizeof(nonce));
  const auto mac = Mac(secret, time, nonce_hex);
  return std::string(kVersion) + "." + time + "." + nonce_hex + "." +
         Hex(mac.data(), mac.size());
}

const char* ProofRefusalName(ProofRefusal r) {
  switch (r) {
    case ProofRefusal::kNone:
      return "none";
    case ProofRefusal::kMissing:
      return "missing";
    case ProofRefusal::kMalformed:
      return "malformed";
    case ProofRefusal::kStale:
      return "stale";
    case ProofRefusal::kWrongSecret:
      return "wrong_secret";
  }
  return "unknown";
}

Status CheckCallProof(std::string_view proof, const std::string& secret,
                      int64_t now_unix_ms, ProofRefusal* why) {
  if (why != nullptr) *why = ProofRefusal::kNone;
  if (proof.empty()) {
    return Refuse(ProofRefusal::kMissing, why,
                  "this hub requires a proof of the shared secret in each "
                  "call's metadata (th-proof), and the call had none: set the "
                  "hub's secret on the client (--secret-file, "
                  "TENSORHUB_SECRET_FILE); a client older than the hub sends "
                  "the secret in the request instead, which the hub accepts "
                  "only with --accept-request-secret (docs/security.md)");
  }
  const std::string malformed =
      "malformed proof of the shared secret in the call's metadata (th-proof)";
  if (proof.size() > kMaxCallProofBytes) {
    return Refuse(ProofRefusal::kMalformed, why, malformed);
  }
  // v1.<time>.<nonce>.<mac>
  std::string_view parts[4];
  size_t n = 0, at = 0;
  while (n < 4) {
    const size_t dot = n < 3 ? proof.find('.', at) : proof.size();
    if (dot == std::string_view::npos) break;
    parts[n++] = proof.substr(at, dot - at);
    at = dot + 1;
  }
  uint8_t nonce[kNonceBytes];
  std::array<uint8_t, kMacBytes> got{};
  if (n != 4 || parts[0] != kVersion || parts[1].empty() ||
      parts[1].size() > 19 ||
      parts[1].find_first_not_of("0123456789") != std::string_view::npos ||
      !Unhex(parts[2], nonce, sizeof(nonce)) ||
      !Unhex(parts[3], got.data(), got.size())) {
    return Refuse(ProofRefusal::kMalformed, why, malformed);
  }
  const int64_t proof_ms =
      std::strtoll(std::string(parts[1]).c_str(), nullptr, 10);
  // The MAC first: whoever does not know the secret learns nothing from
  // the hub's clock.
  const auto want = Mac(secret, parts[1], parts[2]);
  if (CRYPTO_memcmp(got.data(), want.data(), want.size()) != 0) {
    return Refuse(ProofRefusal::kWrongSecret, why,
                  "wrong shared secret: the call's proof (th-proof) does not "
                  "match this hub's secret (set the same secret on every "
                  "worker and the hub)");
  }
  const int64_t skew_ms = proof_ms - now_unix_ms;
  if (skew_ms > kMaxProofSkewMs || skew_ms < -kMaxProofSkewMs) {
    return Refuse(ProofRefusal::kStale, why,
                  "the call's proof of the shared secret is dated " +
                      std::to_string(skew_ms / 1000) +
                      " s from this hub's clock (at most " +
                      std::to_string(kMaxProofSkewMs / 1000) +
                      " s either way): synchronise the clocks of the hub and "
                      "its workers (NTP)");
  }
  return Status::Ok();
}

bool SecretsEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  if (a.empty()) return true;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace tensorhub::wire
