#include "sim/workload.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "common/manifest.h"
#include "hub/hub_state.h"
#include "sim/engine.h"

namespace tensorhub::sim {

const char* SystemName(System s) {
  switch (s) {
    case System::kTensorHub:
      return "tensorhub";
    case System::kPointToPoint:
      return "p2p";
    case System::kRing:
      return "ring-bcast";
    case System::kTree:
      return "tree-bcast";
  }
  return "?";
}

Status WorkloadConfig::Validate() const {
  TH_RETURN_IF_ERROR(cluster.Validate());
  if (tp < 1 || tp > 4096) return InvalidArgument("tp must be in [1, 4096]");
  if (trainer_gpus < tp) {
    return InvalidArgument(
        "the trainer needs at least tp GPUs (one per shard)");
  }
  if (rollout_gpus < tp || rollout_gpus % tp != 0) {
    return InvalidArgument("rollout GPUs must be a positive multiple of tp");
  }
  if (remote_rollout_gpus < 0 || remote_rollout_gpus > rollout_gpus ||
      remote_rollout_gpus % tp != 0) {
    return InvalidArgument(
        "remote rollout GPUs must be a multiple of tp, at most all of them");
  }
  if (tensors < 1 || tensors > 1 << 20) {
    return InvalidArgument("tensors per shard must be in [1, 2^20]");
  }
  if (trainer_gpus + rollout_gpus > 1 << 20) {
    return InvalidArgument("at most 2^20 GPUs");
  }
  if (!(model_bytes >= 4096.0 * tp) || model_bytes > 1e15) {
    return InvalidArgument("model bytes must be in [4 KiB x tp, 1 PB]");
  }
  if (chunk_bytes < kMinChunkBytes || chunk_bytes > kMaxChunkBytes ||
      segment_bytes < 1 || segment_bytes > kMaxChunkBytes ||
      cut_through_bytes > kMaxChunkBytes) {
    return InvalidArgument(
        "chunk size must be in [4 KiB, 1 GiB], segment in [1, 1 GiB]");
  }
  if (ChunksFor(static_cast<uint64_t>(shard_bytes()), chunk_bytes) >
      kMaxChunksPerVersion) {
    return InvalidArgument("too many chunks per shard; raise the chunk size");
  }
  if (rounds < 1 || rounds > 1000)
    return InvalidArgument("rounds must be in [1, 1000]");
  if (!(step_s >= 0) || step_s > 1e6)
    return InvalidArgument("step must be in [0, 1e6] s");
  if (max_sources < 1 || max_sources > 16)
    return InvalidArgument("max sources in [1, 16]");
  if (trainer_copies < 1) return InvalidArgument("trainer copies must be >= 1");
  if (!(refresh_s >= 0) || !(fetch_timeout_s > 0)) {
    return InvalidArgument("refresh interval >= 0 and fetch timeout > 0");
  }
  if (!(arrival_spread_s >= 0 && arrival_spread_s <= step_s)) {
    return InvalidArgument("arrival spread must be in [0, step]");
  }
  if (!(spot_fraction >= 0 && spot_fraction < 1)) {
    return InvalidArgument("spot fraction must be in [0, 1)");
  }
  if (!(spot_life_min_steps > 0 &&
        spot_life_max_steps >= spot_life_min_steps)) {
    return InvalidArgument("spot lifetime: 0 < min <= max");
  }
  return Status::Ok();
}

double WorkloadConfig::shard_bytes() const {
  // Whole bf16 elements per shard.
  return std::floor(model_bytes / tp / 2) * 2;
}

double WorkloadConfig::LowerBoundS() const {
  Cluster c(cluster, 1, remote_gpus() > 0 ? 1 : 0);
  double lb = shard_bytes() / c.nic_bytes_per_s();
  if (remote_gpus() > 0)
    lb = std::max(lb, shard_bytes() * tp / c.wan_bytes_per_s());
  return std::max(lb, RackBoundS());
}

double WorkloadConfig::NicBoundS() const {
  return shard_bytes() / Cluster(cluster, 1, 0).nic_bytes_per_s();
}

double WorkloadConfig::RackBoundS() const {
  if (!(cluster.rack_oversub > 0)) return 0;
  // The layout RunWorkload builds: trainer GPU r publishes shard r;
  // rollout GPU g needs shard (g - trainer_gpus) % tp.
  const Cluster c(cluster, trainer_gpus + rollout_gpus - remote_gpus(),
                  remote_gpus());
  std::map<int, std::set<int>> need, have;
  for (int r = 0; r < tp; ++r) have[c.rack(r)].insert(r);
  for (int g = trainer_gpus; g < c.num_gpus(); ++g) {
    need[c.rack(g)].insert((g - trainer_gpus) % tp);
  }
  // Every shard a rack needs and does not hold enters through its uplink
  // at least once; every shard it holds that another rack needs leaves
  // through it at least once.
  size_t most = 0;
  for (const auto& [rack, shards] : need) {
    size_t in = 0;
    for (int s : shards) in += have[rack].count(s) == 0 ? 1 : 0;
    most = std::max(most, in);
  }
  for (const auto& [rack, shards] : have) {
    size_t out = 0;
    for (int s : shards) {
      for (const auto& [other, wanted] : need) {
        if (other != rack && wanted.count(s) > 0) {
          ++out;
          break;
        }
      }
    }
    most = std::max(most, out);
  }
  const double uplink = c.nic_bytes_per_s() * cluster.gpus_per_node *
                        cluster.nodes_per_rack / cluster.rack_oversub;
  return static_cast<double>(most) * shard_bytes() / uplink;
}

namespace {

constexpr uint64_t kMaxFailedFetches = 10000;

// The hub is told what its operator would tell it: how oversubscribed the
// racks' uplinks are.
hub::HubConfig HubConfigFor(const WorkloadConfig& c) {
  hub::HubConfig config;
  if (!c.hub_idle_first) config.rack_oversubscription = c.cluster.rack_oversub;
  return config;
}

class Driver {
 public:
  Driver(const WorkloadConfig& c, System system)
      : c_(c),
        system_(system),
        cluster_(c.cluster, c.trainer_gpus + c.rollout_gpus - c.remote_gpus(),
                 c.remote_gpus()),
        engine_(cluster_),
        hub_(HubConfigFor(c)),
        rng_(c.seed) {}

  Result<RunResult> Run() {
    auto t0 = std::chrono::steady_clock::now();
    result_.system = system_;
    result_.rounds = c_.rounds;
    shard_ = c_.shard_bytes();
    lag_ = (system_ == System::kRing || system_ == System::kTree)
               ? static_cast<double>(c_.segment_bytes)
               : static_cast<double>(c_.chunk_bytes);
    if (IsTh() && c_.cut_through_bytes > 0 &&
        c_.cut_through_bytes < c_.chunk_bytes) {
      lag_ = static_cast<double>(c_.cut_through_bytes);
    }
    engine_.on_done = [this](int f) { OnFetchDone(f); };
    engine_.on_source_lost = [this](int f, int gpu) { OnSourceLost(f, gpu); };
    gpus_.resize(static_cast<size_t>(cluster_.num_gpus()));
    for (int r = 0; r < c_.tp; ++r) {
      manifests_.push_back(ShardManifest());
      TH_RETURN_IF_ERROR(manifests_.back().Validate());
      digests_.push_back(manifests_.back().Digest());
    }
    for (int g = 0; g < c_.trainer_gpus; ++g)
      TH_RETURN_IF_ERROR(Register(g, false));
    const int instances = c_.rollout_gpus / c_.tp;
    const int spot = static_cast<int>(std::floor(instances * c_.spot_fraction));
    std::uniform_real_distribution<double> join_at(
        0, c_.rounds * std::max(c_.step_s, 1.0));
    std::uniform_real_distribution<double> life(
        c_.spot_life_min_steps * c_.step_s, c_.spot_life_max_steps * c_.step_s);
    for (int i = 0; i < instances; ++i) {
      Instance in;
      in.first_gpu = c_.trainer_gpus + i * c_.tp;
      in.spot = i >= instances - spot;
      instances_.push_back(in);
    }
    for (int i = 0; i < instances; ++i) {
      Instance& in = instances_[static_cast<size_t>(i)];
      if (!in.spot) {
        in.present = true;
        for (int j = 0; j < c_.tp; ++j)
          TH_RETURN_IF_ERROR(Register(in.first_gpu + j, false));
        continue;
      }
      double join = join_at(rng_);
      double leave = join + life(rng_);
      engine_.At(join, [this, i] { Join(i); });
      engine_.At(leave, [this, i] { LeaveInstance(i); });
    }
    // Every instance starts with version 0 (loaded at start-up); version 1
    // is the first update.
    engine_.At(0, [this] { Publish(); });
    Status s = engine_.Run(1e12);
    if (!error_.ok()) return error_;
    TH_RETURN_IF_ERROR(s);
    Finish();
    result_.events = engine_.steps();
    result_.wall_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    return result_;
  }

 private:
  struct Gpu {
    int held = 0;          // version it holds completely (0: the initial one)
    int fetch = -1;        // running fetch
    int fetching = 0;      // version of the running fetch
    std::set<int> failed;  // sources that failed the running fetch
    double last_refresh = -1e18;
    bool refresh_pending = false;
    bool registered = false;
  };
  struct Instance {
    int first_gpu = 0;
    bool spot = false;
    bool present = false;
    bool left = false;
    int target = 0;          // version it is fetching towards
    double wait_start = -1;  // -1: not waiting
    bool joining = false;    // its first fetch after joining
    bool arriving = false;   // its batch is still running; it asks later
    double join_s = 0;
  };
  struct Round {
    double publish_s = 0;
    int shards_released = 0;
    double released_s = 0;
    std::vector<int> pending;    // per shard: regular fetches not done (p2p)
    std::vector<int> root_kids;  // per shard: trainer's children not done
    int regular_total = 0;
    double last_regular_done_s = 0;
    double last_arrival_s = 0;  // after publish_s
  };

  Manifest ShardManifest() const {
    PartLayout p;
    p.rank = 0;
    uint64_t bytes = static_cast<uint64_t>(shard_);
    // `tensors` tensors of whole bf16 elements (MoE-like models: many
    // small ones, packed back to back into the chunks as the client packs
    // them); the last takes the rest.
    const uint64_t elems = bytes / 2;
    const uint64_t n = static_cast<uint64_t>(c_.tensors);
    uint64_t offset = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t e = i + 1 < n ? elems / n : elems - (n - 1) * (elems / n);
      TensorLayout t;
      t.spec =
          TensorSpec{n == 1 ? "w" : "w" + std::to_string(i), DType::kBF16, {e}};
      t.offset = offset;
      t.bytes = e * 2;
      offset += t.bytes;
      p.tensors.push_back(t);
    }
    p.part_bytes = bytes;
    p.chunk_xxh3.assign(ChunksFor(bytes, c_.chunk_bytes), 0);
    return Manifest(1, c_.chunk_bytes, {p});
  }
  static std::string Model(int shard) {
    return "policy.tp" + std::to_string(shard);
  }
  static WorkerId Id(int gpu) { return WorkerId("g" + std::to_string(gpu)); }
  static int GpuOf(const WorkerId& id) {
    return std::stoi(id.value().substr(1));
  }
  int64_t NowMs() const { return static_cast<int64_t>(engine_.now() * 1000); }
  int ShardOf(int gpu) const { return (gpu - c_.trainer_gpus) % c_.tp; }
  int InstanceOf(int gpu) const { return (gpu - c_.trainer_gpus) / c_.tp; }
  int Obj(int version, int shard) const {
    return objs_[static_cast<size_t>(version - 1)][static_cast<size_t>(shard)];
  }
  bool IsTh() const { return system_ == System::kTensorHub; }
  bool IsCollective() const {
    return system_ == System::kRing || system_ == System::kTree;
  }
  void Fail(Status s) {
    if (error_.ok()) error_ = std::move(s);
  }

  Status Register(int gpu, bool spot) {
    Gpu& g = gpus_[static_cast<size_t>(gpu)];
    g.registered = true;
    if (!IsTh()) return Status::Ok();
    hub::WorkerRegistration reg;
    reg.requested_id = Id(gpu);
    reg.data_address = "sim:" + std::to_string(gpu);
    reg.labels = {cluster_.DcLabel(gpu), cluster_.RackLabel(gpu),
                  cluster_.HostLabel(gpu)};
    reg.worker_class = spot ? WorkerClass::kSpot : WorkerClass::kReliable;
    Result<WorkerId> id = hub_.RegisterWorker(reg, NowMs());
    return id.ok() ? Status::Ok() : id.status();
  }

  // TensorHub: each shard's trainer publishes version v at the hub. False
  // (after Fail) if the hub refused or did not commit it.
  bool PublishToHub(int v) {
    for (int r = 0; r < c_.tp; ++r) {
      hub::PublishArgs a;
      a.worker = Id(r);
      a.model = Model(r);
      a.version = Version(static_cast<uint64_t>(v));
      a.rank = 0;
      a.group_size = 1;
      a.chunk_bytes = c_.chunk_bytes;
      a.part = manifests_[static_cast<size_t>(r)].parts()[0];
      a.epoch = ++epoch_;
      Result<VersionState> st = hub_.Publish(a, NowMs());
      if (!st.ok()) {
        Fail(st.status().WithContext("sim: publish"));
        return false;
      }
      if (*st != VersionState::kCommitted) {
        Fail(Internal("sim: version not committed"));
        return false;
      }
    }
    return true;
  }

  // Who fetches at publish time, in a seeded order (the order in which
  // their Schedule calls reach the hub).
  std::vector<int> FetchOrder() {
    std::vector<int> order;
    for (size_t i = 0; i < instances_.size(); ++i) {
      const Instance& in = instances_[i];
      if (in.present && in.wait_start < 0 && !in.arriving)
        order.push_back(static_cast<int>(i));
    }
    std::shuffle(order.begin(), order.end(), rng_);
    return order;
  }

  // The trainer publishes the next version; every present instance fetches it.
  void Publish() {
    const int v = ++latest_;
    std::vector<int> objs;
    for (int r = 0; r < c_.tp; ++r)
      objs.push_back(engine_.AddObject(shard_, lag_));
    objs_.push_back(objs);
    Round rd;
    rd.publish_s = engine_.now();
    rd.pending.assign(static_cast<size_t>(c_.tp), 0);
    rd.root_kids.assign(static_cast<size_t>(c_.tp), 0);
    rounds_.push_back(rd);
    // The new version first: dropping the old one below makes its readers
    // start over on the newest at once.
    for (int r = 0; r < c_.tp; ++r) engine_.SetComplete(r, Obj(v, r));
    if (v > 1 && !IsTh()) {
      for (int r = 0; r < c_.tp; ++r)
        engine_.Drop(r, Obj(v - 1, r));  // replaced in place
    }
    if (IsTh() && !PublishToHub(v)) return;
    std::vector<int> order = FetchOrder();
    // Each instance needs the version when its current batch ends.
    std::vector<double> arrive(order.size(), 0.0);
    if (c_.arrival_spread_s > 0) {
      std::uniform_real_distribution<double> spread(0, c_.arrival_spread_s);
      for (double& a : arrive) a = spread(rng_);
    }
    Round& cur = rounds_.back();
    cur.regular_total = static_cast<int>(order.size());
    for (double a : arrive)
      cur.last_arrival_s = std::max(cur.last_arrival_s, a);
    if (system_ == System::kRing || system_ == System::kTree) {
      // A static group: chains/trees per shard over the instances in rank
      // order, started when the last member arrives (each waits from its
      // own arrival on).
      double last = 0;
      for (size_t k = 0; k < order.size(); ++k) {
        Instance& in = instances_[static_cast<size_t>(order[k])];
        in.target = v;
        in.wait_start = engine_.now() + arrive[k];
        last = std::max(last, arrive[k]);
      }
      std::sort(order.begin(), order.end());
      engine_.At(engine_.now() + last,
                 [this, v, order] { StartCollective(v, order); });
    } else {
      for (size_t k = 0; k < order.size(); ++k) {
        const int i = order[k];
        for (int r = 0; r < c_.tp; ++r) {
          ++cur.pending[static_cast<size_t>(r)];
          counted_.insert(
              {instances_[static_cast<size_t>(i)].first_gpu + r, v});
        }
        if (arrive[k] <= 0) {
          Want(i, v);
          continue;
        }
        instances_[static_cast<size_t>(i)].arriving = true;
        engine_.At(engine_.now() + arrive[k], [this, i, v] {
          Instance& in = instances_[static_cast<size_t>(i)];
          in.arriving = false;
          if (in.present) Want(i, v);
        });
      }
      if (order.empty()) {
        for (int r = 0; r < c_.tp; ++r) MaybeRelease(v, r);
      }
    }
  }

  void StartCollective(int v, const std::vector<int>& order) {
    Round& cur = rounds_[static_cast<size_t>(v - 1)];
    for (int r = 0; r < c_.tp; ++r) {
      // rank 0 = the trainer GPU of shard r, rank k = instance order[k-1].
      auto gpu_of = [&](size_t rank) {
        return rank == 0 ? r
                         : instances_[static_cast<size_t>(order[rank - 1])]
                                   .first_gpu +
                               r;
      };
      for (size_t k = 1; k <= order.size(); ++k) {
        size_t parent = system_ == System::kRing ? k - 1 : (k & (k - 1));
        if (system_ == System::kTree) {
          // Binomial tree: clear the highest set bit.
          size_t hb = 1;
          while (hb * 2 <= k) hb *= 2;
          parent = k - hb;
        }
        if (parent == 0) ++cur.root_kids[static_cast<size_t>(r)];
        StartGpuFetch(gpu_of(k), v, {gpu_of(parent)});
      }
      if (order.empty()) MaybeRelease(v, r);
    }
  }

  // Instance i needs version v (or the newest when it gets there).
  void Want(int i, int v) {
    // Point-to-point pulls from the trainer, which holds only the newest.
    if (system_ == System::kPointToPoint) v = latest_;
    Instance& in = instances_[static_cast<size_t>(i)];
    if (in.wait_start < 0) in.wait_start = engine_.now();
    in.target = v;
    for (int j = 0; j < c_.tp; ++j) {
      int gpu = in.first_gpu + j;
      const Gpu& g = gpus_[static_cast<size_t>(gpu)];
      if (g.held >= v || (g.fetch >= 0 && g.fetching >= v)) continue;
      if (g.fetch >= 0) continue;  // finishes its current fetch first
      std::vector<int> src;
      if (!IsTh()) src = {j};  // the trainer GPU of this shard
      StartGpuFetch(gpu, v, src);
    }
  }

  void StartGpuFetch(int gpu, int v, std::vector<int> sources) {
    Gpu& g = gpus_[static_cast<size_t>(gpu)];
    const int r = gpu < c_.trainer_gpus ? gpu : ShardOf(gpu);
    const int obj = Obj(v, r);
    // The real client first unpublishes (fences, drains) what it served
    // from the same buffers: the version it held.
    if (g.held > 0) {
      if (IsTh()) {
        Status s = hub_.Unpublish(
            Id(gpu), Model(r), Version(static_cast<uint64_t>(g.held)), NowMs());
        if (!s.ok() && s.code() != StatusCode::kNotFound) return Fail(s);
      }
      engine_.Drop(gpu, Obj(g.held, r));
      g.held = 0;
    }
    g.failed.clear();
    g.last_refresh = -1e18;
    if (IsTh()) {
      Status s = Report(gpu, r, v, /*filling=*/true);
      if (!s.ok()) return Fail(s.WithContext("sim: AddHolder filling"));
      Result<std::vector<int>> src = Schedule(gpu, r, v, {});
      g.last_refresh = engine_.now();
      if (src.ok()) {
        sources = *src;
      } else if (src.status().code() != StatusCode::kUnavailable) {
        return Fail(src.status().WithContext("sim: first schedule"));
      }
      // UNAVAILABLE: no full copy is left (its holders left); the fetcher
      // asks the hub again until a holder appears or its deadline.
    }
    Result<int> f = engine_.StartFetch(gpu, obj, sources);
    if (!f.ok()) return Fail(f.status());
    g.fetch = *f;
    g.fetching = v;
    if (IsTh() && sources.empty()) ScheduleRefresh(gpu);
    if (IsTh()) MaybeRecheck(gpu);
    for (int s : sources) {
      if (cluster_.dc(s) != cluster_.dc(gpu)) {
        ++result_.wan_fetches;
        break;
      }
    }
  }

  // What the real client reports after it resolved the version: the
  // manifest by its digest (O(log N) at the hub), the whole manifest only
  // when the hub has none to compare with.
  Status Report(int gpu, int r, int v, bool filling) {
    const uint64_t epoch = ++epoch_;
    Result<bool> by_digest = hub_.AddHolderByDigest(
        Id(gpu), Model(r), Version(static_cast<uint64_t>(v)), epoch,
        digests_[static_cast<size_t>(r)], NowMs(), filling);
    if (!by_digest.ok()) return by_digest.status();
    if (*by_digest) return Status::Ok();
    return hub_.AddHolder(Id(gpu), Model(r), Version(static_cast<uint64_t>(v)),
                          epoch, manifests_[static_cast<size_t>(r)], NowMs(),
                          filling);
  }

  Result<std::vector<int>> Schedule(int gpu, int r, int v,
                                    const std::set<int>& failed) {
    std::set<WorkerId> exclude;
    for (int f : failed) exclude.insert(Id(f));
    ++result_.schedule_calls;
    auto s = hub_.Schedule(Id(gpu), Model(r), Version(static_cast<uint64_t>(v)),
                           exclude, static_cast<size_t>(c_.max_sources));
    if (!s.ok() && s.status().code() == StatusCode::kUnavailable &&
        !exclude.empty()) {
      // As the client does: every holder left failed once; ask again.
      ++result_.schedule_calls;
      s = hub_.Schedule(Id(gpu), Model(r), Version(static_cast<uint64_t>(v)),
                        {}, static_cast<size_t>(c_.max_sources));
    }
    if (!s.ok()) return s.status();
    std::vector<int> out;
    for (const hub::HolderView& h : *s) out.push_back(GpuOf(h.worker));
    return out;
  }

  // What the client does when the hub names a time to recheck its sources
  // (HubState::RecheckAfterMs): asks again then (Recheck), and reads from
  // exactly what the hub answers.
  void MaybeRecheck(int gpu) {
    const Gpu& g = gpus_[static_cast<size_t>(gpu)];
    if (g.fetch < 0) return;
    const int64_t ms =
        hub_.RecheckAfterMs(Id(gpu), Model(ShardOf(gpu)),
                            Version(static_cast<uint64_t>(g.fetching)));
    if (ms <= 0) return;
    const int fetch = g.fetch;
    engine_.At(engine_.now() + static_cast<double>(ms) / 1000,
               [this, gpu, fetch] { Recheck(gpu, fetch); });
  }

  void Recheck(int gpu, int fetch) {
    Gpu& g = gpus_[static_cast<size_t>(gpu)];
    if (g.fetch != fetch || !engine_.fetch(fetch).active) return;
    ++result_.recheck_calls;
    auto s = hub_.Recheck(Id(gpu), Model(ShardOf(gpu)),
                          Version(static_cast<uint64_t>(g.fetching)),
                          static_cast<size_t>(c_.max_sources));
    if (!s.ok()) {
      if (s.status().code() == StatusCode::kUnavailable) return;
      return Fail(s.status().WithContext("sim: recheck"));
    }
    std::vector<int> src;
    for (const hub::HolderView& h : *s) src.push_back(GpuOf(h.worker));
    Status st = engine_.ReplaceSources(fetch, src);
    if (!st.ok()) return Fail(st);
    MaybeRecheck(gpu);
  }

  void OnSourceLost(int f, int lost) {
    ++result_.source_losses;
    // Copies: callbacks below may start fetches (and move engine storage).
    const int gpu = engine_.fetch(f).gpu;
    const int obj = engine_.fetch(f).obj;
    Gpu& g = gpus_[static_cast<size_t>(gpu)];
    if (g.fetch != f) return;
    g.failed.insert(lost);
    if (engine_.live_sources(f) > 0) return;  // the other streams go on
    if (!IsTh()) {
      // Point-to-point: the trainer replaced the version; start over on the
      // newest.
      g.fetch = -1;
      engine_.Drop(gpu, obj);
      Want(InstanceOf(gpu), latest_);
      return;
    }
    ScheduleRefresh(gpu);
  }

  void ScheduleRefresh(int gpu) {
    Gpu& g = gpus_[static_cast<size_t>(gpu)];
    if (g.refresh_pending) return;
    g.refresh_pending = true;
    double at = std::max(engine_.now(), g.last_refresh + c_.refresh_s);
    engine_.At(at, [this, gpu] { Refresh(gpu); });
  }

  void Refresh(int gpu) {
    Gpu& g = gpus_[static_cast<size_t>(gpu)];
    g.refresh_pending = false;
    if (g.fetch < 0) return;
    const SimFetch& sf = engine_.fetch(g.fetch);
    if (!sf.active || engine_.live_sources(g.fetch) > 0) return;
    g.last_refresh = engine_.now();
    const int r = ShardOf(gpu);
    Result<std::vector<int>> src = Schedule(gpu, r, g.fetching, g.failed);
    if (src.ok()) {
      Status s = engine_.AddSources(g.fetch, *src);
      if (!s.ok()) Fail(s);
      MaybeRecheck(gpu);
      return;
    }
    if (engine_.now() - sf.start_s < c_.fetch_timeout_s &&
        src.status().code() == StatusCode::kUnavailable) {
      ScheduleRefresh(gpu);
      return;
    }
    // The fetch fails: the client revokes its filling registration, and
    // the instance asks for the newest version again.
    if (++result_.failed_fetches > kMaxFailedFetches) {
      return Fail(Unavailable("sim: more than " +
                              std::to_string(kMaxFailedFetches) +
                              " fetches failed; no holder left?"));
    }
    (void)hub_.Unpublish(Id(gpu), Model(r),
                         Version(static_cast<uint64_t>(g.fetching)), NowMs());
    const int obj = sf.obj;
    g.fetch = -1;
    engine_.Drop(gpu, obj);
    Want(InstanceOf(gpu), latest_);
  }

  void OnFetchDone(int f) {
    const SimFetch& sf = engine_.fetch(f);
    const int gpu = sf.gpu;
    Gpu& g = gpus_[static_cast<size_t>(gpu)];
    const int v = g.fetching;
    const int r = ShardOf(gpu);
    g.fetch = -1;
    g.held = v;
    if (IsTh()) {
      Status s = Report(gpu, r, v, /*filling=*/false);
      if (!s.ok()) return Fail(s.WithContext("sim: AddHolder full"));
      // The retention guarantee rests on reliable holders: a spot copy
      // does not free the trainer.
      if (!instances_[static_cast<size_t>(InstanceOf(gpu))].spot)
        ++copies_[{v, r}];
    }
    const int i = InstanceOf(gpu);
    Instance& in = instances_[static_cast<size_t>(i)];
    Round& rd = rounds_[static_cast<size_t>(v - 1)];
    if (counted_.erase({gpu, v}) > 0) --rd.pending[static_cast<size_t>(r)];
    if (system_ == System::kRing || system_ == System::kTree) {
      for (int s : sf.used) {
        if (s == r) --rd.root_kids[static_cast<size_t>(r)];
      }
    }
    MaybeRelease(v, r);
    if (in.present && v < in.target && !IsCollective()) {
      // It finished an older version while the instance moved on: fetch
      // the one the instance waits for.
      Want(i, in.target);
      return;
    }
    // Instance done when all its GPUs hold the target version.
    for (int j = 0; j < c_.tp; ++j) {
      if (gpus_[static_cast<size_t>(in.first_gpu + j)].held < in.target) return;
    }
    if (in.target < latest_ && (IsTh() || system_ == System::kPointToPoint)) {
      Want(i, latest_);  // a newer one came out meanwhile
      return;
    }
    double wait = engine_.now() - in.wait_start;
    result_.rollout_stall_gpu_s += wait * c_.tp;
    if (in.joining) {
      ++result_.joiners;
      joiner_waits_.push_back(wait);
      in.joining = false;
    } else {
      regular_waits_.push_back(wait);
      rd.last_regular_done_s =
          std::max(rd.last_regular_done_s, engine_.now() - rd.publish_s);
    }
    in.wait_start = -1;
  }

  // The trainer GPU of shard r may modify its buffers again.
  void MaybeRelease(int v, int r) {
    Round& rd = rounds_[static_cast<size_t>(v - 1)];
    if (released_.count({v, r})) return;
    bool ok = false;
    switch (system_) {
      case System::kTensorHub:
        ok = copies_[{v, r}] >= c_.trainer_copies || rd.regular_total == 0;
        break;
      case System::kPointToPoint:
        ok = rd.pending[static_cast<size_t>(r)] == 0;
        break;
      case System::kRing:
      case System::kTree:
        ok = rd.root_kids[static_cast<size_t>(r)] == 0;
        break;
    }
    if (!ok) return;
    released_.insert({v, r});
    if (IsTh()) {
      // Unpublish: fence, and the hub stops routing readers here; readers
      // still reading from it move to other holders.
      Status s = hub_.Unpublish(Id(r), Model(r),
                                Version(static_cast<uint64_t>(v)), NowMs());
      if (!s.ok()) return Fail(s.WithContext("sim: trainer unpublish"));
      engine_.Drop(r, Obj(v, r));
    }
    rd.released_s = std::max(rd.released_s, engine_.now());
    if (++rd.shards_released == c_.tp) {
      double blocked = engine_.now() - rd.publish_s;
      trainer_blocked_.push_back(blocked);
      result_.trainer_stall_gpu_s += blocked * c_.trainer_gpus;
      if (latest_ < c_.rounds)
        engine_.At(engine_.now() + c_.step_s, [this] { Publish(); });
    }
  }

  void Join(int i) {
    Instance& in = instances_[static_cast<size_t>(i)];
    in.present = true;
    in.joining = true;
    in.join_s = engine_.now();
    for (int j = 0; j < c_.tp; ++j) {
      Status s = Register(in.first_gpu + j, true);
      if (!s.ok()) return Fail(s);
    }
    if (latest_ >= 1)
      Want(i, latest_);
    else
      in.joining = false;
  }

  void LeaveInstance(int i) {
    Instance& in = instances_[static_cast<size_t>(i)];
    if (!in.present) return;
    in.present = false;
    in.left = true;
    if (in.wait_start >= 0) {
      if (in.joining) ++result_.joiners_left_early;
      in.wait_start = -1;
    }
    for (int j = 0; j < c_.tp; ++j) {
      int gpu = in.first_gpu + j;
      Gpu& g = gpus_[static_cast<size_t>(gpu)];
      if (IsTh()) (void)hub_.Leave(Id(gpu));
      if (g.fetch >= 0) engine_.Drop(gpu, engine_.fetch(g.fetch).obj);
      if (g.held > 0) engine_.Drop(gpu, Obj(g.held, ShardOf(gpu)));
      g.fetch = -1;
      g.held = 0;
    }
  }

  void Finish() {
    auto mean = [](const std::vector<double>& v) {
      double s = 0;
      for (double x : v) s += x;
      return v.empty() ? 0.0 : s / static_cast<double>(v.size());
    };
    double up = 0, upmax = 0;
    for (const Round& rd : rounds_) {
      up += rd.last_regular_done_s;
      result_.last_arrival_s +=
          rd.last_arrival_s / static_cast<double>(rounds_.size());
      upmax = std::max(upmax, rd.last_regular_done_s);
    }
    result_.update_s =
        rounds_.empty() ? 0 : up / static_cast<double>(rounds_.size());
    result_.update_max_s = upmax;
    result_.trainer_blocked_s = mean(trainer_blocked_);
    result_.regular_wait_mean_s = mean(regular_waits_);
    result_.joiner_wait_mean_s = mean(joiner_waits_);
    for (double w : joiner_waits_)
      result_.joiner_wait_max_s = std::max(result_.joiner_wait_max_s, w);
    if (static_cast<int>(trainer_blocked_.size()) != c_.rounds) {
      Fail(Internal("sim: only " + std::to_string(trainer_blocked_.size()) +
                    " of " + std::to_string(c_.rounds) +
                    " versions released the trainer"));
    }
  }

  const WorkloadConfig c_;
  const System system_;
  Cluster cluster_;
  Engine engine_;
  hub::HubState hub_;
  std::mt19937_64 rng_;
  double shard_ = 0;
  double lag_ = 0;
  std::vector<Manifest> manifests_;
  std::vector<ManifestDigest> digests_;  // manifests_[r].Digest()
  std::vector<Gpu> gpus_;
  std::vector<Instance> instances_;
  std::vector<Round> rounds_;
  std::vector<std::vector<int>> objs_;
  std::map<std::pair<int, int>, int> copies_;
  std::set<std::pair<int, int>> released_;
  std::set<std::pair<int, int>>
      counted_;  // (gpu, version) the trainer serves (p2p)
  std::vector<double> trainer_blocked_, regular_waits_, joiner_waits_;
  int latest_ = 0;
  uint64_t epoch_ = 0;
  Status error_;
  RunResult result_;
};

}  // namespace

Result<RunResult> RunWorkload(const WorkloadConfig& config, System system) {
  TH_RETURN_IF_ERROR(config.Validate());
  if (config.spot_fraction > 0 &&
      (system == System::kRing || system == System::kTree)) {
    return InvalidArgument(
        "a static broadcast group cannot take spot joiners; "
        "elastic runs compare tensorhub with p2p");
  }
  Driver d(config, system);
  return d.Run();
}

}  // namespace tensorhub::sim
