// A fluid, event-driven model of chunked transfers between GPUs.
//
// An *object* is one version of one shard (bytes, and the store-and-forward
// lag: one chunk, or one broadcast segment). A GPU *holds* an object
// completely (a trainer, a finished reader) or is *filling* it (a fetch in
// progress, serving what it has). A fetch pulls from a set of sources, one
// flow per source; all flows share every link they cross max-min fairly.
// A flow from a filling source is gated: the reader's progress stays at
// least one lag behind the source's (a chunk is served only once it has
// fully arrived), so a reader fed by a filling holder is capped by the
// holder's progress.
//
// Rates are recomputed at every event (a fetch completes, a gate opens or
// closes, a timer fires, sources change). Single-threaded; callbacks run on
// the caller's thread inside Run() and may call back into the engine.
#ifndef TENSORHUB_SIM_ENGINE_H_
#define TENSORHUB_SIM_ENGINE_H_

#include <cstdint>
#include <functional>
#include <queue>
#include <unordered_map>
#include <vector>

#include "sim/cluster.h"
#include "sim/maxmin.h"
#include "tensorhub/status.h"

namespace tensorhub::sim {

struct SimFetch {
  int gpu = 0;
  int obj = 0;
  double have_bytes = 0;
  double size_bytes = 0;
  double lag_bytes = 0;
  double start_s = 0;
  double end_s = -1;
  double in_rate = 0;   // bytes/s, sum of its flows
  bool active = false;  // receiving (false once done or cancelled)
  bool done = false;
  std::vector<int> flows;  // live flow ids
  std::vector<int> used;   // every source GPU it was given
};

class Engine {
 public:
  explicit Engine(const Cluster& cluster);

  double now() const { return now_; }
  const Cluster& cluster() const { return cluster_; }
  uint64_t steps() const { return steps_; }
  uint64_t rate_computations() const { return rate_computations_; }

  int AddObject(double bytes, double lag_bytes);
  double object_bytes(int obj) const {
    return objects_[static_cast<size_t>(obj)].bytes;
  }
  // `gpu` holds all of `obj` (a trainer that published it).
  void SetComplete(int gpu, int obj);
  bool Holds(int gpu, int obj) const;
  bool HoldsComplete(int gpu, int obj) const;

  // `gpu` starts receiving `obj` (it must not hold it) from `sources`, which
  // must hold it (complete or filling). It is filling from now on.
  Result<int> StartFetch(int gpu, int obj, const std::vector<int>& sources);
  // More sources for a running fetch; ones it already uses are skipped.
  Status AddSources(int fetch, const std::vector<int>& sources);
  // The running fetch reads from exactly `sources` from now on: flows from
  // others stop (what it got from them stays), new ones start.
  Status ReplaceSources(int fetch, const std::vector<int>& sources);
  int live_sources(int fetch) const {
    return static_cast<int>(fetches_[static_cast<size_t>(fetch)].flows.size());
  }
  const SimFetch& fetch(int id) const {
    return fetches_[static_cast<size_t>(id)];
  }

  // `gpu` stops holding `obj` (unpublish, leave). Its own fetch of it, if
  // running, is cancelled; readers it fed lose it as a source.
  void Drop(int gpu, int obj);

  // Runs `fn` at time `t_s` (not before now).
  void At(double t_s, std::function<void()> fn);

  // Runs events until nothing is scheduled or moving, or `until_s`.
  // RESOURCE_EXHAUSTED past `max_steps` events (a runaway model).
  Status Run(double until_s, uint64_t max_steps = 200'000'000);

  std::function<void(int fetch)> on_done;
  std::function<void(int fetch, int lost_gpu)> on_source_lost;

 private:
  struct Object {
    double bytes = 0;
    double lag = 0;
  };
  struct Holding {
    int fetch = -1;        // the fetch filling it; -1 once complete
    std::vector<int> out;  // flows it feeds (some may be dead)
  };
  struct Flow {
    int reader = 0;  // fetch id
    int src_gpu = 0;
    int src_fetch = -1;  // the source's own fetch while it fills
    FlowLinks links;
    double rate = 0;
    double cap = kNoCap;
    uint8_t gate = 0;  // 0 free/ungated, 1 tied, 2 blocked
    bool live = false;
  };
  struct Timer {
    double t;
    uint64_t seq;
    bool operator>(const Timer& o) const {
      return t != o.t ? t > o.t : seq > o.seq;
    }
  };
  static uint64_t Key(int gpu, int obj) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(gpu)) << 32) |
           static_cast<uint32_t>(obj);
  }
  void AddFlow(int fetch, int src_gpu, Holding& src);
  void KillFlow(int f);
  void ComputeRates();
  void Correct();
  double NextFlowDt() const;
  void Advance(double dt);
  void Complete(int fetch);

  const Cluster& cluster_;
  double now_ = 0;
  uint64_t steps_ = 0;
  uint64_t rate_computations_ = 0;
  bool dirty_ = true;
  std::vector<Object> objects_;
  std::unordered_map<uint64_t, Holding> holdings_;
  std::vector<SimFetch> fetches_;
  std::vector<int> active_;  // active fetch ids, ascending
  std::vector<Flow> flows_;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;
  std::unordered_map<uint64_t, std::function<void()>> timer_fns_;
  uint64_t next_timer_ = 0;
  // Scratch for rate computation.
  std::vector<int> af_;
  std::vector<FlowLinks> af_links_;
  std::vector<double> af_caps_;
  std::vector<double> af_rates_;
  MaxMinScratch mm_;
};

}  // namespace tensorhub::sim

#endif  // TENSORHUB_SIM_ENGINE_H_
