// Data-plane authentication: a challenge-response handshake at the start of
// every connection (frames in wire/frame.h). The holder sends a random
// nonce; the reader proves it knows the shared secret with
// HMAC-SHA256(secret, "tensorhub-data-v1" || nonce); the holder checks it in
// constant time and answers with a verdict. The secret never crosses the
// wire. With data-plane TLS the holder first sends StartTls, both ends run a
// mutual-TLS handshake, and the challenge-response follows inside TLS.
// Threat model: docs/security.md.
#ifndef TENSORHUB_TRANSPORT_TCP_AUTH_H_
#define TENSORHUB_TRANSPORT_TCP_AUTH_H_

#include <functional>
#include <string>

#include "common/deadline.h"
#include "tensorhub/status.h"
#include "transport/tcp/stream.h"
#include "wire/frame.h"

namespace tensorhub::tls {
class Context;
}  // namespace tensorhub::tls

namespace tensorhub::transport {

// Holder side. With `tls` (not null), announces TLS, runs the TLS handshake
// and leaves `stream` secured. PERMISSION_DENIED (after telling the peer) if
// the proof is wrong, or if the reader's certificate is missing or not
// trusted; other codes if the peer misbehaves, does not speak TLS, or
// stalls. Once the proof is right, `admit` (if set) says whether the
// server takes the reader: RESOURCE_EXHAUSTED (told to the peer, which
// then says UNAVAILABLE) if not.
Status ServerHandshake(Stream& stream, const std::string& secret,
                       const tls::Context* tls, const Deadline& deadline,
                       const std::function<bool()>& admit = nullptr);
// Reader side. PERMISSION_DENIED if the holder refused our proof or our
// certificate, or its certificate is not trusted; FAILED_PRECONDITION if
// one end uses data-plane TLS and the other does not (the message says
// which, and what to set). With `tls`, leaves `stream` secured.
Status ClientHandshake(Stream& stream, const std::string& secret,
                       const tls::Context* tls, const Deadline& deadline);

// The same on a plain TCP socket (test peers).
Status ServerHandshake(int fd, const std::string& secret,
                       const Deadline& deadline);
Status ClientHandshake(int fd, const std::string& secret,
                       const Deadline& deadline);

wire::Mac HandshakeMac(const std::string& secret, const wire::Nonce& nonce);

}  // namespace tensorhub::transport

#endif  // TENSORHUB_TRANSPORT_TCP_AUTH_H_
