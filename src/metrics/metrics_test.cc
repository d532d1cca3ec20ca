#include "metrics/metrics.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace tensorhub::metrics {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

// The exact text exposition (format 0.0.4) of each metric type: what
// Prometheus and promtool read (tests/python/test_metrics.py checks real
// scrapes with promtool and the Python client's parser).
TEST(MetricsRender, CounterGaugeAndHistogramInTextFormat) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& bytes = BuildCounter()
                    .Name("tensorhub_test_bytes_total")
                    .Help("Bytes moved")
                    .Register(*registry);
  bytes.Add({{"path", "tcp"}}).Increment(1024);
  bytes.Add({{"path", "same_host"}}).Increment(1);
  BuildGauge()
      .Name("tensorhub_test_in_flight")
      .Help("Reads now")
      .Register(*registry)
      .Add({})
      .Set(3);
  auto& h = BuildHistogram()
                .Name("tensorhub_test_seconds")
                .Help("Durations")
                .Register(*registry)
                .Add({}, std::vector<double>{0.1, 1});
  h.Observe(0.05);
  h.Observe(0.5);
  h.Observe(7);

  const std::string text = Render({registry});
  EXPECT_NE(text.find("# HELP tensorhub_test_bytes_total Bytes moved\n"
                      "# TYPE tensorhub_test_bytes_total counter\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("tensorhub_test_bytes_total{path=\"tcp\"} 1024\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("tensorhub_test_bytes_total{path=\"same_host\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("# TYPE tensorhub_test_in_flight gauge\n"
                      "tensorhub_test_in_flight 3\n"),
            std::string::npos)
      << text;
  // Buckets are cumulative and end with +Inf; _count and _sum follow.
  EXPECT_NE(text.find("# TYPE tensorhub_test_seconds histogram\n"
                      "tensorhub_test_seconds_count 3\n"
                      "tensorhub_test_seconds_sum 7.55\n"
                      "tensorhub_test_seconds_bucket{le=\"0.1\"} 1\n"
                      "tensorhub_test_seconds_bucket{le=\"1\"} 2\n"
                      "tensorhub_test_seconds_bucket{le=\"+Inf\"} 3\n"),
            std::string::npos)
      << text;
}

TEST(MetricsRender, FunctionCollectorIsComputedAtEachScrape) {
  int calls = 0;
  auto collector = std::make_shared<FunctionCollector>([&calls] {
    ++calls;
    std::vector<prometheus::MetricFamily> out;
    out.push_back(GaugeFamily("tensorhub_test_versions", "Versions by state"));
    AddSample(out.back(), {{"state", "committed"}}, calls);
    AddSample(out.back(), {{"state", "pending"}}, 0);
    out.push_back(CounterFamily("tensorhub_test_served_total", "Served"));
    AddSample(out.back(), {}, 5);
    return out;
  });
  EXPECT_NE(Render({collector})
                .find("tensorhub_test_versions{state=\"committed\"} 1\n"),
            std::string::npos);
  const std::string second = Render({collector});
  EXPECT_NE(second.find("tensorhub_test_versions{state=\"committed\"} 2\n"),
            std::string::npos)
      << second;
  EXPECT_NE(second.find("tensorhub_test_versions{state=\"pending\"} 0\n"),
            std::string::npos);
  EXPECT_NE(second.find("# TYPE tensorhub_test_served_total counter\n"
                        "tensorhub_test_served_total 5\n"),
            std::string::npos)
      << second;
}

TEST(MetricsRender, DestroyedSourcesAreSkipped) {
  auto kept = std::make_shared<prometheus::Registry>();
  BuildGauge().Name("tensorhub_kept").Help("h").Register(*kept).Add({}).Set(1);
  Sources sources = {kept};
  {
    auto gone = std::make_shared<prometheus::Registry>();
    BuildGauge().Name("tensorhub_gone").Help("h").Register(*gone).Add({});
    sources.push_back(gone);
  }
  const std::string text = Render(sources);
  EXPECT_NE(text.find("tensorhub_kept 1"), std::string::npos);
  EXPECT_EQ(text.find("tensorhub_gone"), std::string::npos);
}

TEST(ParseHostPort, AcceptsHostPortAndRejectsTheRest) {
  auto ok = ParseHostPort("127.0.0.1:9100", "x");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->first, "127.0.0.1");
  EXPECT_EQ(ok->second, 9100);
  auto v6 = ParseHostPort("[::1]:0", "x");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->first, "::1");
  for (const char* bad : {"", "9100", ":9100", "host:", "host:port",
                          "host:65536", "host:123456", "[]:1"}) {
    auto r = ParseHostPort(bad, "--metrics-listen");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("--metrics-listen"), std::string::npos);
  }
}

std::shared_ptr<prometheus::Registry> OneCounter(double value) {
  auto registry = std::make_shared<prometheus::Registry>();
  BuildCounter()
      .Name("tensorhub_test_total")
      .Help("A counter")
      .Register(*registry)
      .Add({})
      .Increment(value);
  return registry;
}

httplib::Client ClientFor(const MetricsServer& server) {
  httplib::Client c("http://" + server.address());
  c.set_connection_timeout(10);
  c.set_read_timeout(10);
  return c;
}

TEST(MetricsServer, ServesTheExpositionAtMetricsOnly) {
  auto registry = OneCounter(42);
  auto server = MetricsServer::Start("127.0.0.1:0", {registry});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_NE((*server)->address().find("127.0.0.1:"), std::string::npos);
  EXPECT_NE((*server)->address(), "127.0.0.1:0");

  httplib::Client c = ClientFor(**server);
  auto res = c.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"),
            "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(res->body, Render({registry}));
  EXPECT_NE(res->body.find("tensorhub_test_total 42\n"), std::string::npos);
  EXPECT_EQ((*server)->scrapes(), 1u);

  auto other = c.Get("/");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
  auto post = c.Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_NE(post->status, 200);
  EXPECT_EQ((*server)->scrapes(), 1u);
}

TEST(MetricsServer, APortInUseIsAClearError) {
  auto first = MetricsServer::Start("127.0.0.1:0", {});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = MetricsServer::Start((*first)->address(), {});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find((*first)->address()),
            std::string::npos)
      << second.status().message();
  EXPECT_NE(second.status().message().find("in use"), std::string::npos);

  auto bad = MetricsServer::Start("no-port", {});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

TEST(MetricsServer, StopRightAfterStartReturns) {
  for (int i = 0; i < 20; ++i) {
    auto server = MetricsServer::Start("127.0.0.1:0", {});
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    (*server)->Stop();
    (*server)->Stop();  // idempotent
  }
}

// Threads of this process now (/proc/self/task).
size_t ProcessThreads() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e :
       std::filesystem::directory_iterator("/proc/self/task")) {
    ++n;
  }
  return n;
}

// More clients at once than threads plus queue: every one is answered (the
// listener serves what does not fit), and no more threads exist than the
// options allow (the pool's, the listener's): every scrape runs on one of
// those two threads, and while the clients wait no other thread appears.
TEST(MetricsServer, ManyClientsAtOnceAreAllServed) {
  auto registry = OneCounter(7);
  // Runs inside every scrape, on the thread that serves it.
  std::mutex mu;
  std::set<pid_t> serving_threads;
  size_t most_threads = 0;
  auto probe = std::make_shared<FunctionCollector>([&] {
    const size_t now = ProcessThreads();
    std::lock_guard<std::mutex> lock(mu);
    serving_threads.insert(::gettid());
    most_threads = std::max(most_threads, now);
    return std::vector<prometheus::MetricFamily>{};
  });
  MetricsServer::Options o;
  o.threads = 1;
  o.max_queued = 1;
  const size_t before = ProcessThreads();
  auto server = MetricsServer::Start("127.0.0.1:0", {registry, probe}, o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  constexpr int kClients = 8;
  constexpr int kScrapes = 5;
  std::vector<std::thread> clients;
  std::vector<int> ok(kClients, 0);
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      httplib::Client c = ClientFor(**server);
      for (int k = 0; k < kScrapes; ++k) {
        auto res = c.Get("/metrics");
        if (res && res->status == 200 &&
            res->body.find("tensorhub_test_total 7") != std::string::npos) {
          ++ok[i];
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < kClients; ++i) EXPECT_EQ(ok[i], kScrapes) << i;
  EXPECT_EQ((*server)->scrapes(), uint64_t{kClients * kScrapes});
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_LE(serving_threads.size(), size_t(o.threads) + 1)
      << "scrapes ran on more threads than the pool's and the listener's";
  EXPECT_LE(most_threads, before + kClients + o.threads + 1)
      << "threads beyond the clients, the pool and the listener";
}

}  // namespace
}  // namespace tensorhub::metrics
