// The proof of the shared secret that every control-plane call carries in
// its gRPC metadata (docs/wire.md, "Call proof"), so that the hub can refuse
// a caller before it reads the request's body (docs/security.md):
//
//   th-proof: v1.<unix_ms>.<nonce: 32 hex>.<HMAC-SHA256: 64 hex>
//
// The MAC is HMAC-SHA256(secret, "tensorhub-call-v1" || "." || unix_ms ||
// "." || nonce), over the text as sent. The secret itself never crosses the
// wire. The hub accepts a proof whose time is within kMaxProofSkewMs of its
// own wall clock: without TLS, a proof seen on the network can be replayed
// for that long (as the secret itself could before, for ever).
//
// Encoding and checking only, no I/O. Thread-safe.
#ifndef TENSORHUB_WIRE_CALL_PROOF_H_
#define TENSORHUB_WIRE_CALL_PROOF_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "tensorhub/status.h"

namespace tensorhub::wire {

// The metadata key (gRPC keys are lower case).
inline constexpr char kCallProofKey[] = "th-proof";
// How far a proof's time may be from the checker's clock, either way.
inline constexpr int64_t kMaxProofSkewMs = 5 * 60 * 1000;
// A proof longer than this is refused unread.
inline constexpr size_t kMaxCallProofBytes = 128;

// The wall clock in ms since the Unix epoch (proofs carry it).
int64_t UnixNowMs();

// A proof for one call at `unix_ms`, with a fresh random nonce.
std::string MakeCallProof(const std::string& secret, int64_t unix_ms);

// Why a proof was refused, for metrics and the refusal log.
enum class ProofRefusal { kNone, kMissing, kMalformed, kStale, kWrongSecret };
const char* ProofRefusalName(ProofRefusal r);

// Checks `proof` (as received; empty: none was sent) against `secret` at
// `now_unix_ms`, comparing the MAC in constant time. On refusal, `*why`
// (if not null) says which, and the status (PERMISSION_DENIED) says what
// the caller should fix.
Status CheckCallProof(std::string_view proof, const std::string& secret,
                      int64_t now_unix_ms, ProofRefusal* why = nullptr);

// Constant-time equality of two secrets (or MACs): the time taken depends
// on the lengths only, not on where they first differ.
bool SecretsEqual(std::string_view a, std::string_view b);

}  // namespace tensorhub::wire

#endif  // TENSORHUB_WIRE_CALL_PROOF_H_
