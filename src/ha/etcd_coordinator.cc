#include "ha/etcd_coordinator.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "common/log.h"
#include "common/mutex.h"
#include "ha/etcd_client.h"
#include "ha/etcd_keys.h"
#include "wire/call_proof.h"

namespace tensorhub::ha {
namespace {

// Operations per fenced transaction (etcd refuses more than 128 by default).
constexpr size_t kOpsPerTxn = 64;
// Keys per page when a new leader reads the durable facts, and pages at most.
constexpr int64_t kPageKeys = 1000;
constexpr int kMaxPages = 10000;
// Pause before trying etcd again after a failed call.
constexpr int64_t kRetryPauseMs = 200;

class EtcdCoordinator final : public hub::Coordinator {
 public:
  EtcdCoordinator(EtcdCoordinatorOptions o, std::unique_ptr<EtcdClient> etcd)
      : o_(std::move(o)),
        leader_key_(LeaderKey(o_.prefix)),
        secret_key_(SecretIdKey(o_.prefix)),
        secret_id_(SecretIdentity(o_.secret)),
        ttl_s_(std::max<int64_t>(1, (o_.lease_ms + 999) / 1000)),
        call_ms_(std::max<int64_t>(1000, o_.lease_ms)),
        etcd_(std::move(etcd)) {}
  ~EtcdCoordinator() override { Stop(); }

  Status Start(Callbacks callbacks) override {
    cb_ = std::move(callbacks);
    Result<RangeResult> r =
        etcd_->Range(secret_key_, "", 0, 0, Deadline::AfterMs(call_ms_));
    if (!r.ok()) {
      return Unavailable("cannot reach etcd at " + etcd_->endpoints() + ": " +
                         r.status().message());
    }
    if (!r->kvs.empty() && r->kvs[0].value != secret_id_) {
      return SecretMismatch();
    }
    TH_LOG(INFO) << "hub " << o_.advertise << " joins the hub set in etcd at "
                 << etcd_->endpoints() << " (prefix '" << o_.prefix
                 << "', lease " << ttl_s_ << " s)";
    thread_ = std::thread([this] { Run(); });
    return Status::Ok();
  }

  bool Leading() const override {
    return leading_.load(std::memory_order_acquire) &&
           NowMs() < lease_end_ms_.load(std::memory_order_acquire);
  }

  std::string Leader() const override {
    MutexLock lock(mu_);
    return leader_;
  }

  const std::string& self() const override { return o_.advertise; }

  Status Persist(const std::vector<hub::DurableChange>& changes,
                 int64_t deadline_ms) override {
    if (changes.empty()) return Status::Ok();
    if (!Leading()) return NotLeading();
    const int64_t rev = leader_rev_.load(std::memory_order_acquire);
    // Later changes of a key replace earlier ones; one transaction may not
    // name a key twice.
    std::map<std::string, std::optional<std::string>> writes;
    for (const hub::DurableChange& c : changes) {
      KeyWrite w = EncodeChange(o_.prefix, c);
      writes[w.key] = std::move(w.value);
    }
    std::vector<TxnOp> ops;
    for (auto it = writes.begin(); it != writes.end();) {
      ops.push_back(it->second.has_value() ? TxnOp::Put(it->first, *it->second)
                                           : TxnOp::Delete(it->first));
      ++it;
      if (ops.size() < kOpsPerTxn && it != writes.end()) continue;
      Result<TxnResult> r = etcd_->Txn({Compare::CreatedAt(leader_key_, rev)},
                                       ops, {}, Deadline::AtMs(deadline_ms));
      if (!r.ok()) {
        return Unavailable("could not record the change in etcd: " +
                           r.status().message());
      }
      if (!r->succeeded) {
        // Fenced off: the leader key is gone or another hub's.
        fenced_out_.store(true, std::memory_order_release);
        leading_.store(false, std::memory_order_release);
        {
          MutexLock lock(mu_);  // the election thread is waiting or not
        }
        cv_.notify_all();
        return FailedPrecondition(
            "hub " + o_.advertise +
            " lost the leadership (its leader key in etcd is gone or "
            "another hub's): the write was refused");
      }
      ops.clear();
    }
    return Status::Ok();
  }

  void Stop() override {
    {
      MutexLock lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    etcd_->CancelWaits();
    if (thread_.joinable()) thread_.join();
  }

 private:
  Status SecretMismatch() const {
    return FailedPrecondition(
        "the hub set in etcd under prefix '" + o_.prefix +
        "' runs with another secret than this hub (compared by "
        "their identity, a hash, in " +
        secret_key_ + "): give every hub of the set the same secret");
  }
  Status NotLeading() const {
    return FailedPrecondition("hub " + o_.advertise + " is not the leader");
  }

  bool Stopping() const {
    MutexLock lock(mu_);
    return stopping_;
  }

  // Waits until `at_ms` (NowMs() scale), Stop(), or a fenced write; false
  // when stopping.
  bool SleepUntil(int64_t at_ms) {
    MutexLock lock(mu_);
    Deadline until = Deadline::AtMs(at_ms);
    cv_.wait_until(lock.native(), until.at(), [&]() TH_REQUIRES(mu_) {
      return stopping_ || fenced_out_.load(std::memory_order_acquire);
    });
    return !stopping_;
  }

  void SetLeader(const std::string& address) {
    MutexLock lock(mu_);
    // Our own address under another lease is this hub's previous life (a
    // restart within a lease): no leader to send clients to.
    leader_ = address == o_.advertise && !leading_.load() ? "" : address;
  }

  // Logs the first failure of a streak as a warning, the rest at debug.
  void Trouble(const std::string& what, const Status& s) {
    if (failures_++ == 0) {
      TH_LOG(WARN) << what << ": " << s.ToString() << " (retrying)";
    } else {
      TH_LOG(DEBUG) << what << ": " << s.ToString();
    }
  }

  void Run() {
    while (!Stopping()) {
      if (lease_id_ == 0) {
        const int64_t t0 = NowMs();
        Result<LeaseGrant> g =
            etcd_->GrantLease(ttl_s_, Deadline::AfterMs(call_ms_));
        if (!g.ok()) {
          Trouble("etcd lease grant", g.status());
          SleepUntil(NowMs() + kRetryPauseMs);
          continue;
        }
        lease_id_ = g->id;
        ttl_ms_ = g->ttl_s * 1000;
        renewed_ms_ = t0;
      }
      Result<std::optional<int64_t>> won = Campaign();
      if (!won.ok()) {
        Trouble("campaign for hub leader", won.status());
        lease_id_ = 0;  // granted again (the old one expires on its own)
        SleepUntil(NowMs() + kRetryPauseMs);
        continue;
      }
      failures_ = 0;
      if (won->has_value()) {
        Lead(**won);
      } else {
        Standby();
      }
      if (refused_) break;
    }
    if (lease_id_ != 0) Resign();
  }

  // One try at the leader key: the create revision of our key if we won,
  // nullopt if another hub holds it (then leader_ and watch_from_ are set).
  Result<std::optional<int64_t>> Campaign() {
    TH_ASSIGN_OR_RETURN(
        TxnResult r,
        etcd_->Txn({Compare::CreatedAt(leader_key_, 0)},
                   {TxnOp::Put(leader_key_, o_.advertise, lease_id_)},
                   {TxnOp::Get(leader_key_)}, Deadline::AfterMs(call_ms_)));
    if (r.succeeded) return std::optional<int64_t>(r.revision);
    if (!r.gets.empty() && r.gets[0].has_value() &&
        r.gets[0]->lease == lease_id_) {
      // Our own put, applied by an earlier try of this transaction that
      // timed out (EtcdClient tries the next member).
      return std::optional<int64_t>(r.gets[0]->create_revision);
    }
    watch_from_ = r.revision + 1;
    SetLeader(!r.gets.empty() && r.gets[0].has_value() ? r.gets[0]->value : "");
    return std::optional<int64_t>();
  }

  // Reads every durable fact under the prefix at one revision.
  Status LoadDurable(hub::DurableState& out) {
    const std::string end = EtcdClient::PrefixEnd(o_.prefix);
    std::string from = o_.prefix;
    int64_t revision = 0;
    for (int page = 0; page < kMaxPages; ++page) {
      TH_ASSIGN_OR_RETURN(RangeResult r,
                          etcd_->Range(from, end, kPageKeys, revision,
                                       Deadline::AfterMs(call_ms_)));
      if (revision == 0) revision = r.revision;
      for (const KeyValue& kv : r.kvs) {
        TH_RETURN_IF_ERROR(DecodeInto(o_.prefix, kv.key, kv.value, out));
      }
      if (!r.more || r.kvs.empty()) return Status::Ok();
      from = r.kvs.back().key + '\0';
    }
    return ResourceExhausted("more than " +
                             std::to_string(kPageKeys * kMaxPages) +
                             " keys under etcd prefix '" + o_.prefix + "'");
  }

  // The first leader of a set records the secret's identity; a later one
  // checks it (a hub started with another secret while this one ran).
  Status RecordSecret(int64_t rev) {
    TH_ASSIGN_OR_RETURN(
        TxnResult r,
        etcd_->Txn({Compare::CreatedAt(leader_key_, rev),
                    Compare::CreatedAt(secret_key_, 0)},
                   {TxnOp::Put(secret_key_, secret_id_)},
                   {TxnOp::Get(secret_key_)}, Deadline::AfterMs(call_ms_)));
    if (r.succeeded) return Status::Ok();
    if (r.gets.empty() || !r.gets[0].has_value()) {
      return FailedPrecondition("lost the leader key while taking over");
    }
    // A hash of the secret, stored in etcd anyway; compared in constant
    // time all the same, as every comparison of secret material is.
    if (!wire::SecretsEqual(r.gets[0]->value, secret_id_)) {
      refused_ = true;
      return SecretMismatch();
    }
    return Status::Ok();
  }

  void Lead(int64_t rev) {
    leader_rev_.store(rev, std::memory_order_release);
    fenced_out_.store(false, std::memory_order_release);
    hub::DurableState durable;
    Status s = LoadDurable(durable);
    if (s.ok()) s = RecordSecret(rev);
    if (s.ok() && NowMs() >= renewed_ms_ + ttl_ms_) {
      s = Unavailable("its lease ran out while it loaded the durable state");
    }
    if (s.ok()) s = cb_.elected(durable);
    if (!s.ok()) {
      TH_LOG(ERROR) << "hub " << o_.advertise
                    << " won the election but cannot lead: " << s.ToString();
      Resign();
      // Let another hub try before this one campaigns again.
      SleepUntil(NowMs() + ttl_ms_);
      return;
    }
    lease_end_ms_.store(renewed_ms_ + ttl_ms_, std::memory_order_release);
    leading_.store(true, std::memory_order_release);
    SetLeader(o_.advertise);
    TH_LOG(INFO) << "hub " << o_.advertise
                 << " is the leader (leader key revision " << rev
                 << "; restored " << durable.highest.size() << " model(s), "
                 << durable.pins.size() << " pin(s), " << durable.groups.size()
                 << " reader group(s))";
    const std::string why = KeepLeading(rev);
    leading_.store(false, std::memory_order_release);
    lease_end_ms_.store(0, std::memory_order_release);
    SetLeader("");
    TH_LOG(WARN) << "hub " << o_.advertise << " stops leading: " << why;
    cb_.demoted();
    Resign();
  }

  // Renews the lease every third of its TTL until leading must end;
  // returns why.
  std::string KeepLeading(int64_t rev) {
    while (true) {
      if (!SleepUntil(renewed_ms_ + ttl_ms_ / 3)) return "shutting down";
      if (fenced_out_.load(std::memory_order_acquire)) {
        return "a write was fenced off: the leader key is not its own";
      }
      const int64_t t0 = NowMs();
      const int64_t end = lease_end_ms_.load(std::memory_order_acquire);
      if (t0 >= end) return "its lease ran out before etcd renewed it";
      Result<int64_t> ttl = etcd_->KeepAlive(
          lease_id_, Deadline::AtMs(std::min(end, t0 + ttl_ms_ / 3)));
      if (!ttl.ok()) {
        Trouble("renewing the leader's lease", ttl.status());
        SleepUntil(NowMs() + std::min<int64_t>(kRetryPauseMs, ttl_ms_ / 10));
        continue;
      }
      if (*ttl == 0) return "etcd says its lease expired";
      failures_ = 0;
      renewed_ms_ = t0;
      ttl_ms_ = *ttl * 1000;
      lease_end_ms_.store(t0 + ttl_ms_, std::memory_order_release);
      // The key is deleted only with the lease, unless by hand: check.
      Result<RangeResult> r =
          etcd_->Range(leader_key_, "", 0, 0, Deadline::AfterMs(ttl_ms_ / 3));
      if (r.ok() && (r->kvs.empty() || r->kvs[0].create_revision != rev)) {
        return "the leader key in etcd is no longer its own";
      }
    }
  }

  // Waits for the leader key to go, renewing this hub's own lease.
  void Standby() {
    while (!Stopping()) {
      Result<std::optional<WatchEvent>> ev = etcd_->WaitForChange(
          leader_key_, watch_from_,
          Deadline::AtMs(std::max(renewed_ms_ + ttl_ms_ / 3, NowMs() + 100)));
      if (!ev.ok()) {
        Trouble("watching the leader key", ev.status());
        SleepUntil(NowMs() + kRetryPauseMs);
        return;  // campaign again: it reads the key afresh
      }
      if (ev->has_value()) {
        const WatchEvent& e = **ev;
        if (e.type == WatchEvent::Type::kDelete) {
          TH_LOG(INFO) << "the leader's key is gone: hub " << o_.advertise
                       << " campaigns";
          return;
        }
        SetLeader(e.kv.value);
        watch_from_ = e.kv.mod_revision + 1;
        continue;
      }
      if (Stopping()) return;
      const int64_t t0 = NowMs();
      Result<int64_t> ttl =
          etcd_->KeepAlive(lease_id_, Deadline::AfterMs(call_ms_));
      if (ttl.ok() && *ttl > 0) {
        renewed_ms_ = t0;
        ttl_ms_ = *ttl * 1000;
        continue;
      }
      if (!ttl.ok()) Trouble("renewing a standby's lease", ttl.status());
      if (!ttl.ok() && NowMs() < renewed_ms_ + ttl_ms_) {
        SleepUntil(NowMs() + kRetryPauseMs);
        continue;
      }
      lease_id_ = 0;  // gone: grant a new one and campaign
      return;
    }
  }

  // Gives the lease back: the leader key goes with it (if it is still
  // ours), so a standby takes over now rather than after a lease.
  void Resign() {
    if (lease_id_ == 0) return;
    Status s = etcd_->RevokeLease(lease_id_, Deadline::AfterMs(2000));
    if (!s.ok()) TH_LOG(DEBUG) << "revoking the lease: " << s.ToString();
    lease_id_ = 0;
  }

  const EtcdCoordinatorOptions o_;
  const std::string leader_key_;
  const std::string secret_key_;
  const std::string secret_id_;
  const int64_t ttl_s_;    // asked of etcd
  const int64_t call_ms_;  // bound of one etcd call outside the lease loop
  const std::unique_ptr<EtcdClient> etcd_;
  Callbacks cb_;  // set by Start(), before the thread runs

  mutable Mutex mu_;
  std::condition_variable cv_;
  bool stopping_ TH_GUARDED_BY(mu_) = false;
  std::string leader_ TH_GUARDED_BY(mu_);
  std::thread thread_;

  // Read by Leading() and Persist() on RPC threads.
  std::atomic<bool> leading_{false};
  std::atomic<int64_t> lease_end_ms_{0};  // by this hub's clock
  std::atomic<int64_t> leader_rev_{0};    // create revision of our key
  std::atomic<bool> fenced_out_{false};

  // The election thread's own.
  int64_t lease_id_ = 0;
  int64_t ttl_ms_ = 0;
  int64_t renewed_ms_ = 0;  // when the last renewal etcd granted was sent
  int64_t watch_from_ = 0;
  int failures_ = 0;
  bool refused_ = false;  // another secret: never lead
};

}  // namespace

Result<std::unique_ptr<hub::Coordinator>> MakeEtcdCoordinator(
    const EtcdCoordinatorOptions& options) {
  EtcdCoordinatorOptions o = options;
  if (o.prefix.empty() || o.prefix[0] != '/') {
    return InvalidArgument("etcd prefix must start with '/'; got '" + o.prefix +
                           "'");
  }
  if (o.prefix.back() != '/') o.prefix += '/';
  if (o.advertise.empty() || o.advertise.find(':') == std::string::npos) {
    return InvalidArgument(
        "an HA hub needs the address clients reach it at (HOST:PORT); got '" +
        o.advertise + "'");
  }
  if (o.lease_ms < 1000 || o.lease_ms > 600000) {
    return InvalidArgument("etcd lease must be in [1000, 600000] ms; got " +
                           std::to_string(o.lease_ms));
  }
  TH_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> etcd,
                      EtcdClient::Create(o.endpoints));
  return std::unique_ptr<hub::Coordinator>(
      new EtcdCoordinator(std::move(o), std::move(etcd)));
}

}  // namespace tensorhub::ha
