#include "client/client_metrics.h"

#include <algorithm>
#include <utility>

#include "client/fetch/fetcher.h"
#include "client/registry.h"
#include "metrics/metrics.h"
#include "transport/transport.h"

namespace tensorhub::client {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildHistogram;
using prometheus::Counter;
using prometheus::Histogram;
using prometheus::Registry;

Counter& NewCounter(Registry& r, const std::string& name,
                    const std::string& help,
                    const prometheus::Labels& labels = {}) {
  return BuildCounter().Name(name).Help(help).Register(r).Add(labels);
}

Histogram& NewHistogram(Registry& r, const std::string& name,
                        const std::string& help,
                        const prometheus::Labels& labels = {}) {
  return BuildHistogram().Name(name).Help(help).Register(r).Add(
      labels, metrics::SecondsBuckets());
}

constexpr char kStageName[] = "tensorhub_fetch_stage_seconds";
constexpr char kStageHelp[] =
    "Wall time of each stage of successful fetches: resolve (hub round "
    "trips), schedule (destination, filling registration, sources), "
    "first_byte (until the first chunk is verified), transfer, verify "
    "(checksum share of the data-plane time), register (reporting the copy)";

}  // namespace

const char* DataPathLabel(DataPath path) {
  switch (path) {
    case DataPath::kTcp:
      return "tcp";
    case DataPath::kSameHost:
      return "same_host";
    case DataPath::kUcx:
      return "ucx";
  }
  return "tcp";
}

ClientMetrics::ClientMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      fetches_ok_(NewCounter(*registry_, "tensorhub_fetches_total",
                             "Fetch calls, by outcome", {{"outcome", "ok"}})),
      fetches_failed_(NewCounter(*registry_, "tensorhub_fetches_total",
                                 "Fetch calls, by outcome",
                                 {{"outcome", "error"}})),
      fetch_seconds_(NewHistogram(
          *registry_, "tensorhub_fetch_seconds",
          "Wall time of successful Fetch calls, from the call to its return")),
      stage_resolve_(NewHistogram(*registry_, kStageName, kStageHelp,
                                  {{"stage", "resolve"}})),
      stage_schedule_(NewHistogram(*registry_, kStageName, kStageHelp,
                                   {{"stage", "schedule"}})),
      stage_first_byte_(NewHistogram(*registry_, kStageName, kStageHelp,
                                     {{"stage", "first_byte"}})),
      stage_transfer_(NewHistogram(*registry_, kStageName, kStageHelp,
                                   {{"stage", "transfer"}})),
      stage_verify_(NewHistogram(*registry_, kStageName, kStageHelp,
                                 {{"stage", "verify"}})),
      stage_register_(NewHistogram(*registry_, kStageName, kStageHelp,
                                   {{"stage", "register"}})),
      bytes_tcp_(NewCounter(*registry_, "tensorhub_fetched_bytes_total",
                            "Bytes of verified chunks fetched, by path",
                            {{"path", DataPathLabel(DataPath::kTcp)}})),
      bytes_same_host_(
          NewCounter(*registry_, "tensorhub_fetched_bytes_total",
                     "Bytes of verified chunks fetched, by path",
                     {{"path", DataPathLabel(DataPath::kSameHost)}})),
      bytes_ucx_(NewCounter(*registry_, "tensorhub_fetched_bytes_total",
                            "Bytes of verified chunks fetched, by path",
                            {{"path", DataPathLabel(DataPath::kUcx)}})),
      chunks_(NewCounter(
          *registry_, "tensorhub_fetched_chunks_total",
          "Verified reads fetched: chunks of whole fetches, slice reads of "
          "partial fetches")),
      retries_(NewCounter(
          *registry_, "tensorhub_fetch_chunk_retries_total",
          "Chunk reads that failed (error, refusal, bad checksum, stall) or "
          "were taken from a slow holder, and were read again elsewhere")),
      steals_(NewCounter(*registry_, "tensorhub_fetch_chunk_steals_total",
                         "Chunk reads taken away from a holder that had "
                         "become far slower than the others")),
      steal_wait_(NewHistogram(
          *registry_, "tensorhub_fetch_steal_wait_seconds",
          "How long a stolen chunk read had run when it was taken away")),
      hub_retries_(NewCounter(
          *registry_, "tensorhub_fetch_hub_retries_total",
          "Resolve calls asked again because the hub was unreachable, "
          "rebuilding its state, or had just said no holder is left")),
      hub_retry_wait_(NewCounter(*registry_,
                                 "tensorhub_fetch_hub_retry_wait_seconds_total",
                                 "Time fetches paused between those retries")),
      manifests_from_source_(NewCounter(
          *registry_, "tensorhub_fetch_manifests_total",
          "Fetches' manifests, by where they came from: a source (checked "
          "against the SHA-256 the hub named) or the hub",
          {{"from", "source"}})),
      manifests_from_hub_(NewCounter(
          *registry_, "tensorhub_fetch_manifests_total",
          "Fetches' manifests, by where they came from: a source (checked "
          "against the SHA-256 the hub named) or the hub",
          {{"from", "hub"}})),
      manifest_bytes_(NewCounter(
          *registry_, "tensorhub_fetch_manifest_bytes_total",
          "Bytes of manifests read from sources (which count them in their "
          "tensorhub_served_bytes_total; not in "
          "tensorhub_fetched_bytes_total)")),
      drain_seconds_(NewHistogram(
          *registry_, "tensorhub_unpublish_drain_seconds",
          "Time an unpublish (or a released or abandoned fetch destination) "
          "waited for the reads in flight from it")),
      drain_timeouts_(NewCounter(
          *registry_, "tensorhub_unpublish_drain_timeouts_total",
          "Drains that ended at their deadline with reads still in flight")) {}

void ClientMetrics::ChunkFetched(uint64_t bytes, DataPath path) {
  chunks_.Increment();
  prometheus::Counter& c = path == DataPath::kSameHost ? bytes_same_host_
                           : path == DataPath::kUcx    ? bytes_ucx_
                                                       : bytes_tcp_;
  c.Increment(static_cast<double>(bytes));
}

void ClientMetrics::FetchPlanEnded(const FetchReport& report) {
  retries_.Increment(report.chunk_retries);
  steals_.Increment(report.chunks_stolen);
  for (int64_t ms : report.steal_waits_ms) {
    steal_wait_.Observe(static_cast<double>(ms) / 1000.0);
  }
}

void ClientMetrics::FetchSucceeded(const FetchStats& st) {
  fetches_ok_.Increment();
  fetch_seconds_.Observe(st.total_seconds);
  stage_resolve_.Observe(st.resolve_seconds);
  stage_schedule_.Observe(st.schedule_seconds);
  stage_first_byte_.Observe(st.first_byte_seconds);
  stage_transfer_.Observe(st.transfer_seconds);
  stage_verify_.Observe(st.verify_seconds);
  stage_register_.Observe(st.register_seconds);
}

void ClientMetrics::FetchFailed() { fetches_failed_.Increment(); }

void ClientMetrics::HubRetry(double pause_seconds) {
  hub_retries_.Increment();
  hub_retry_wait_.Increment(pause_seconds);
}

void ClientMetrics::ManifestTaken(bool from_source, uint64_t bytes) {
  (from_source ? manifests_from_source_ : manifests_from_hub_).Increment();
  manifest_bytes_.Increment(static_cast<double>(bytes));
}

void ClientMetrics::Drained(double seconds, bool ok) {
  drain_seconds_.Observe(seconds);
  if (!ok) drain_timeouts_.Increment();
}

std::vector<prometheus::MetricFamily> ServingFamilies(
    const transport::Server& server, const client::Registry& registry) {
  using metrics::AddSample;
  std::vector<prometheus::MetricFamily> out;
  const uint64_t served = server.bytes_served();
  const uint64_t local = server.bytes_served_local();
  uint64_t tcp = served - std::min(served, local);
  auto bytes = metrics::CounterFamily(
      "tensorhub_served_bytes_total",
      "Bytes this worker served to readers, by path (same_host: copied by "
      "a reader on this host from this process's memory)");
  for (const auto& [name, sent] : server.bytes_sent_by_others()) {
    tcp -= std::min(tcp, sent);
    AddSample(bytes, {{"path", name}}, static_cast<double>(sent));
  }
  AddSample(bytes, {{"path", DataPathLabel(DataPath::kTcp)}},
            static_cast<double>(tcp));
  AddSample(bytes, {{"path", DataPathLabel(DataPath::kSameHost)}},
            static_cast<double>(local));
  out.push_back(std::move(bytes));
  auto refused_reads = metrics::CounterFamily(
      "tensorhub_serve_refusals_total",
      "Reads and data connections this worker refused, by reason "
      "(read: unknown, revoked or unready data; auth: the peer did not "
      "prove the shared secret)");
  AddSample(refused_reads, {{"reason", "read"}},
            static_cast<double>(registry.reads_refused()));
  AddSample(refused_reads, {{"reason", "auth"}},
            static_cast<double>(server.connections_refused()));
  out.push_back(std::move(refused_reads));
  auto in_flight =
      metrics::GaugeFamily("tensorhub_serve_reads_in_flight",
                           "Reads of this worker's memory in flight now");
  AddSample(in_flight, {}, static_cast<double>(registry.reads_in_flight()));
  out.push_back(std::move(in_flight));
  const client::Registry::HeldCounts held = registry.held();
  auto versions = metrics::GaugeFamily(
      "tensorhub_held_versions",
      "Versions this worker holds and serves, by state (filling: a fetch "
      "still receiving it)");
  AddSample(versions, {{"state", "complete"}},
            static_cast<double>(held.complete));
  AddSample(versions, {{"state", "filling"}},
            static_cast<double>(held.filling));
  out.push_back(std::move(versions));
  return out;
}

}  // namespace tensorhub::client
