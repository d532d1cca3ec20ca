// A worker's TLS, from its ClientOptions: the files read and checked once
// at Connect, the control channel's PEM text (HubTls, for gRPC), the data
// plane's context, and the diagnosis of a hub that cannot be reached
// because of TLS. Internal: not part of include/.
#ifndef TENSORHUB_CLIENT_CLIENT_TLS_H_
#define TENSORHUB_CLIENT_CLIENT_TLS_H_

#include <memory>
#include <string>

#include "client/control_plane.h"
#include "common/deadline.h"
#include "tensorhub/client.h"
#include "tensorhub/status.h"

namespace tensorhub::tls {
class Context;
}  // namespace tensorhub::tls

namespace tensorhub::client {

struct ClientTls {
  HubTls hub;
  // Null without data_tls.
  std::shared_ptr<const tls::Context> data;
};

// INVALID_ARGUMENT naming the option and file of a missing, unreadable or
// mismatched file, or for a combination that cannot work (a certificate
// without tls_ca, data_tls without all three files).
Result<ClientTls> LoadClientTls(const ClientOptions& options);

// After a call could not reach the hub at `address`: connects to it once and
// runs a TLS handshake as `tls` would (or, without TLS, just to see whether
// the hub speaks it). Returns what TLS has to do with the failure:
// FAILED_PRECONDITION when one end uses TLS and the other does not,
// PERMISSION_DENIED when a certificate is missing or not trusted (either
// way), each saying what to set; OK when TLS is not the reason (nothing
// listens, or the handshake works).
Status DiagnoseHubTls(const std::string& address, const HubTls& tls,
                      const Deadline& deadline);

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_CLIENT_TLS_H_
