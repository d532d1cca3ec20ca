#include "sim/engine.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "tensorhub/check.h"

namespace tensorhub::sim {
namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
// Gate tolerance in bytes: far below a chunk, far above rounding.
double GateEps(double lag) { return std::max(1.0, lag * 1e-4); }
}  // namespace

Engine::Engine(const Cluster& cluster) : cluster_(cluster) {}

int Engine::AddObject(double bytes, double lag_bytes) {
  objects_.push_back({bytes, lag_bytes});
  return static_cast<int>(objects_.size() - 1);
}

void Engine::SetComplete(int gpu, int obj) {
  Holding& h = holdings_[Key(gpu, obj)];
  h.fetch = -1;
}

bool Engine::Holds(int gpu, int obj) const {
  return holdings_.count(Key(gpu, obj)) > 0;
}

bool Engine::HoldsComplete(int gpu, int obj) const {
  auto it = holdings_.find(Key(gpu, obj));
  return it != holdings_.end() && it->second.fetch < 0;
}

Result<int> Engine::StartFetch(int gpu, int obj,
                               const std::vector<int>& sources) {
  if (obj < 0 || static_cast<size_t>(obj) >= objects_.size()) {
    return InvalidArgument("sim: unknown object " + std::to_string(obj));
  }
  if (Holds(gpu, obj)) {
    return FailedPrecondition("sim: gpu " + std::to_string(gpu) +
                              " already holds object " + std::to_string(obj));
  }
  SimFetch f;
  f.gpu = gpu;
  f.obj = obj;
  f.size_bytes = objects_[static_cast<size_t>(obj)].bytes;
  f.lag_bytes = objects_[static_cast<size_t>(obj)].lag;
  f.start_s = now_;
  f.active = true;
  fetches_.push_back(std::move(f));
  int id = static_cast<int>(fetches_.size() - 1);
  active_.push_back(id);  // ids grow: stays ascending
  holdings_[Key(gpu, obj)].fetch = id;
  TH_RETURN_IF_ERROR(AddSources(id, sources));
  dirty_ = true;
  return id;
}

Status Engine::AddSources(int id, const std::vector<int>& sources) {
  SimFetch& f = fetches_[static_cast<size_t>(id)];
  if (!f.active) return Status::Ok();
  for (int s : sources) {
    if (s == f.gpu) return Internal("sim: a fetch cannot read from itself");
    auto it = holdings_.find(Key(s, f.obj));
    if (it == holdings_.end()) {
      return Internal("sim: source gpu " + std::to_string(s) +
                      " does not hold object " + std::to_string(f.obj));
    }
    bool live = false;
    for (int fl : f.flows) live |= flows_[static_cast<size_t>(fl)].src_gpu == s;
    if (live) continue;
    if (std::find(f.used.begin(), f.used.end(), s) == f.used.end())
      f.used.push_back(s);
    AddFlow(id, s, it->second);
  }
  dirty_ = true;
  return Status::Ok();
}

Status Engine::ReplaceSources(int id, const std::vector<int>& sources) {
  SimFetch& f = fetches_[static_cast<size_t>(id)];
  if (!f.active) return Status::Ok();
  std::vector<int> flows = f.flows;
  for (int fl : flows) {
    const int src = flows_[static_cast<size_t>(fl)].src_gpu;
    if (std::find(sources.begin(), sources.end(), src) == sources.end()) {
      KillFlow(fl);
    }
  }
  return AddSources(id, sources);
}

void Engine::AddFlow(int fetch, int src_gpu, Holding& src) {
  Flow fl;
  fl.reader = fetch;
  fl.src_gpu = src_gpu;
  fl.src_fetch = src.fetch;
  fl.links = cluster_.Path(src_gpu, fetches_[static_cast<size_t>(fetch)].gpu);
  fl.live = true;
  flows_.push_back(fl);
  int id = static_cast<int>(flows_.size() - 1);
  src.out.push_back(id);
  fetches_[static_cast<size_t>(fetch)].flows.push_back(id);
}

void Engine::KillFlow(int f) {
  Flow& fl = flows_[static_cast<size_t>(f)];
  if (!fl.live) return;
  fl.live = false;
  fl.rate = 0;
  std::vector<int>& v = fetches_[static_cast<size_t>(fl.reader)].flows;
  v.erase(std::remove(v.begin(), v.end(), f), v.end());
  dirty_ = true;
}

void Engine::Drop(int gpu, int obj) {
  auto it = holdings_.find(Key(gpu, obj));
  if (it == holdings_.end()) return;
  Holding h = std::move(it->second);
  holdings_.erase(it);
  if (h.fetch >= 0) {
    SimFetch& own = fetches_[static_cast<size_t>(h.fetch)];
    if (own.active) {
      own.active = false;
      own.in_rate = 0;
      std::vector<int> in = own.flows;
      for (int f : in) KillFlow(f);
      active_.erase(std::remove(active_.begin(), active_.end(), h.fetch),
                    active_.end());
    }
  }
  std::vector<int> lost;
  for (int f : h.out) {
    Flow& fl = flows_[static_cast<size_t>(f)];
    if (!fl.live) continue;
    lost.push_back(fl.reader);
    KillFlow(f);
  }
  // Tell readers afterwards: the callback may change the engine.
  for (int r : lost) {
    if (on_source_lost && fetches_[static_cast<size_t>(r)].active)
      on_source_lost(r, gpu);
  }
  dirty_ = true;
}

void Engine::At(double t_s, std::function<void()> fn) {
  uint64_t seq = next_timer_++;
  timers_.push({std::max(t_s, now_), seq});
  timer_fns_.emplace(seq, std::move(fn));
}

void Engine::Correct() {
  // In fetch order a source's own fetch (older) is corrected before its
  // readers', so its inflow is final when a tied reader is capped by it.
  for (int id : active_) {
    SimFetch& r = fetches_[static_cast<size_t>(id)];
    double total = 0;
    for (int f : r.flows) total += flows_[static_cast<size_t>(f)].rate;
    for (int f : r.flows) {
      Flow& fl = flows_[static_cast<size_t>(f)];
      if (fl.gate != 1) continue;
      double h_in = fetches_[static_cast<size_t>(fl.src_fetch)].in_rate;
      double cap = std::max(0.0, h_in - (total - fl.rate));
      fl.cap = cap;
      if (fl.rate > cap) {
        total -= fl.rate - cap;
        fl.rate = cap;
      }
    }
    r.in_rate = total;
  }
}

void Engine::ComputeRates() {
  ++rate_computations_;
  af_.clear();
  for (int id : active_) {
    const SimFetch& r = fetches_[static_cast<size_t>(id)];
    for (int f : r.flows) {
      Flow& fl = flows_[static_cast<size_t>(f)];
      fl.gate = 0;
      fl.cap = kNoCap;
      if (fl.src_fetch >= 0) {
        const SimFetch& h = fetches_[static_cast<size_t>(fl.src_fetch)];
        double g = h.have_bytes - r.lag_bytes - r.have_bytes;
        double eps = GateEps(r.lag_bytes);
        if (g < -eps) {
          fl.gate = 2;
          fl.cap = 0;
        } else if (g <= eps) {
          fl.gate = 1;
        }
      }
      af_.push_back(f);
    }
  }
  af_links_.resize(af_.size());
  af_caps_.resize(af_.size());
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < af_.size(); ++i) {
      const Flow& fl = flows_[static_cast<size_t>(af_[i])];
      af_links_[i] = fl.links;
      // Pass 1 ignores the tie caps; pass 2 applies those pass 1 implied,
      // so capacity a tied flow cannot use goes to the others.
      af_caps_[i] = (pass == 0 && fl.gate == 1) ? kNoCap : fl.cap;
    }
    MaxMinFair(cluster_.capacity(), af_links_, af_caps_, &af_rates_, &mm_);
    for (size_t i = 0; i < af_.size(); ++i) {
      flows_[static_cast<size_t>(af_[i])].rate = af_rates_[i];
    }
    Correct();
  }
}

double Engine::NextFlowDt() const {
  double dt = kInf;
  for (int id : active_) {
    const SimFetch& r = fetches_[static_cast<size_t>(id)];
    if (r.in_rate > 0)
      dt = std::min(dt, (r.size_bytes - r.have_bytes) / r.in_rate);
    for (int f : r.flows) {
      const Flow& fl = flows_[static_cast<size_t>(f)];
      if (fl.src_fetch < 0) continue;
      const SimFetch& h = fetches_[static_cast<size_t>(fl.src_fetch)];
      double g = h.have_bytes - r.lag_bytes - r.have_bytes;
      if (fl.gate == 0) {
        double closing = r.in_rate - h.in_rate;
        if (closing > 0) dt = std::min(dt, g / closing);
      } else if (fl.gate == 2) {
        double rising = h.in_rate - r.in_rate;
        if (rising > 0) dt = std::min(dt, -g / rising);
      }
    }
  }
  return std::max(0.0, dt);
}

void Engine::Advance(double dt) {
  if (dt <= 0) return;
  for (int id : active_) {
    SimFetch& r = fetches_[static_cast<size_t>(id)];
    r.have_bytes = std::min(r.size_bytes, r.have_bytes + r.in_rate * dt);
  }
}

void Engine::Complete(int id) {
  SimFetch& r = fetches_[static_cast<size_t>(id)];
  r.active = false;
  r.done = true;
  r.have_bytes = r.size_bytes;
  r.in_rate = 0;
  r.end_s = now_;
  std::vector<int> in = r.flows;
  for (int f : in) KillFlow(f);
  auto it = holdings_.find(Key(r.gpu, r.obj));
  TH_CHECK(it != holdings_.end() && it->second.fetch == id);
  it->second.fetch = -1;
  // Its readers are no longer gated by it.
  for (int f : it->second.out) flows_[static_cast<size_t>(f)].src_fetch = -1;
  dirty_ = true;
}

Status Engine::Run(double until_s, uint64_t max_steps) {
  while (true) {
    if (dirty_) {
      ComputeRates();
      dirty_ = false;
    }
    double t_flow = now_ + NextFlowDt();
    if (std::isnan(t_flow)) return Internal("sim: NaN event time");
    double t_timer = timers_.empty() ? kInf : timers_.top().t;
    double t = std::min(t_flow, t_timer);
    if (t == kInf) return Status::Ok();
    if (t > until_s) {
      Advance(until_s - now_);
      now_ = until_s;
      return Status::Ok();
    }
    if (++steps_ > max_steps) {
      return ResourceExhausted("sim: more than " + std::to_string(max_steps) +
                               " events; a runaway model?");
    }
    Advance(t - now_);
    now_ = t;
    // Completions first: they are what timers and callbacks wait on.
    std::vector<int> finished;
    for (int id : active_) {
      const SimFetch& r = fetches_[static_cast<size_t>(id)];
      if (r.have_bytes >= r.size_bytes - std::max(1e-3, r.size_bytes * 1e-12)) {
        finished.push_back(id);
      }
    }
    if (!finished.empty()) {
      for (int id : finished) Complete(id);
      active_.erase(
          std::remove_if(active_.begin(), active_.end(),
                         [&](int id) {
                           return !fetches_[static_cast<size_t>(id)].active;
                         }),
          active_.end());
      for (int id : finished) {
        if (on_done) on_done(id);
      }
    }
    while (!timers_.empty() && timers_.top().t <= now_) {
      uint64_t seq = timers_.top().seq;
      timers_.pop();
      auto node = timer_fns_.extract(seq);
      node.mapped()();
    }
    dirty_ = true;
  }
}

}  // namespace tensorhub::sim
