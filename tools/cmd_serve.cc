#include <cstdio>

#include "cli_util.h"
#include "common/log.h"
#include "hub/hub_service.h"

namespace tensorhub::cli {

int CmdServe(int argc, char** argv) {
  auto args = ParseArgs(
      argc, argv, 2,
      {"listen", "lease-ms", "secret-file", "keep-latest", "rebuild-ms",
       "metrics-listen", "tls-cert", "tls-key", "tls-client-ca"},
      {"oversubscribed-racks"});
  if (!args.ok()) return Fail(args.status());
  hub::HubServerOptions o;
  o.listen_address = args->Get("listen", "127.0.0.1:7070");
  o.metrics_listen = args->Get("metrics-listen");
  auto lease = args->GetU64("lease-ms", 5000);
  if (!lease.ok()) return Fail(lease.status());
  if (*lease < 100 || *lease > 3600000) {
    return Fail(InvalidArgument("--lease-ms must be in [100, 3600000]"));
  }
  o.lease_ms = static_cast<int64_t>(*lease);
  o.racks_oversubscribed = args->Has("oversubscribed-racks");
  if (args->Has("rebuild-ms")) {
    auto rebuild = args->GetU64("rebuild-ms", 0);
    if (!rebuild.ok()) return Fail(rebuild.status());
    if (*rebuild > 3600000)
      return Fail(InvalidArgument("--rebuild-ms must be in [0, 3600000]"));
    o.rebuild_ms = static_cast<int64_t>(*rebuild);
  }
  auto keep = args->GetU64("keep-latest", 0);
  if (!keep.ok()) return Fail(keep.status());
  if (*keep > 1024)
    return Fail(InvalidArgument("--keep-latest must be in [0, 1024]"));
  o.keep_latest = static_cast<uint32_t>(*keep);
  auto secret = Secret(*args);
  if (!secret.ok()) return Fail(secret.status());
  o.secret = *secret;
  o.tls_cert_file = args->Get("tls-cert");
  o.tls_key_file = args->Get("tls-key");
  o.tls_client_ca_file = args->Get("tls-client-ca");
  BlockStopSignals();
  SetLogPrefix("hub");
  auto server = hub::HubServer::Start(o);
  if (!server.ok()) return Fail(server.status());
  int sig = WaitForStopSignal();
  TH_LOG(INFO) << "signal " << sig << ": shutting down";
  (*server)->Shutdown();
  return 0;
}

}  // namespace tensorhub::cli
