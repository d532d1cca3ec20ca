// Workloads on the simulated cluster, for TensorHub (driving the hub's real
// HubState: Publish, AddHolder, Schedule, Unpublish, Leave) and for the
// baselines modelled on the same links (point-to-point pulls from the
// trainer, ring and binomial-tree broadcast pipelined by segments).
//
// Model parallelism: a rollout instance is `tp` GPUs; GPU j of an instance
// needs shard j (model_bytes / tp). Shard j of each version is its own hub
// model ("policy.tp<j>"), published by trainer GPU j (group size 1), so
// readers of shard j pull the part of that rank only.
#ifndef TENSORHUB_SIM_WORKLOAD_H_
#define TENSORHUB_SIM_WORKLOAD_H_

#include <algorithm>
#include <cstdint>
#include <string>

#include "sim/cluster.h"
#include "tensorhub/status.h"

namespace tensorhub::sim {

enum class System { kTensorHub, kPointToPoint, kRing, kTree };
const char* SystemName(System s);

struct WorkloadConfig {
  ClusterConfig cluster;
  int trainer_gpus = 512;
  int rollout_gpus = 512;
  bool rollouts_remote = false;  // rollouts in datacenter 1, behind the WAN
  // Or only the last this many rollout GPUs there (the test bed's layout).
  int remote_rollout_gpus = 0;
  double model_bytes = 140e9;  // 70B parameters in bf16
  int tp = 8;                  // GPUs per rollout instance
  // Tensors per shard (equal sizes): 1 for a dense model's one flat
  // buffer; thousands for an MoE-like model of many small tensors, which
  // TensorHub packs into chunks and the broadcasts flatten into segments,
  // so the links see the same bytes (the hub sees a large manifest).
  int tensors = 1;
  uint64_t chunk_bytes = 4ull << 20;    // TensorHub's chunk (the default)
  uint64_t segment_bytes = 4ull << 20;  // broadcast pipelining segment
  // TensorHub's cut-through piece (FetcherOptions::cut_through_bytes, 256
  // KiB by default): a filling holder serves a chunk's bytes as they land,
  // so a hop of the pipeline lags one piece, not one chunk. 0: whole
  // chunks (the data plane before cut-through).
  uint64_t cut_through_bytes = 256ull << 10;
  int rounds = 2;      // versions published
  double step_s = 30;  // trainer compute between publishes
  // Each instance needs a new version when its batch ends: uniformly
  // spread over [0, this] after the publish (seeded). 0: all at once.
  double arrival_spread_s = 0;
  int max_sources = 4;  // FetchOptions::max_sources
  // The hub is told the racks' oversubscription (serve
  // --rack-oversubscription), unless this is set: then it ranks idle
  // holders first anyway, as a hub not told would.
  bool hub_idle_first = false;
  int trainer_copies = 1;  // TensorHub: full reliable copies before unpublish
  double refresh_s = 0.2;  // fetcher: between asks to the hub
  double fetch_timeout_s = 120;  // FetchOptions::timeout_ms
  // Elastic: this share of rollout instances are spot instances that join
  // at seeded times during the run and leave after a seeded lifetime.
  double spot_fraction = 0;
  double spot_life_min_steps = 1;
  double spot_life_max_steps = 3;
  uint64_t seed = 1;

  Status Validate() const;
  double shard_bytes() const;
  int remote_gpus() const {
    return rollouts_remote ? rollout_gpus : remote_rollout_gpus;
  }
  // Bandwidth lower bound on one update: every reader receives its shard
  // through its NIC (shard / NIC); across datacenters every shard crosses
  // the WAN once (model / WAN); every shard a rack needs enters it, and
  // every shard a rack publishes and another needs leaves it, through the
  // rack's uplink once (RackBoundS).
  double LowerBoundS() const;
  // The rack term alone: the most shards any rack must take in (or send
  // out) through its uplink, times the shard, over the uplink's rate. 0
  // without rack links (rack_oversub 0).
  double RackBoundS() const;
  // shard / NIC alone: no instance holds a version sooner than this after
  // it asked for it.
  double NicBoundS() const;
  // With arrival spread: max(LowerBoundS(), the last instance's arrival +
  // NicBoundS()).
  double ArrivalBoundS(double last_arrival_s) const {
    return std::max(LowerBoundS(), last_arrival_s + NicBoundS());
  }
};

struct RunResult {
  System system = System::kTensorHub;
  int rounds = 0;
  double update_s = 0;  // mean: publish -> last regular instance holds it
  double update_max_s = 0;
  double trainer_blocked_s = 0;  // mean per version
  double trainer_stall_gpu_s = 0;
  double rollout_stall_gpu_s = 0;
  // Mean over versions of the last regular instance's arrival (when it
  // asked for the version, after the publish): with arrival spread, no
  // update ends before this plus the lower bound.
  double last_arrival_s = 0;
  double regular_wait_mean_s = 0;  // per instance and update
  int joiners = 0;                 // spot instances that came to hold a version
  int joiners_left_early = 0;
  double joiner_wait_mean_s = 0;
  double joiner_wait_max_s = 0;
  uint64_t schedule_calls = 0;  // HubState::Schedule calls (TensorHub)
  uint64_t recheck_calls = 0;   // HubState::Recheck calls (TensorHub)
  uint64_t source_losses = 0;
  uint64_t failed_fetches = 0;
  uint64_t wan_fetches = 0;  // fetches that read across the WAN
  uint64_t events = 0;
  double wall_s = 0;
  double total_stall_gpu_s() const {
    return trainer_stall_gpu_s + rollout_stall_gpu_s;
  }
};

Result<RunResult> RunWorkload(const WorkloadConfig& config, System system);

}  // namespace tensorhub::sim

#endif  // TENSORHUB_SIM_WORKLOAD_H_
