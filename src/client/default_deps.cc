// The product's seams for a Client (client_deps.h: DefaultClientDeps): the
// data-plane transports this build and machine can run, the hub over gRPC,
// the real clock.
#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "client/client_deps.h"
#include "client/client_tls.h"
#include "client/transport_set.h"
#include "common/log.h"
#include "tls/tls.h"
#include "transport/tcp/socket_util.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/ucx/ucx_transport.h"
#include "transport/ucx/ucx_wires.h"

namespace tensorhub::client {
namespace {

// The transports asked for, in order: the options', else the
// environment's TENSORHUB_TRANSPORTS, else tcp.
std::vector<std::string> WantedTransports(const ClientOptions& options) {
  if (!options.transports.empty()) return options.transports;
  std::vector<std::string> out;
  const char* env = std::getenv("TENSORHUB_TRANSPORTS");
  std::string list = env != nullptr ? env : "";
  for (size_t at = 0; at <= list.size();) {
    size_t comma = std::min(list.find(',', at), list.size());
    if (comma > at) out.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  if (out.empty()) out.push_back("tcp");
  return out;
}

// A holder gives each UCX reader connection a worker of its own, which
// costs descriptors: about 13 with every UCX wire allowed, 9 with tcp alone
// (`tensorhub bench ucx` prints it; docs/design.md, UCX data plane). Says
// so at start-up where this process may not open enough for its
// connection cap: readers past it would be sent to tcp.
void WarnIfTooFewDescriptorsForUcx(size_t max_serving_connections) {
  constexpr uint64_t kPerUcxConnection = 14;
  constexpr uint64_t kForTheRest = 256;  // hub channel, fetches, files
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) {
    return;
  }
  const uint64_t want =
      max_serving_connections * kPerUcxConnection + kForTheRest;
  if (lim.rlim_cur >= want) return;
  const bool hard = lim.rlim_max != RLIM_INFINITY && lim.rlim_max < want;
  TH_LOG(WARN) << "data plane: ucx: this process may open " << lim.rlim_cur
               << " descriptors (ulimit -n), and serving "
               << max_serving_connections
               << " UCX readers (max_serving_connections) takes about " << want
               << "; readers past the limit are sent to tcp. Raise it ('ulimit "
                  "-n "
               << want << "'"
               << (hard ? ", above the hard limit of " +
                              std::to_string(lim.rlim_max) + ": as root"
                        : std::string())
               << ", or LimitNOFILE= in a systemd unit), or lower "
                  "max_serving_connections";
}

// TCP, which every worker serves and reads (the fallback), and besides it
// each other transport of the list this build and machine can run, in the
// list's order (transport_set.h). With data-plane TLS (`tls`), TCP alone:
// UCX would move the bytes in the clear. UCX refused for its wires
// (ucx_wires.h: only wires no hardware checks, without the opt-in)
// falls back to TCP only where the list names tcp; a list of ucx alone is
// an error then, not a silent TCP worker.
Result<std::unique_ptr<transport::Transport>> PickTransports(
    const ClientOptions& options, std::shared_ptr<const tls::Context> tls) {
  const std::vector<std::string> wanted = WantedTransports(options);
  const bool tcp_listed =
      std::find(wanted.begin(), wanted.end(), "tcp") != wanted.end();
  std::vector<std::unique_ptr<transport::Transport>> others;
  for (const std::string& name : wanted) {
    if (name == "tcp") continue;
    if (name == "ucx" && tls != nullptr) {
      TH_LOG(WARN) << "data plane: ucx skipped: data-plane TLS (data_tls) "
                      "runs over tcp, and UCX would move the bytes in the "
                      "clear";
      continue;
    }
    if (name == "ucx") {
      if (!others.empty()) continue;  // listed twice
      transport::UcxTransportOptions u;
      u.secret = options.secret;
      // UCX's workers listen only where the data plane does
      // (docs/security.md, "What a UCX peer can reach").
      auto hp = transport::SplitHostPort(options.data_listen_address);
      if (hp.ok()) u.listen_host = hp->first;
      // A holder on this host is read over TCP (its cross-memory attach)
      // unless UCX on one host is what is wanted (tests, benchmarks).
      const char* same_host_env = std::getenv("TENSORHUB_UCX_SAME_HOST");
      u.refuse_same_host =
          !options.ucx_same_host &&
          (same_host_env == nullptr || std::string(same_host_env) != "1");
      TH_ASSIGN_OR_RETURN(bool allow_env,
                          transport::ucx::EmulatedGetsAllowedByEnv());
      u.allow_emulated_gets = options.ucx_emulated_gets || allow_env;
      Result<std::unique_ptr<transport::Transport>> t =
          transport::MakeUcxTransport(u);
      if (t.ok()) {
        WarnIfTooFewDescriptorsForUcx(options.max_serving_connections);
        others.push_back(std::move(t).value());
        continue;
      }
      if (t.status().code() == StatusCode::kFailedPrecondition) {
        if (!tcp_listed) {
          return t.status().WithContext(
              "data plane: the transports asked for (ClientOptions::transports "
              "or "
              "TENSORHUB_TRANSPORTS) name ucx and not tcp, and ucx cannot "
              "run here");
        }
        TH_LOG(WARN) << "data plane: serving and reading tcp, not ucx: "
                     << t.status().message();
        continue;
      }
      TH_LOG(WARN) << "data plane: ucx asked for but unavailable ("
                   << t.status().ToString() << "); serving and reading tcp";
      continue;
    }
    return InvalidArgument(
        "data plane: unknown transport '" + name +
        "' in ClientOptions::transports or TENSORHUB_TRANSPORTS (known: tcp, "
        "ucx; a comma-separated list, e.g. ucx,tcp)");
  }
  TH_ASSIGN_OR_RETURN(transport::TcpTransportOptions t,
                      transport::TcpTransportOptions::FromEnv());
  t.secret = options.secret;  // the data plane requires the hub's secret too
  t.tls = std::move(tls);
  std::unique_ptr<transport::Transport> set =
      MakeTransportSet(transport::MakeTcpTransport(t), std::move(others));
  TH_LOG(INFO) << "data plane: " << set->name() << (t.tls ? " with TLS" : "")
               << " (reads use the first of these a holder serves)";
  return set;
}

}  // namespace

Result<ClientDeps> DefaultClientDeps(const ClientOptions& options) {
  TH_ASSIGN_OR_RETURN(ClientTls tls, LoadClientTls(options));
  ClientDeps deps;
  TH_ASSIGN_OR_RETURN(deps.transport, PickTransports(options, tls.data));
  deps.control =
      MakeGrpcControlPlane(options.hub_address, options.secret,
                           options.rpc_timeout_ms, std::move(tls.hub));
  deps.clock = &Clock::Real();
  return deps;
}

}  // namespace tensorhub::client
