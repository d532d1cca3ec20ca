// Prometheus metrics: the pieces the hub and the worker library share.
//
// Metrics are kept with prometheus-cpp (Debian's prometheus-cpp-dev: its
// core library only, the registry and the text exposition format) and
// served over HTTP with cpp-httplib (Debian's libcpp-httplib-dev), at
// GET /metrics and nothing else. docs/metrics.md lists every metric.
//
// Names follow the Prometheus conventions: a `tensorhub_` prefix, base units
// at the end (`_seconds`, `_bytes`), `_total` on counters. prometheus-cpp
// throws std::invalid_argument on an invalid metric or label name; every
// name here is a constant checked by the tests, so nothing throws at run
// time.
#ifndef TENSORHUB_METRICS_METRICS_H_
#define TENSORHUB_METRICS_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensorhub/status.h"

namespace tensorhub::metrics {

using Sources = std::vector<std::weak_ptr<prometheus::Collectable>>;

// Histogram buckets, in seconds, for durations from 100 us to 10 min: the
// stages of a fetch, hub RPCs (a held Unpublish or a keeper's long poll
// included), drains.
std::vector<double> SecondsBuckets();

// A collectable whose families are computed when it is scraped (gauges read
// from state the caller owns, counters kept elsewhere). `collect` runs on a
// scrape thread; it must be safe to call from there for as long as the
// collector may be scraped.
class FunctionCollector final : public prometheus::Collectable {
 public:
  using Fn = std::function<std::vector<prometheus::MetricFamily>()>;
  explicit FunctionCollector(Fn collect) : collect_(std::move(collect)) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    return collect_();
  }

 private:
  const Fn collect_;
};

// Builders for families computed at scrape time.
using LabelPairs = std::vector<std::pair<std::string, std::string>>;
prometheus::MetricFamily GaugeFamily(std::string name, std::string help);
prometheus::MetricFamily CounterFamily(std::string name, std::string help);
// Adds one sample (gauge or counter, by the family's type).
void AddSample(prometheus::MetricFamily& family, const LabelPairs& labels,
               double value);

// The text exposition format (version 0.0.4) of every live source, in
// order. A source that has been destroyed is skipped.
std::string Render(const Sources& sources);

// The HTTP endpoint: serves Render(sources) at GET /metrics.
//
// Bounds: `threads` requests are served at once; up to `max_queued`
// accepted connections wait for a thread, and beyond that the listening
// thread serves the next connection itself (and accepts nothing meanwhile,
// so the kernel's backlog, then refused connections, absorb a flood). Each
// read or write on a connection gives up after io_timeout_ms; a connection
// serves at most 16 requests (keep-alive). Requests are GETs without a body.
//
// Threads: Start and Stop from any thread; the destructor stops.
struct MetricsServerOptions {
  int threads = 2;
  size_t max_queued = 8;
  int64_t io_timeout_ms = 2000;
};

class MetricsServer {
 public:
  using Options = MetricsServerOptions;

  // Binds HOST:PORT (port 0: a free port) and starts serving. The address
  // is bound without SO_REUSEPORT, so a port another process (or server)
  // listens on is refused: UNAVAILABLE, naming the address.
  // INVALID_ARGUMENT if `host_port` is not HOST:PORT.
  static Result<std::unique_ptr<MetricsServer>> Start(
      const std::string& host_port, Sources sources,
      const Options& options = {});
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // HOST:PORT, with the port bound when 0 was asked for.
  const std::string& address() const { return address_; }
  // Scrapes of /metrics served so far.
  uint64_t scrapes() const { return scrapes_.load(); }
  // Stops accepting, finishes the requests being served (each bounded by
  // io_timeout_ms) and joins every thread. Idempotent.
  void Stop();

 private:
  class Impl;
  MetricsServer() = default;
  std::unique_ptr<Impl> impl_;
  std::string address_;
  std::atomic<uint64_t> scrapes_{0};
};

// Splits "HOST:PORT" (HOST may be "[v6]"); INVALID_ARGUMENT names `what`.
Result<std::pair<std::string, int>> ParseHostPort(const std::string& host_port,
                                                  const std::string& what);

}  // namespace tensorhub::metrics

#endif  // TENSORHUB_METRICS_METRICS_H_
