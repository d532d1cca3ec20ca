#include "client/keeper.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <new>

#include "client/client_deps.h"
#include "client/client_metrics.h"
#include "client/client_tls.h"
#include "common/deadline.h"
#include "common/log.h"

namespace tensorhub::client {
namespace {

std::string Name(const KeeperItem& t) {
  return "'" + t.model + "@" + std::to_string(t.version.value()) + "'";
}

uint64_t HalfOfPhysicalMemory() {
  long pages = ::sysconf(_SC_PHYS_PAGES);
  long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 1ull << 30;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 2;
}

}  // namespace

// The keeper's figures, in its client's metrics registry (docs/metrics.md).
struct Keeper::Metrics {
  explicit Metrics(prometheus::Registry& r)
      : copies(Counter(r, "tensorhub_keeper_copies_total",
                       "Retained versions this keeper copied")),
        releases(Counter(r, "tensorhub_keeper_releases_total",
                         "Copies this keeper dropped once no longer "
                         "retained")),
        refusals(Counter(r, "tensorhub_keeper_refusals_total",
                         "Versions that did not fit in the keeper's memory "
                         "limit (counted once until room is made)")),
        failures(Counter(r, "tensorhub_keeper_copy_failures_total",
                         "Copies that failed (retried on a later poll)")),
        held_bytes(prometheus::BuildGauge()
                       .Name("tensorhub_keeper_held_bytes")
                       .Help("Bytes of retained versions this keeper holds")
                       .Register(r)
                       .Add({})),
        limit_bytes(prometheus::BuildGauge()
                        .Name("tensorhub_keeper_memory_limit_bytes")
                        .Help("The keeper's memory limit")
                        .Register(r)
                        .Add({})) {}
  static prometheus::Counter& Counter(prometheus::Registry& r,
                                      const std::string& name,
                                      const std::string& help) {
    return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
  }
  prometheus::Counter& copies;
  prometheus::Counter& releases;
  prometheus::Counter& refusals;
  prometheus::Counter& failures;
  prometheus::Gauge& held_bytes;
  prometheus::Gauge& limit_bytes;
};

Result<std::unique_ptr<Keeper>> Keeper::Start(const KeeperOptions& options) {
  if (options.poll_wait_ms < 0 || options.poll_wait_ms > 30000) {
    return InvalidArgument("keeper poll wait must be in [0, 30000] ms");
  }
  ClientOptions co = options.client;
  co.worker_class = WorkerClass::kReliable;  // the point of a keeper
  if (co.name.empty()) {
    char host[256] = {0};
    ::gethostname(host, sizeof(host) - 1);
    co.name = "keeper@" + std::string(host) + ":" + std::to_string(::getpid());
  }
  TH_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(co));
  // Read again (Connect checked them): the keeper's own channel to the hub.
  TH_ASSIGN_OR_RETURN(ClientTls tls, LoadClientTls(co));
  std::unique_ptr<Keeper> k(
      new Keeper(options, std::move(client), std::move(tls.hub)));
  TH_LOG(INFO) << "keeper " << k->id().value() << " holds up to "
               << k->limit_bytes_ << " bytes of retained versions";
  k->thread_ = std::thread([p = k.get()] { p->Loop(); });
  return k;
}

Keeper::Keeper(const KeeperOptions& options, std::unique_ptr<Client> client,
               HubTls hub_tls)
    : options_(options),
      limit_bytes_(options.memory_limit_bytes > 0 ? options.memory_limit_bytes
                                                  : HalfOfPhysicalMemory()),
      client_(std::move(client)),
      hub_(MakeGrpcControlPlane(
          options.client.hub_address, options.client.secret,
          options.client.rpc_timeout_ms, std::move(hub_tls))),
      metrics_(std::make_unique<Metrics>(
          *ClientFactory::Metrics(*client_).registry())) {
  metrics_->limit_bytes.Set(static_cast<double>(limit_bytes_));
}

Keeper::~Keeper() {
  Stop();
  // Leaves the hub (waiting for other keepers if we hold a last copy) and
  // stops serving; only then may the buffers go.
  client_.reset();
  held_.clear();
  undrained_.clear();
}

void Keeper::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Keeper::Stopping() {
  MutexLock lock(mu_);
  return stopping_;
}

KeeperStats Keeper::stats() const {
  MutexLock lock(mu_);
  return stats_;
}

void Keeper::Loop() {
  while (!Stopping()) {
    bool progress = false;
    if (!repin_.empty() && !Repin()) {
      // Not everything is pinned again yet (the hub has not heard of some
      // versions from our heartbeat thread): do not poll, or it would tell
      // us to release them.
    } else if (Result<KeeperPollResult> work =
                   hub_->KeeperPoll(id(), options_.poll_wait_ms);
               !work.ok()) {
      // NOT_FOUND: the hub forgot us (restart); the client's heartbeat
      // thread registers again. Else the hub is unreachable for now.
      TH_LOG(DEBUG) << "keeper poll: " << work.status().ToString();
    } else if (incarnation_ != 0 && work->hub_incarnation != incarnation_) {
      // The hub restarted and forgot every Retain pin. Restore the pins of
      // what we hold before acting on any answer.
      incarnation_ = work->hub_incarnation;
      for (const Key& k : pinned_) {
        if (held_.count(k) > 0) repin_.insert(k);
      }
      repin_deadline_ms_ = NowMs() + 30000;
      release_after_ms_ = NowMs() + 10000;
      TH_LOG(WARN) << "hub restarted: pinning " << repin_.size()
                   << " retained version(s) again";
      progress = true;
    } else {
      incarnation_ = work->hub_incarnation;
      // Pins of what we hold, as the hub sees them now.
      pinned_.clear();
      for (const KeeperItem& p : work->pinned) {
        if (held_.count({p.model, p.version}) > 0)
          pinned_.insert({p.model, p.version});
      }
      for (const KeeperItem& item : work->release) {
        if (Stopping()) break;
        if (NowMs() < release_after_ms_) break;  // hub still rebuilding
        progress |= Drop(item);
      }
      for (const KeeperItem& item : work->fetch) {
        if (Stopping()) break;
        if (Keep(item)) {
          progress = true;
          for (const KeeperItem& p : work->pinned) {
            if (p.model == item.model && p.version == item.version) {
              pinned_.insert({p.model, p.version});
            }
          }
        }
      }
      if (work->fetch.empty() && work->release.empty()) progress = true;
    }
    if (!progress) {
      // Nothing we could do (hub away, memory full, fetch failing): do not
      // spin on the same answer.
      MutexLock lock(mu_);
      cv_.wait_for(lock.native(), std::chrono::milliseconds(500),
                   [this]() TH_REQUIRES(mu_) { return stopping_; });
    }
  }
}

bool Keeper::Keep(const KeeperItem& item) {
  const Key key{item.model, item.version};
  if (held_.count(key) > 0) return false;
  uint64_t used = 0;
  for (const auto& [k, h] : held_) used += h.size;
  if (item.total_bytes > limit_bytes_ - std::min(used, limit_bytes_)) {
    if (refused_.insert(key).second) {
      TH_LOG(ERROR) << "keeper memory full: cannot keep " << Name(item) << " ("
                    << item.total_bytes << " bytes; holding " << used << " of "
                    << limit_bytes_ << "). Start another keeper "
                    << "or raise --memory-limit";
      metrics_->refusals.Increment();
      MutexLock lock(mu_);
      ++stats_.refused;
    }
    return false;
  }
  auto fail = [&](const Status& s) {
    TH_LOG(WARN) << "keeper could not copy " << Name(item) << ": "
                 << s.ToString();
    metrics_->failures.Increment();
    MutexLock lock(mu_);
    ++stats_.failed;
    return false;
  };
  Result<VersionInfo> info = client_->Describe(item.model, item.version);
  if (!info.ok()) return fail(info.status());
  if (info->total_bytes != item.total_bytes) {
    return fail(Internal("hub reported two sizes for the version"));
  }
  Held h;
  h.size = info->total_bytes;
  Result<HostBuffer> buffer =
      HostBuffer::Allocate(std::max<uint64_t>(h.size, 1));
  if (!buffer.ok()) return fail(buffer.status());
  h.bytes = std::move(*buffer);
  std::vector<TensorRef> dest;
  uint64_t offset = 0;
  for (const TensorInfo& t : info->tensors) {
    dest.push_back(
        {t.spec, h.bytes.data() + offset, t.bytes, MemoryLocation::Host()});
    offset += t.bytes;
  }
  FetchOptions fo;
  fo.timeout_ms = options_.fetch_timeout_ms;
  fo.connections = options_.connections;
  auto t0 = std::chrono::steady_clock::now();
  Result<FetchStats> st = client_->Fetch(item.model, item.version, dest, fo);
  if (!st.ok()) return fail(st.status());
  double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  TH_LOG(INFO) << "keeper holds " << Name(item) << " (" << h.size
               << " bytes, copied in " << secs << " s)";
  held_[key] = std::move(h);
  refused_.erase(key);
  metrics_->copies.Increment();
  metrics_->held_bytes.Increment(static_cast<double>(item.total_bytes));
  MutexLock lock(mu_);
  ++stats_.fetched;
  stats_.versions_held = held_.size();
  stats_.bytes_held += item.total_bytes;
  return true;
}

bool Keeper::Repin() {
  for (auto it = repin_.begin(); it != repin_.end();) {
    Status s = hub_->Retain(it->first, it->second, true);
    if (s.ok()) {
      pinned_.insert(*it);
      it = repin_.erase(it);
    } else {
      TH_LOG(DEBUG) << "keeper re-pin '" << it->first << "@"
                    << it->second.value() << "': " << s.ToString();
      ++it;
    }
  }
  if (!repin_.empty() && NowMs() > repin_deadline_ms_) {
    for (const Key& k : repin_) {
      TH_LOG(ERROR) << "keeper could not pin '" << k.first << "@"
                    << k.second.value() << "' again after a hub restart";
    }
    repin_.clear();
  }
  return repin_.empty();
}

bool Keeper::Drop(const KeeperItem& item) {
  auto it = held_.find({item.model, item.version});
  if (it == held_.end()) {
    // Not ours (we restarted and the hub still lists a copy?): unpublish
    // all the same so the hub's table matches what we serve.
    TH_LOG(WARN) << "keeper asked to release " << Name(item)
                 << ", which it does not hold";
    return false;
  }
  Status s = client_->Unpublish(item.model, item.version, 30000);
  if (!s.ok() && s.code() != StatusCode::kDeadlineExceeded) {
    TH_LOG(WARN) << "keeper release " << Name(item) << ": " << s.ToString();
    return false;
  }
  const uint64_t size = it->second.size;
  if (!s.ok()) {
    // Reads still in flight at the deadline: the memory is not safe to
    // free yet; keep it until we exit (the server is stopped by then).
    undrained_.push_back(std::move(it->second));
  }
  held_.erase(it);
  refused_.clear();  // room again: retry and re-log what did not fit
  TH_LOG(INFO) << "keeper released " << Name(item) << " (no longer retained)";
  metrics_->releases.Increment();
  metrics_->held_bytes.Decrement(static_cast<double>(size));
  MutexLock lock(mu_);
  ++stats_.released;
  stats_.versions_held = held_.size();
  stats_.bytes_held -= std::min(stats_.bytes_held, size);
  return true;
}

}  // namespace tensorhub::client
