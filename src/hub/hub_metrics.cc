#include "hub/hub_metrics.h"

#include <google/protobuf/descriptor.h>

#include <chrono>

#include "metrics/metrics.h"
#include "tensorhub.pb.h"

namespace tensorhub::hub {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

// gRPC's status code names (grpc::StatusCode, 0-16).
const char* CodeName(int code) {
  static constexpr const char* kNames[] = {
      "OK",
      "CANCELLED",
      "UNKNOWN",
      "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED",
      "NOT_FOUND",
      "ALREADY_EXISTS",
      "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED",
      "FAILED_PRECONDITION",
      "ABORTED",
      "OUT_OF_RANGE",
      "UNIMPLEMENTED",
      "INTERNAL",
      "UNAVAILABLE",
      "DATA_LOSS",
      "UNAUTHENTICATED",
  };
  if (code < 0 || code >= static_cast<int>(std::size(kNames))) return "OTHER";
  return kNames[code];
}

class RpcInterceptor final : public grpc::experimental::Interceptor {
 public:
  RpcInterceptor(HubMetrics* metrics, HubMetrics::Method* method)
      : metrics_(metrics),
        method_(method),
        start_(std::chrono::steady_clock::now()) {}

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const double seconds = std::chrono::duration<double>(
                                 std::chrono::steady_clock::now() - start_)
                                 .count();
      metrics_->Observe(*method_, methods->GetSendStatus().error_code(),
                        seconds);
    }
    methods->Proceed();
  }

 private:
  HubMetrics* const metrics_;
  HubMetrics::Method* const method_;
  const std::chrono::steady_clock::time_point start_;
};

class RpcInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  RpcInterceptorFactory(HubMetrics* metrics,
                        std::map<std::string, HubMetrics::Method>* methods,
                        HubMetrics::Method* other)
      : metrics_(metrics), methods_(methods), other_(other) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    auto it = methods_->find(info->method());
    return new RpcInterceptor(metrics_,
                              it == methods_->end() ? other_ : &it->second);
  }

 private:
  HubMetrics* const metrics_;
  std::map<std::string, HubMetrics::Method>* const methods_;
  HubMetrics::Method* const other_;
};

prometheus::Counter& NewCounter(prometheus::Registry& r,
                                const std::string& name,
                                const std::string& help) {
  return BuildCounter().Name(name).Help(help).Register(r).Add({});
}

}  // namespace

HubMetrics::HubMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      rpcs_(BuildCounter()
                .Name("tensorhub_hub_rpcs_total")
                .Help("Calls the hub answered, by method and status code")
                .Register(*registry_)),
      rpc_seconds_(BuildHistogram()
                       .Name("tensorhub_hub_rpc_seconds")
                       .Help("Time the hub took to answer a call, by method "
                             "(a held Unpublish or Leave, and a keeper's long "
                             "poll, include their wait)")
                       .Register(*registry_)),
      leases_expired_(NewCounter(
          *registry_, "tensorhub_hub_leases_expired_total",
          "Workers dropped because their heartbeats stopped for a lease")),
      keeper_copies_(NewCounter(
          *registry_, "tensorhub_hub_keeper_copy_requests_total",
          "Retained versions handed to keepers to copy (no reliable copy "
          "left, or its last reliable holder is leaving)")),
      keeper_releases_(
          NewCounter(*registry_, "tensorhub_hub_keeper_release_requests_total",
                     "Copies keepers were told to drop (no longer retained)")),
      departures_waiting_(
          BuildGauge()
              .Name("tensorhub_hub_departures_waiting")
              .Help("Unpublish and leave calls held until a keeper has "
                    "copied a retained version they hold the last reliable "
                    "copy of")
              .Register(*registry_)
              .Add({})),
      rebuild_answers_(NewCounter(
          *registry_, "tensorhub_hub_rebuild_answers_total",
          "Calls answered UNAVAILABLE \"rebuilding\" (an unknown or unheld "
          "version within the rebuild window after a start)")) {
  // Every method of the service, found in its descriptor: a method added to
  // the .proto is counted without a change here.
  const google::protobuf::ServiceDescriptor* service =
      v1::RegisterWorkerRequest::descriptor()->file()->FindServiceByName("Hub");
  for (int i = 0; service != nullptr && i < service->method_count(); ++i) {
    const google::protobuf::MethodDescriptor* m = service->method(i);
    const std::string path = "/" + service->full_name() + "/" + m->name();
    Method& method = methods_[path];
    method.name = m->name();
    method.seconds =
        &rpc_seconds_.Add({{"method", method.name}}, metrics::SecondsBuckets());
    method.ok = &rpcs_.Add({{"method", method.name}, {"code", "OK"}});
  }
  other_.name = "other";
  other_.seconds =
      &rpc_seconds_.Add({{"method", "other"}}, metrics::SecondsBuckets());
  other_.ok = &rpcs_.Add({{"method", "other"}, {"code", "OK"}});
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
HubMetrics::NewInterceptorFactory() {
  return std::make_unique<RpcInterceptorFactory>(this, &methods_, &other_);
}

void HubMetrics::Observe(Method& method, int code, double seconds) {
  method.seconds->Observe(seconds);
  if (code == 0) {
    method.ok->Increment();
    return;
  }
  // Errors are rarer: their series are made when first seen (Family::Add
  // returns the existing one after that).
  rpcs_.Add({{"method", method.name}, {"code", CodeName(code)}}).Increment();
}

std::vector<prometheus::MetricFamily> HubMetrics::StateFamilies(
    const HubStats& st, bool rebuilding, double rebuild_window_seconds) {
  using metrics::AddSample;
  std::vector<prometheus::MetricFamily> out;
  auto gauge = [&out](const char* name, const char* help, double value) {
    out.push_back(metrics::GaugeFamily(name, help));
    AddSample(out.back(), {}, value);
  };
  gauge("tensorhub_hub_workers", "Workers holding a lease",
        static_cast<double>(st.workers));
  gauge("tensorhub_hub_heartbeat_interval_seconds",
        "The heartbeat interval the hub tells its workers now (planned from "
        "the fleet's size and --heartbeat-budget)",
        static_cast<double>(st.heartbeat_interval_ms) / 1e3);
  gauge("tensorhub_hub_lease_seconds",
        "The lease a renewal grants now: a dead worker is forgotten within "
        "it (at most --max-lease-ms)",
        static_cast<double>(st.lease_ms) / 1e3);
  gauge("tensorhub_hub_models", "Models the hub knows",
        static_cast<double>(st.models));
  out.push_back(metrics::GaugeFamily(
      "tensorhub_hub_versions",
      "Versions the hub knows, by state (pending: not every rank published; "
      "unavailable: committed, no live complete holder)"));
  const std::pair<VersionState, const char*> states[] = {
      {VersionState::kPending, "pending"},
      {VersionState::kCommitted, "committed"},
      {VersionState::kAborted, "aborted"},
      {VersionState::kUnavailable, "unavailable"}};
  for (const auto& [state, label] : states) {
    AddSample(out.back(), {{"state", label}},
              static_cast<double>(st.versions.at(static_cast<size_t>(state))));
  }
  out.push_back(metrics::GaugeFamily(
      "tensorhub_hub_holders",
      "References to versions, by state (filling: a reader still receiving "
      "the version, serving the chunks it has)"));
  AddSample(out.back(), {{"state", "complete"}},
            static_cast<double>(st.holders_complete));
  AddSample(out.back(), {{"state", "filling"}},
            static_cast<double>(st.holders_filling));
  gauge("tensorhub_hub_retained_versions",
        "Versions pinned by Retain or by the --keep-latest policy",
        static_cast<double>(st.retained_versions));
  gauge("tensorhub_hub_reader_group_pins",
        "Versions pinned for reader groups (one per group and step)",
        static_cast<double>(st.reader_group_pins));
  gauge("tensorhub_hub_readers_scheduled",
        "Readers holding sources the hub assigned them (fetches in flight)",
        static_cast<double>(st.readers_scheduled));
  gauge("tensorhub_hub_rebuilding",
        "1 within the rebuild window after the hub started, else 0",
        rebuilding ? 1 : 0);
  gauge("tensorhub_hub_rebuild_window_seconds",
        "Length of the rebuild window after a start (--rebuild-ms)",
        rebuild_window_seconds);
  return out;
}

std::vector<prometheus::MetricFamily> HubMetrics::LimitFamilies(
    const LimitStats& st) {
  using metrics::AddSample;
  std::vector<prometheus::MetricFamily> out;
  auto gauge = [&out](const char* name, const char* help, double value) {
    out.push_back(metrics::GaugeFamily(name, help));
    AddSample(out.back(), {}, value);
  };
  gauge("tensorhub_hub_connections",
        "Connections open to the hub's port (at the connection guard's last "
        "pass, once a second)",
        static_cast<double>(st.connections));
  gauge("tensorhub_hub_connection_peers",
        "Distinct addresses among the open connections",
        static_cast<double>(st.connection_peers));
  gauge("tensorhub_hub_max_connections",
        "The bound on open connections (--max-connections, kept below the "
        "descriptor limit)",
        static_cast<double>(st.max_connections));
  gauge("tensorhub_hub_max_connections_per_peer",
        "The bound on open connections from one address "
        "(--max-connections-per-peer)",
        static_cast<double>(st.max_connections_per_peer));
  gauge("tensorhub_hub_open_descriptors",
        "File descriptors the hub's process holds",
        static_cast<double>(st.descriptors));
  gauge("tensorhub_hub_descriptor_limit",
        "The process's descriptor limit (RLIMIT_NOFILE)",
        static_cast<double>(st.descriptor_limit));
  out.push_back(metrics::CounterFamily(
      "tensorhub_hub_connections_closed_total",
      "Connections the hub closed for exceeding a bound (the newest first)"));
  AddSample(out.back(), {{"reason", "per_peer"}},
            static_cast<double>(st.closed_over_peer));
  AddSample(out.back(), {{"reason", "total"}},
            static_cast<double>(st.closed_over_total));
  out.push_back(metrics::CounterFamily(
      "tensorhub_hub_calls_refused_total",
      "Calls refused before their request was read: no valid proof of the "
      "shared secret in their metadata, by why"));
  AddSample(out.back(), {{"reason", "missing"}},
            static_cast<double>(st.refused_missing));
  AddSample(out.back(), {{"reason", "malformed"}},
            static_cast<double>(st.refused_malformed));
  AddSample(out.back(), {{"reason", "stale"}},
            static_cast<double>(st.refused_stale));
  AddSample(out.back(), {{"reason", "wrong_secret"}},
            static_cast<double>(st.refused_wrong_secret));
  out.push_back(metrics::CounterFamily(
      "tensorhub_hub_request_secret_calls_total",
      "Calls without a proof let through to the secret inside their request "
      "(clients of earlier releases; --accept-request-secret)"));
  AddSample(out.back(), {}, static_cast<double>(st.request_secret_calls));
  return out;
}

}  // namespace tensorhub::hub
