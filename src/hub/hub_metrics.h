// The hub's Prometheus metrics (docs/metrics.md). The RPC layer keeps them:
// every call's method, status code and latency (a gRPC server interceptor,
// so no handler is touched), and the events the adapter sees (leases
// expired, work handed to keepers, departures held, answers made while
// rebuilding). Figures about the table (models, versions by state,
// holders) are not kept here: they are computed when scraped from
// HubState::Stats(), read under the adapter's lock, so the state machine
// stays free of metrics and I/O.
//
// Threads: every method may be called from any thread.
#ifndef TENSORHUB_HUB_HUB_METRICS_H_
#define TENSORHUB_HUB_HUB_METRICS_H_

#include <grpcpp/support/server_interceptor.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hub/hub_state.h"

namespace tensorhub::hub {

class HubMetrics {
 public:
  HubMetrics();
  HubMetrics(const HubMetrics&) = delete;
  HubMetrics& operator=(const HubMetrics&) = delete;

  const std::shared_ptr<prometheus::Registry>& registry() const {
    return registry_;
  }

  // An interceptor factory for the hub's gRPC server that observes every
  // call: tensorhub_hub_rpcs_total{method,code} and
  // tensorhub_hub_rpc_seconds{method}. `this` must outlive the server.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
  NewInterceptorFactory();

  void LeasesExpired(size_t workers) {
    leases_expired_.Increment(static_cast<double>(workers));
  }
  // A keeper's poll was answered with this work.
  void KeeperWork(size_t copies, size_t releases) {
    keeper_copies_.Increment(static_cast<double>(copies));
    keeper_releases_.Increment(static_cast<double>(releases));
  }
  // An unpublish or leave starts (+1) or stops (-1) waiting for a keeper.
  void DepartureWaiting(int delta) { departures_waiting_.Increment(delta); }
  // An answer turned into UNAVAILABLE "rebuilding" (rebuild window).
  void RebuildAnswer() { rebuild_answers_.Increment(); }

  // What the hub's bounds on callers saw (call_gate.h,
  // connection_guard.h), read when scraped.
  struct LimitStats {
    size_t connections = 0;       // open at the guard's last pass
    size_t connection_peers = 0;  // distinct addresses among them
    size_t descriptors = 0;       // the process's, at that pass
    size_t descriptor_limit = 0;  // RLIMIT_NOFILE
    size_t max_connections = 0;
    size_t max_connections_per_peer = 0;
    uint64_t closed_over_peer = 0;
    uint64_t closed_over_total = 0;
    // Calls refused before their body was read, by why (no proof, a
    // malformed one, one too far from the hub's clock, the wrong secret),
    // and calls of older clients let through to the request's secret.
    uint64_t refused_missing = 0;
    uint64_t refused_malformed = 0;
    uint64_t refused_stale = 0;
    uint64_t refused_wrong_secret = 0;
    uint64_t request_secret_calls = 0;
  };
  static std::vector<prometheus::MetricFamily> LimitFamilies(
      const LimitStats& stats);

  // The families computed at scrape time from the table's counts and the
  // rebuild window.
  static std::vector<prometheus::MetricFamily> StateFamilies(
      const HubStats& stats, bool rebuilding, double rebuild_window_seconds);

  // Per method: its latency histogram and its counter per status code.
  struct Method {
    prometheus::Histogram* seconds = nullptr;
    prometheus::Counter* ok = nullptr;
    std::string name;
  };
  void Observe(Method& method, int code, double seconds);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& rpcs_;
  prometheus::Family<prometheus::Histogram>& rpc_seconds_;
  prometheus::Counter& leases_expired_;
  prometheus::Counter& keeper_copies_;
  prometheus::Counter& keeper_releases_;
  prometheus::Gauge& departures_waiting_;
  prometheus::Counter& rebuild_answers_;
  // By gRPC path ("/tensorhub.v1.Hub/Resolve"); `other_` for anything else.
  // Filled in the constructor, read-only afterwards.
  std::map<std::string, Method> methods_;
  Method other_;
};

}  // namespace tensorhub::hub

#endif  // TENSORHUB_HUB_HUB_METRICS_H_
