// What the hub checks of a call before gRPC reads its body (issue 27,
// docs/security.md "The hub's limits"): the proof of the shared secret in
// the call's metadata (wire/call_proof.h). gRPC runs it as the server
// credentials' auth metadata processor, on the call's initial metadata: a
// call without a valid proof is answered PERMISSION_DENIED at once, and its
// message, whatever its size, is never read into the hub's memory.
//
// Debian's gRPC 1.51 takes such a processor only on secure server
// credentials (grpc::InsecureServerCredentials() aborts on it), so the
// credentials are made from gRPC's C API here, plaintext and TLS alike.
#ifndef TENSORHUB_HUB_CALL_GATE_H_
#define TENSORHUB_HUB_CALL_GATE_H_

#include <grpcpp/security/server_credentials.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/refusal_log.h"
#include "tensorhub/status.h"
#include "tls/tls.h"
#include "wire/call_proof.h"

namespace tensorhub::hub {

// Thread-safe: gRPC calls Check from its threads.
class CallGate {
 public:
  // `secret` not empty. `accept_request_secret`: a call without a proof
  // passes here, and the service checks the secret inside its request (the
  // clients of earlier releases; such a call's body is read before that
  // check, as before).
  CallGate(std::string secret, bool accept_request_secret);
  CallGate(const CallGate&) = delete;
  CallGate& operator=(const CallGate&) = delete;

  // The verdict on a call's proof (empty: none), at the wall clock.
  Status Check(std::string_view proof);

  // Calls refused, by why (wire::ProofRefusal), and passed without a proof.
  uint64_t refused(wire::ProofRefusal why) const {
    return refused_[static_cast<int>(why)].load();
  }
  uint64_t passed_without_proof() const { return legacy_.load(); }

 private:
  const std::string secret_;
  const bool accept_request_secret_;
  std::atomic<uint64_t> refused_[5] = {};
  std::atomic<uint64_t> legacy_{0};
  // gRPC's hook does not learn the caller's address: the refusals are
  // logged together, one line per interval with their count.
  RefusalLog log_{"hub"};
};

// The hub's server credentials: TLS when `tls` is set (`client_certs`:
// mutual TLS, every caller must present a certificate of tls->ca), else
// plaintext; with `gate`, every call passes it first.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const tls::Credentials* tls, std::shared_ptr<CallGate> gate);

}  // namespace tensorhub::hub

#endif  // TENSORHUB_HUB_CALL_GATE_H_
