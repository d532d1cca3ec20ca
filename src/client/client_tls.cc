#include "client/client_tls.h"

#include "common/log.h"
#include "tls/tls.h"
#include "transport/tcp/socket_util.h"

namespace tensorhub::client {

Result<ClientTls> LoadClientTls(const ClientOptions& options) {
  ClientTls out;
  if (options.tls_ca_file.empty()) {
    if (!options.tls_cert_file.empty() || !options.tls_key_file.empty() ||
        options.data_tls || !options.tls_server_name.empty()) {
      return InvalidArgument(
          "TLS options without tls_ca (--tls-ca): give the CA that signed the "
          "hub's certificate (and, for data_tls, the workers')");
    }
    return out;
  }
  tls::PemFiles files;
  files.cert = options.tls_cert_file;
  files.key = options.tls_key_file;
  files.ca = options.tls_ca_file;
  files.cert_option = "tls_cert (--tls-cert)";
  files.key_option = "tls_key (--tls-key)";
  files.ca_option = "tls_ca (--tls-ca)";
  TH_ASSIGN_OR_RETURN(tls::Credentials creds, tls::LoadCredentials(files));
  out.hub.ca_pem = creds.ca;
  out.hub.cert_chain_pem = creds.cert_chain;
  out.hub.key_pem = creds.key;
  out.hub.server_name = options.tls_server_name;
  if (options.data_tls) {
    if (!creds.has_identity()) {
      return InvalidArgument(
          "data_tls (--data-tls) needs this worker's certificate and key, "
          "tls_cert (--tls-cert) and tls_key (--tls-key): every worker serves "
          "reads over TLS and shows it to readers");
    }
    TH_ASSIGN_OR_RETURN(out.data, tls::Context::ForDataPlane(creds));
  }
  return out;
}

// Long on purpose (about 70 lines): one probe, then one answer per way TLS
// to the hub fails, each naming its fix, in the order they are told apart.
Status DiagnoseHubTls(const std::string& address, const HubTls& hub_tls,
                      const Deadline& deadline) {
  Result<transport::Fd> fd = transport::ConnectTcp(address, deadline);
  if (!fd.ok()) return Status::Ok();  // nothing listens: not about TLS
  Result<std::pair<std::string, uint16_t>> hp =
      transport::SplitHostPort(address);
  if (!hp.ok()) return Status::Ok();
  const std::string host =
      hub_tls.server_name.empty() ? hp->first : hub_tls.server_name;
  tls::Credentials creds;
  creds.ca = hub_tls.ca_pem;
  creds.cert_chain = hub_tls.cert_chain_pem;
  creds.key = hub_tls.key_pem;
  tls::ProbeResult r = tls::Probe(
      fd->get(), hub_tls.enabled() ? &creds : nullptr, host, deadline);
  TH_LOG(DEBUG) << "TLS probe of " << address << ": speaks TLS "
                << r.server_speaks_tls << ", asked for a certificate "
                << r.certificate_requested << ", handshake done "
                << r.handshake_done << ", accepted " << r.accepted
                << ", closed after the handshake " << r.closed_after_handshake
                << ", verify error '" << r.verify_error << "', alert '"
                << r.alert << "', error '" << r.error << "'";
  const std::string hub = "the hub at " + address;
  if (!hub_tls.enabled()) {
    if (!r.server_speaks_tls) return Status::Ok();
    return FailedPrecondition(
        hub +
        " serves TLS and this client connects without it: set tls_ca "
        "(--tls-ca) to the CA that signed the hub's certificate (and tls_cert, "
        "tls_key if the hub requires client certificates)");
  }
  if (!r.server_speaks_tls) {
    return FailedPrecondition(
        hub +
        " does not speak TLS and this client requires it (tls_ca is set): "
        "start the hub with tls_cert and tls_key (--tls-cert, --tls-key), or "
        "connect without tls_ca (" +
        r.error + ")");
  }
  if (!r.verify_error.empty()) {
    const bool name = r.verify_error.find("mismatch") != std::string::npos;
    return PermissionDenied(
        "this client does not trust " + hub +
        "'s certificate: " + r.verify_error +
        (name ? " (the certificate does not name '" + host +
                    "': connect by a name it has, or set tls_server_name "
                    "(--tls-server-name) to one)"
              : " (it must be signed by the CA in tls_ca (--tls-ca))"));
  }
  if (!r.alert.empty() ||
      (r.closed_after_handshake && r.certificate_requested)) {
    // A refusal right after the handshake by a server that asked for our
    // certificate is about the certificate (gRPC closes without an alert).
    const std::string said =
        r.alert.empty()
            ? "it asked for a client certificate and closed the connection "
              "after the handshake"
            : "it sent the alert '" + r.alert + "'";
    if (hub_tls.cert_chain_pem.empty()) {
      return PermissionDenied(
          hub +
          " requires a client certificate (mutual TLS) and this client has "
          "none: set tls_cert and tls_key (--tls-cert, --tls-key) (" +
          said + ")");
    }
    return PermissionDenied(
        hub + " refused this client's certificate (" + said +
        "): it must be signed by a CA the hub trusts (its tls_client_ca, "
        "--tls-client-ca)");
  }
  return Status::Ok();
}

}  // namespace tensorhub::client
