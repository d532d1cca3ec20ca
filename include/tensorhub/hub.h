// An embedded hub: the same hub as `tensorhub serve`, running inside the
// calling process (for tests, examples, and single-node jobs). The library's
// log level is in tensorhub/log_level.h (included here for callers that
// set it through this header).
#ifndef TENSORHUB_HUB_H_
#define TENSORHUB_HUB_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "tensorhub/log_level.h"
#include "tensorhub/status.h"

namespace tensorhub {

struct HubOptions {
  // HOST:PORT; port 0 picks a free port (see Hub::address()). Without a
  // secret and TLS, keep the default loopback address: on another, Start
  // refuses (FAILED_PRECONDITION, saying what anyone who can reach it could
  // do and how to fix it) unless `insecure` is set.
  std::string listen_address = "127.0.0.1:7070";
  // A worker whose heartbeats stop for this long loses its references (a
  // fleet too large for heartbeat_budget_per_s gets a longer lease, below).
  int64_t lease_ms = 5000;
  // Shared secret every worker must present (empty: none).
  std::string secret;
  // TLS on the control plane (PEM file paths; docs/security.md). With
  // tls_cert_file and tls_key_file the hub accepts only TLS connections;
  // clients then need ClientOptions::tls_ca_file. With tls_client_ca_file
  // too, every caller must present a certificate signed by that CA (mutual
  // TLS). Files are read and checked by Start (INVALID_ARGUMENT naming a
  // bad one). All empty: plaintext.
  std::string tls_cert_file{};
  std::string tls_key_file{};
  std::string tls_client_ca_file{};
  // Retain the latest K committed versions of every model (0: only what
  // Retain() pins). See Client::Retain.
  uint32_t keep_latest = 0;
  // Rack uplinks (docs/design.md, "Rack-aware pipelines"): how
  // oversubscribed each rack's uplink is, its hosts' NIC capacity over the
  // uplink's (4 for 4:1; at most 1: full bisection, the default), and
  // per-rack figures, "DATACENTER/RACK" (the workers' labels) -> ratio,
  // that override it. Where a rack is oversubscribed, each version enters
  // it about once and its readers there feed each other.
  double rack_oversubscription = 1.0;
  std::map<std::string, double> rack_oversubscription_by_rack{};
  // Readers behind another rack's oversubscribed uplink ask the hub again
  // after this long (doubling while nothing changed, up to
  // max_recheck_ms), so that a reader arriving in that rack may take their
  // source's place.
  int64_t recheck_ms = 2;
  int64_t max_recheck_ms = 1000;
  // Older form: true is rack_oversubscription 4 (a common fabric) when
  // rack_oversubscription is left at 1.
  bool racks_oversubscribed = false;
  // The hub keeps no state on disk: after a (re)start it learns versions
  // from the workers' re-registrations and reports, within about a lease.
  // For this long after it starts, a version it does not know (or knows
  // with no complete holder) is answered UNAVAILABLE ("rebuilding"), which
  // callers retry within their deadline, instead of NOT_FOUND, which is
  // final. -1: the lease it grants (lease_ms for a small fleet; it grows
  // as a large fleet re-registers). 0: answer from the table at once.
  int64_t rebuild_ms = -1;
  // HOST:PORT to serve Prometheus metrics on (GET /metrics; port 0 picks a
  // free port, see Hub::metrics_address()). Empty: no metrics endpoint.
  // The metrics are listed in docs/metrics.md.
  std::string metrics_listen = "";
  // Heartbeats scale with the fleet (docs/design.md, "Heartbeats"): workers
  // heartbeat every third of the lease, and when a fleet that size would
  // send more than heartbeat_budget_per_s heartbeats a second, the hub
  // tells its workers a longer interval and grants a longer lease (three
  // intervals), up to max_lease_ms: with the defaults, up to 833 workers
  // heartbeat every 1.7 s under a 5 s lease, 2,000 every 4 s under a 12 s
  // lease, 10,000 every 20 s under a 60 s lease (500 heartbeats/s, about
  // 6% of a core of the 2-core test machine, docs/benchmarks.md section 6).
  // A dead worker is forgotten within 1.1 x max(lease_ms, max_lease_ms)
  // (the lease and the expiry scan's period, a tenth of it); readers do not
  // wait for that (they fail over to another source at once).
  // 0: no budget, every worker gets lease_ms.
  uint32_t heartbeat_budget_per_s = 500;
  int64_t max_lease_ms = 60000;

  // ---- A highly available hub set (docs/design.md, "A highly available
  // hub") ----
  // etcd's client endpoints, "HOST:PORT[,HOST:PORT...]": this hub joins
  // the hub set kept there and serves only while it is the elected leader;
  // the others answer every call UNAVAILABLE naming the leader, and clients
  // given the set's addresses follow it. The leader records what must
  // outlive it (retain pins, reader-group pins, each model's highest
  // version number, the secret's identity) in etcd before it answers.
  // Empty (the default): a single hub, no etcd.
  std::string etcd_endpoints = "";
  // Where clients reach this hub, HOST:PORT (the leader key's value).
  // Default: the bound address; required when listening on 0.0.0.0 or [::].
  std::string advertise_address = "";
  // The leader's etcd lease: a leader that dies is replaced within about
  // this long. etcd counts whole seconds (rounded up); at least 1000.
  int64_t etcd_lease_ms = 3000;
  // Every etcd key of this hub set starts with it (sets may share an etcd).
  std::string etcd_prefix = "/tensorhub/";
  // Accept a non-loopback listen address with neither a secret nor TLS (a
  // private test network): Start then only logs the warning.
  bool insecure = false;

  // ---- What callers may take (docs/security.md, "The hub's limits") ----
  // Every call proves the secret in its metadata, checked before its
  // request is read; clients of earlier releases send the secret inside
  // the request instead. Accept that too (deprecated: for a rolling
  // upgrade, hubs first; such a call's request is read before the check).
  bool accept_request_secret = false;
  // Connections kept open at most, in all and from one address (the
  // newest beyond either are closed). The total is kept below the process's
  // descriptor limit, which Start raises to its hard limit.
  uint32_t max_connections = 16384;
  uint32_t max_connections_per_peer = 256;
  // A connection with no call in flight for this long is closed (clients
  // reconnect at their next call); one that has not finished its TLS
  // handshake and HTTP/2 preface this long after it was accepted, too.
  int64_t idle_connection_ms = 120000;
  int64_t handshake_timeout_ms = 10000;
};

class Hub {
 public:
  // Binds and starts serving; returns once the hub accepts calls.
  // UNAVAILABLE if the address (or the metrics address) cannot be bound
  // (or, with etcd, etcd cannot be reached); FAILED_PRECONDITION if the hub
  // set in etcd runs with another secret; INVALID_ARGUMENT for TLS files
  // that are missing, unreadable or do not match. A hub of a set starts as
  // a standby and leads once elected (in the background).
  static Result<std::unique_ptr<Hub>> Start(const HubOptions& options);
  virtual ~Hub() = default;
  // The bound address (the real port when 0 was asked for).
  virtual std::string address() const = 0;
  // Where the metrics are served (HOST:PORT), empty without
  // HubOptions::metrics_listen.
  virtual std::string metrics_address() const { return std::string(); }
  // Blocks until Shutdown() is called from another thread.
  virtual void Wait() = 0;
  // Stops accepting calls and finishes calls in flight (bounded: 2 s).
  // Idempotent; also done by the destructor.
  virtual void Shutdown() = 0;
};

}  // namespace tensorhub

#endif  // TENSORHUB_HUB_H_
