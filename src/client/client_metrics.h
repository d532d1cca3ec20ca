// A worker's Prometheus metrics (docs/metrics.md): what its fetches did,
// stage by stage, and what it served. Counters and histograms are kept
// here as things happen; figures the worker already keeps (bytes served,
// reads in flight, versions held) are read when scraped (client.cc).
//
// Threads: every method may be called from any thread (prometheus-cpp's
// counters are atomic, its histograms locked).
#ifndef TENSORHUB_CLIENT_CLIENT_METRICS_H_
#define TENSORHUB_CLIENT_CLIENT_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "tensorhub/client.h"

namespace tensorhub::transport {
class Server;  // transport/transport.h
}  // namespace tensorhub::transport

namespace tensorhub::client {

struct FetchReport;
class Registry;  // client/registry.h

// The path bytes took, the `path` label of the byte counters: "tcp" (sent
// over the data connection), "same_host" (copied by the reader from the
// holder's memory: cross-memory attach or CUDA IPC), "ucx" (sent by UCX, to
// or from a holder that serves it: src/client/transport_set.h).
enum class DataPath { kTcp, kSameHost, kUcx };
const char* DataPathLabel(DataPath path);

class ClientMetrics {
 public:
  ClientMetrics();
  ClientMetrics(const ClientMetrics&) = delete;
  ClientMetrics& operator=(const ClientMetrics&) = delete;

  // Every family kept here; more may be added to it (the keeper does).
  const std::shared_ptr<prometheus::Registry>& registry() const {
    return registry_;
  }

  // One verified chunk of a fetch.
  void ChunkFetched(uint64_t bytes, DataPath path);
  // A fetch's data plane ended (either way): its retries and steals.
  void FetchPlanEnded(const FetchReport& report);
  // A Fetch call returned: its stages (on success) and outcome.
  void FetchSucceeded(const FetchStats& stats);
  void FetchFailed();
  // Resolve asked the hub again (unreachable, or rebuilding) after a pause.
  void HubRetry(double pause_seconds);
  // Where a fetch took its version's manifest: from a source (checked
  // against the SHA-256 the hub named; `bytes` of it, which the source
  // counts as served) or from the hub.
  void ManifestTaken(bool from_source, uint64_t bytes = 0);
  // Unpublish (or a fetch releasing its destination, or an abandoned fill)
  // waited this long for reads in flight; `ok` false: past its deadline.
  void Drained(double seconds, bool ok);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Counter& fetches_ok_;
  prometheus::Counter& fetches_failed_;
  prometheus::Histogram& fetch_seconds_;
  prometheus::Histogram& stage_resolve_;
  prometheus::Histogram& stage_schedule_;
  prometheus::Histogram& stage_first_byte_;
  prometheus::Histogram& stage_transfer_;
  prometheus::Histogram& stage_verify_;
  prometheus::Histogram& stage_register_;
  prometheus::Counter& bytes_tcp_;
  prometheus::Counter& bytes_same_host_;
  prometheus::Counter& bytes_ucx_;
  prometheus::Counter& chunks_;
  prometheus::Counter& retries_;
  prometheus::Counter& steals_;
  prometheus::Histogram& steal_wait_;
  prometheus::Counter& hub_retries_;
  prometheus::Counter& hub_retry_wait_;
  prometheus::Counter& manifests_from_source_;
  prometheus::Counter& manifests_from_hub_;
  prometheus::Counter& manifest_bytes_;
  prometheus::Histogram& drain_seconds_;
  prometheus::Counter& drain_timeouts_;
};

// The figures a worker keeps anyway, read when scraped (on the scrape
// thread): bytes served by path, refused reads and connections, reads in
// flight, versions held. `server` and `registry` must outlive the scrape.
std::vector<prometheus::MetricFamily> ServingFamilies(
    const transport::Server& server, const Registry& registry);

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_CLIENT_METRICS_H_
