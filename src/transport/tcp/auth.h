// Data-plane authentication: a challenge-response handshake at the start of
// every connection (frames in wire/frame.h). The holder sends a random
// nonce; the reader proves it knows the shared secret with
// HMAC-SHA256(secret, "tensorhub-data-v1" || nonce); the holder checks it in
// constant time and answers with a verdict. The secret never crosses the
// wire. Threat model: docs/security.md.
#ifndef TENSORHUB_TRANSPORT_TCP_AUTH_H_
#define TENSORHUB_TRANSPORT_TCP_AUTH_H_

#include <string>

#include "common/deadline.h"
#include "tensorhub/status.h"
#include "wire/frame.h"

namespace tensorhub::transport {

// Holder side. PERMISSION_DENIED (after telling the peer) if the proof is
// wrong; other codes if the peer misbehaves or stalls.
Status ServerHandshake(int fd, const std::string& secret,
                       const Deadline& deadline);
// Reader side. PERMISSION_DENIED if the holder refused our proof.
Status ClientHandshake(int fd, const std::string& secret,
                       const Deadline& deadline);

wire::Mac HandshakeMac(const std::string& secret, const wire::Nonce& nonce);

}  // namespace tensorhub::transport

#endif  // TENSORHUB_TRANSPORT_TCP_AUTH_H_
