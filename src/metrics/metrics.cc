#include "metrics/metrics.h"

#include <httplib.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>

#include <condition_variable>
#include <deque>
#include <sstream>
#include <thread>

#include "common/log.h"
#include "common/mutex.h"

namespace tensorhub::metrics {

std::vector<double> SecondsBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
          0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5,
          5,      10,      25,     60,    150,    600};
}

prometheus::MetricFamily GaugeFamily(std::string name, std::string help) {
  prometheus::MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = prometheus::MetricType::Gauge;
  return f;
}

prometheus::MetricFamily CounterFamily(std::string name, std::string help) {
  prometheus::MetricFamily f = GaugeFamily(std::move(name), std::move(help));
  f.type = prometheus::MetricType::Counter;
  return f;
}

void AddSample(prometheus::MetricFamily& family, const LabelPairs& labels,
               double value) {
  prometheus::ClientMetric m;
  for (const auto& [k, v] : labels) m.label.push_back({k, v});
  if (family.type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  family.metric.push_back(std::move(m));
}

std::string Render(const Sources& sources) {
  std::vector<prometheus::MetricFamily> families;
  for (const auto& weak : sources) {
    std::shared_ptr<prometheus::Collectable> source = weak.lock();
    if (source == nullptr) continue;
    std::vector<prometheus::MetricFamily> more = source->Collect();
    for (prometheus::MetricFamily& f : more) families.push_back(std::move(f));
  }
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

Result<std::pair<std::string, int>> ParseHostPort(const std::string& host_port,
                                                  const std::string& what) {
  const size_t colon = host_port.rfind(':');
  auto bad = [&] {
    return InvalidArgument(what + " must be HOST:PORT, not '" + host_port +
                           "'");
  };
  if (colon == std::string::npos || colon == 0) return bad();
  std::string host = host_port.substr(0, colon);
  const std::string port = host_port.substr(colon + 1);
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos) {
    return bad();
  }
  const int p = std::stoi(port);
  if (p > 65535) return bad();
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty()) return bad();
  return std::make_pair(host, p);
}

namespace {

// httplib's task queue for accepted connections, bounded: `threads` workers
// and at most `max_queued` connections waiting. When full, the listening
// thread serves the connection itself (it calls enqueue), so it stops
// accepting until that one is done: no thread or queue grows with load.
class BoundedPool final : public httplib::TaskQueue {
 public:
  BoundedPool(int threads, size_t max_queued) : max_queued_(max_queued) {
    for (int i = 0; i < threads; ++i) {
      workers_.emplace_back([this] { Work(); });
    }
  }
  ~BoundedPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    {
      MutexLock lock(mu_);
      if (!shutdown_ && jobs_.size() < max_queued_) {
        jobs_.push_back(std::move(fn));
        cv_.notify_one();
        return;
      }
    }
    fn();
  }

  // Serves what is queued, then joins the workers. Called by httplib once
  // its listener stopped (and by the destructor; the second call joins
  // nothing).
  void shutdown() override {
    {
      MutexLock lock(mu_);
      shutdown_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  void Work() {
    MutexLock lock(mu_);
    while (true) {
      cv_.wait(lock.native(),
               [&]() TH_REQUIRES(mu_) { return shutdown_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // shut down and drained
      std::function<void()> fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.Unlock();
      fn();
      lock.Lock();
    }
  }

  const size_t max_queued_;
  Mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_ TH_GUARDED_BY(mu_);
  bool shutdown_ TH_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace

class MetricsServer::Impl {
 public:
  httplib::Server http;
  std::thread listener;
  Mutex mu;
  std::condition_variable cv;
  bool stopped TH_GUARDED_BY(mu) = false;
  bool listener_done TH_GUARDED_BY(mu) = false;
};

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& host_port, Sources sources, const Options& options) {
  TH_ASSIGN_OR_RETURN(auto hp, ParseHostPort(host_port, "metrics address"));
  const auto& [host, port] = hp;
  if (options.threads < 1 || options.max_queued < 1 ||
      options.io_timeout_ms < 1) {
    return InvalidArgument(
        "metrics server: threads, queue and timeout must be positive");
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->impl_ = std::make_unique<Impl>();
  httplib::Server& http = server->impl_->http;
  // SO_REUSEADDR (a restarted process may bind while old connections sit in
  // TIME_WAIT) but not httplib's default SO_REUSEPORT, with which a second
  // listener on a port in use would silently share it.
  http.set_socket_options([](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  const time_t sec = options.io_timeout_ms / 1000;
  const time_t usec = (options.io_timeout_ms % 1000) * 1000;
  http.set_read_timeout(sec, usec);
  http.set_write_timeout(sec, usec);
  http.set_keep_alive_timeout(std::max<time_t>(1, sec));
  http.set_keep_alive_max_count(16);
  http.set_payload_max_length(4096);
  const int threads = options.threads;
  const size_t max_queued = options.max_queued;
  http.new_task_queue = [threads, max_queued] {
    return new BoundedPool(threads, max_queued);
  };
  MetricsServer* self = server.get();
  http.Get("/metrics", [self, sources = std::move(sources)](
                           const httplib::Request&, httplib::Response& res) {
    self->scrapes_.fetch_add(1, std::memory_order_relaxed);
    res.set_content(Render(sources),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  int bound = port;
  if (port == 0) {
    bound = http.bind_to_any_port(host);
  } else if (!http.bind_to_port(host, port)) {
    bound = -1;
  }
  if (bound <= 0) {
    return Unavailable("metrics server cannot listen on " + host_port +
                       " (port in use, or not an address of this host)");
  }
  const bool v6 = host.find(':') != std::string::npos;
  server->address_ =
      (v6 ? "[" + host + "]" : host) + ":" + std::to_string(bound);
  server->impl_->listener = std::thread([self] {
    Impl& impl = *self->impl_;
    impl.http.listen_after_bind();
    MutexLock lock(impl.mu);
    impl.listener_done = true;
    impl.cv.notify_all();
  });
  TH_LOG(INFO) << "metrics on http://" << server->address_ << "/metrics";
  return server;
}

MetricsServer::~MetricsServer() { Stop(); }

void MetricsServer::Stop() {
  if (impl_ == nullptr) return;
  Impl& impl = *impl_;
  {
    MutexLock lock(impl.mu);
    if (impl.stopped) return;
    impl.stopped = true;
  }
  if (!impl.listener.joinable()) return;  // Start failed before it
  // httplib's stop() only acts once the listener runs: a Stop() right after
  // Start() may come before that, so it is repeated until the listener ended.
  MutexLock lock(impl.mu);
  while (!impl.listener_done) {
    lock.Unlock();
    impl.http.stop();
    lock.Lock();
    impl.cv.wait_for(lock.native(), std::chrono::milliseconds(10),
                     [&]() TH_REQUIRES(impl.mu) { return impl.listener_done; });
  }
  lock.Unlock();
  impl.listener.join();
}

}  // namespace tensorhub::metrics
