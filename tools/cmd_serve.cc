// `tensorhub serve`: the hub. Also a command of tensorhub-lab, whose drivers
// run the hub as a child process of their own binary.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli_util.h"
#include "common/log.h"
#include "hub/hub_service.h"

namespace tensorhub::cli {
namespace {

struct ServeFlags {
  std::string listen = "127.0.0.1:7070";
  uint64_t lease_ms = 5000;
  uint32_t heartbeat_budget = HubOptions{}.heartbeat_budget_per_s;
  uint64_t max_lease_ms = static_cast<uint64_t>(HubOptions{}.max_lease_ms);
  bool oversubscribed_racks = false;
  double rack_oversubscription = 1.0;
  std::vector<std::string> rack_oversubscription_at;
  uint64_t recheck_ms = static_cast<uint64_t>(HubOptions{}.recheck_ms);
  uint32_t keep_latest = 0;
  std::optional<int64_t> rebuild_ms;
  std::string secret_file;
  std::string metrics_listen;
  std::string etcd;
  std::string advertise;
  uint64_t etcd_lease_ms = 3000;
  std::string etcd_prefix = "/tensorhub/";
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  bool insecure = false;
  bool accept_request_secret = false;
  uint32_t max_connections = HubOptions{}.max_connections;
  uint32_t max_connections_per_peer = HubOptions{}.max_connections_per_peer;
  uint64_t idle_connection_ms =
      static_cast<uint64_t>(HubOptions{}.idle_connection_ms);
  uint64_t handshake_timeout_ms =
      static_cast<uint64_t>(HubOptions{}.handshake_timeout_ms);
};

int RunServe(const ServeFlags& f) {
  hub::HubServerOptions o;
  o.listen_address = f.listen;
  o.lease_ms = static_cast<int64_t>(f.lease_ms);
  o.heartbeat_budget_per_s = f.heartbeat_budget;
  o.max_lease_ms = static_cast<int64_t>(f.max_lease_ms);
  o.racks_oversubscribed = f.oversubscribed_racks;
  o.rack_oversubscription = f.rack_oversubscription;
  for (const std::string& item : f.rack_oversubscription_at) {
    // DC/RACK=RATIO
    const size_t eq = item.rfind('=');
    char* end = nullptr;
    const double ratio =
        eq == std::string::npos ? -1 : std::strtod(item.c_str() + eq + 1, &end);
    if (eq == std::string::npos || item.find('/') > eq || end == nullptr ||
        *end != '\0' || !(ratio >= 0)) {
      return Fail(InvalidArgument(
          "--rack-oversubscription-at wants DATACENTER/RACK=RATIO (the "
          "workers' labels, e.g. dc0/r3=8), got '" +
          item + "'"));
    }
    o.rack_oversubscription_by_rack[item.substr(0, eq)] = ratio;
  }
  o.recheck_ms = static_cast<int64_t>(f.recheck_ms);
  o.max_recheck_ms = std::max(o.max_recheck_ms, o.recheck_ms);
  if (f.rebuild_ms.has_value()) o.rebuild_ms = *f.rebuild_ms;
  o.keep_latest = f.keep_latest;
  o.metrics_listen = f.metrics_listen;
  // A highly available hub set: the hubs elect a leader in etcd.
  o.etcd_endpoints = f.etcd;
  o.advertise_address = f.advertise;
  o.etcd_lease_ms = static_cast<int64_t>(f.etcd_lease_ms);
  o.etcd_prefix = f.etcd_prefix;
  auto secret = ReadSecret(f.secret_file);
  if (!secret.ok()) return Fail(secret.status());
  o.secret = *secret;
  o.tls_cert_file = f.tls_cert;
  o.tls_key_file = f.tls_key;
  o.tls_client_ca_file = f.tls_client_ca;
  o.insecure = f.insecure;
  o.accept_request_secret = f.accept_request_secret;
  o.max_connections = f.max_connections;
  o.max_connections_per_peer = f.max_connections_per_peer;
  o.idle_connection_ms = static_cast<int64_t>(f.idle_connection_ms);
  o.handshake_timeout_ms = static_cast<int64_t>(f.handshake_timeout_ms);
  BlockStopSignals();
  SetLogPrefix("hub");
  auto server = hub::HubServer::Start(o);
  if (!server.ok()) return Fail(server.status());
  int sig = WaitForStopSignal();
  TH_LOG(INFO) << "signal " << sig << ": shutting down";
  (*server)->Shutdown();
  return 0;
}

}  // namespace

void AddServeCommand(CommandLine& cl) {
  auto f = std::make_shared<ServeFlags>();
  CLI::App* c = cl.Add("serve", "run the hub until interrupted (SIGINT/TERM)",
                       [f] { return RunServe(*f); });
  c->add_option("--listen", f->listen,
                "the hub's gRPC address; 0.0.0.0:PORT for workers on other "
                "hosts")
      ->type_name("HOST:PORT")
      ->capture_default_str();
  c->add_option("--lease-ms", f->lease_ms,
                "a worker that sends no heartbeat for this long is gone, "
                "with its references")
      ->check(CLI::Range(uint64_t{100}, uint64_t{3600000}))
      ->capture_default_str();
  c->add_option("--heartbeat-budget", f->heartbeat_budget,
                "heartbeats per second the hub plans for: a fleet that would "
                "send more is told a longer interval and lease (up to "
                "--max-lease-ms); 0: every worker gets --lease-ms")
      ->check(CLI::Range(0u, 1000000u))
      ->type_name("N")
      ->capture_default_str();
  c->add_option("--max-lease-ms", f->max_lease_ms,
                "the longest lease the heartbeat budget may grant: a dead "
                "worker is forgotten within this (plus a tenth)")
      ->check(CLI::Range(uint64_t{100}, uint64_t{3600000}))
      ->capture_default_str();
  c->add_option("--rack-oversubscription", f->rack_oversubscription,
                "how oversubscribed the rack uplinks are: the NIC capacity "
                "of a rack's hosts over its uplink's (4 for 4:1); above 1, "
                "each version enters a rack about once and its readers there "
                "feed each other (at most 1: full bisection)")
      ->check(CLI::Range(0.0, 1e6))
      ->type_name("RATIO")
      ->capture_default_str();
  c->add_option("--rack-oversubscription-at", f->rack_oversubscription_at,
                "one rack's own ratio, by the workers' labels "
                "(repeatable): DATACENTER/RACK=RATIO")
      ->type_name("DC/RACK=RATIO");
  c->add_option("--recheck-ms", f->recheck_ms,
                "a reader behind another rack's oversubscribed uplink asks "
                "again after this (doubling while nothing changed), so a "
                "reader arriving there may take its source's place")
      ->check(CLI::Range(uint64_t{1}, uint64_t{60000}))
      ->capture_default_str();
  c->add_flag("--oversubscribed-racks", f->oversubscribed_racks,
              "older form of --rack-oversubscription 4");
  c->add_option("--keep-latest", f->keep_latest,
                "retain the latest K committed versions of each model")
      ->check(CLI::Range(0u, 1024u))
      ->type_name("K")
      ->capture_default_str();
  c->add_option("--rebuild-ms", f->rebuild_ms,
                "after a start, answer versions it does not know UNAVAILABLE "
                "(try again) for this long while workers report what they "
                "hold (default: the lease it grants)")
      ->check(CLI::Range(int64_t{0}, int64_t{3600000}));
  c->add_option("--secret-file", f->secret_file,
                "file with the shared secret workers must present (without "
                "it: $TENSORHUB_SECRET, if set)")
      ->envname("TENSORHUB_SECRET_FILE")
      ->type_name("PATH");
  c->add_option("--metrics-listen", f->metrics_listen,
                "serve Prometheus metrics at http://HOST:PORT/metrics "
                "(docs/metrics.md)")
      ->type_name("HOST:PORT");
  c->add_option("--tls-cert", f->tls_cert,
                "the hub's certificate (PEM): serve gRPC over TLS only "
                "(docs/security.md)")
      ->type_name("PATH");
  c->add_option("--tls-key", f->tls_key,
                "the private key of --tls-cert (PEM, unencrypted)")
      ->type_name("PATH");
  c->add_option("--tls-client-ca", f->tls_client_ca,
                "require every client to present a certificate signed by "
                "this CA (mutual TLS)")
      ->type_name("PATH");
  c->add_flag("--insecure", f->insecure,
              "accept a non-loopback --listen with neither a secret nor TLS "
              "(a private test network); without it such a hub refuses to "
              "start and says why")
      ->envname("TENSORHUB_INSECURE");
  c->add_flag("--accept-request-secret", f->accept_request_secret,
              "also accept calls of clients of earlier releases, which send "
              "the secret inside the request instead of a proof in the "
              "call's metadata (deprecated: for a rolling upgrade, hubs "
              "first; such a call's request is read before the check)");
  c->add_option("--max-connections", f->max_connections,
                "connections kept open at most (the newest beyond are "
                "closed; kept below the descriptor limit)")
      ->check(CLI::Range(1u, 1u << 20))
      ->type_name("N")
      ->capture_default_str();
  c->add_option("--max-connections-per-peer", f->max_connections_per_peer,
                "connections kept open at most from one address")
      ->check(CLI::Range(1u, 1u << 20))
      ->type_name("N")
      ->capture_default_str();
  c->add_option("--idle-connection-ms", f->idle_connection_ms,
                "close a connection with no call in flight for this long "
                "(clients reconnect at their next call)")
      ->check(CLI::Range(uint64_t{100}, uint64_t{86400000}))
      ->capture_default_str();
  c->add_option("--handshake-timeout-ms", f->handshake_timeout_ms,
                "close a connection that has not finished its TLS handshake "
                "and HTTP/2 preface this long after it was accepted")
      ->check(CLI::Range(uint64_t{100}, uint64_t{600000}))
      ->capture_default_str();
  c->add_option("--etcd", f->etcd,
                "join the HA hub set kept in this etcd: serve while elected "
                "leader, else answer naming the leader (README, HA hub)")
      ->type_name("HOST:PORT[,...]");
  c->add_option("--advertise", f->advertise,
                "where clients reach this hub (the leader key's value; "
                "default: the listen address, required for 0.0.0.0)")
      ->type_name("HOST:PORT");
  c->add_option("--etcd-lease-ms", f->etcd_lease_ms,
                "the leader's etcd lease: a dead leader is replaced within "
                "about this long")
      ->check(CLI::Range(uint64_t{1000}, uint64_t{600000}))
      ->capture_default_str();
  c->add_option("--etcd-prefix", f->etcd_prefix,
                "every etcd key of this hub set starts with it")
      ->capture_default_str();
}

}  // namespace tensorhub::cli
