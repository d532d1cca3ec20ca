// `tensorhub-lab bench workload standalone|elastic|crossdc`: the three rollout
// workloads of issue 6 on the multi-host test bed, each against its
// baselines in the same invocation, reported as total GPU stall.
//
// The loop (every host counts as one GPU). Round v: the trainer computes
// step v (--step-ms) while every rollout generates a batch (--batch-ms) with
// the version it holds. Then the trainer must meet its upload obligation for
// the version it published last before it may write version v into its
// buffers, and publishes v; each rollout, once its batch is done, fetches
// the newest version before its next batch.
//
//  * trainer blocked (round v) = time from the end of step v+1 until the
//    trainer may overwrite version v's buffers, plus the Publish call of v.
//    TensorHub: until --copies other workers hold all of v and no worker is
//    still filling it (read from the hub's Describe), then Unpublish(v),
//    which drains reads in flight.
//    Point-to-point: nobody else serves, so until every rollout holds v.
//    MPI_Bcast: the root's time inside MPI_Bcast.
//  * rollout wait = time from max(end of its batch, publish of the version)
//    until it holds that version. The trainer's compute is not counted.
//  * update time (round v) = from the moment the first steady rollout could
//    start fetching v (it finished its batch and v was published) until the
//    last one holds v, beside the bound S/B (and S/W across datacenters).
//
// elastic: the last --spot hosts are spot rollouts that join and leave on a
// schedule drawn from --seed: a joiner starts, registers, fetches the newest
// version (its time to hold it is reported) and then runs --stay rounds as
// a rollout before it leaves. The slowdown it causes is the steady
// rollouts' mean wait in rounds whose update overlapped a join, over their
// mean wait in rounds without. MPI is not run there: a static group cannot
// admit a member without being rebuilt.
#include <algorithm>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "bench_testbed.h"
#include "cli_util.h"
#include "common/log.h"
#include "subprocess.h"

namespace tensorhub::cli {
namespace {

using Clock = SteadyClock;
double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

struct Config {
  std::string workload;
  uint64_t bytes = 0, chunk_bytes = 0, rounds = 0, step_ms = 0, batch_ms = 0,
           copies = 1;
  uint64_t seed = 1, spot = 0, stay_max = 2;
  int connections = 4;
  int64_t timeout_ms = 900000;
  int port = 7070;
  size_t steady = 0;  // rollouts on hosts 1..steady; spot hosts follow
};

struct Join {
  size_t host = 0;
  uint64_t round = 0;      // joins during this round's step
  uint64_t offset_ms = 0;  // after the round's start
  uint64_t stay = 1;       // rounds it then runs as a rollout
  // Measured:
  uint64_t version = 0;
  uint64_t from_trainer = 0;
  double fetch_s = 0, ready_s = 0;
  Clock::time_point t0, t1;
  bool ok = false;
};

// A reproducible join/leave schedule: each spot host joins, stays 1..stay_max
// rounds, leaves, and may join again a round or more later.
std::vector<Join> SpotSchedule(const Config& c) {
  std::mt19937_64 rng(c.seed);
  std::vector<Join> joins;
  for (uint64_t j = 0; j < c.spot; ++j) {
    uint64_t r = 2 + rng() % 2;
    while (r <= c.rounds) {
      Join e;
      e.host = c.steady + 1 + j;
      e.round = r;
      e.offset_ms = c.step_ms / 5 + rng() % (c.step_ms * 3 / 5 + 1);
      e.stay = 1 + rng() % c.stay_max;
      joins.push_back(e);
      r += e.stay + 1 + rng() % 2;
    }
  }
  return joins;
}

struct Fetch {
  double wait_s = 0;
  uint64_t from_trainer = 0;
  bool digest_ok = false;
};

struct Round {
  double blocked_s = 0;       // trainer blocked for this version
  double update_s = 0;        // first steady rollout ready -> last holds it
  double steady_wait_s = 0;   // sum over steady rollouts
  double spot_wait_s = 0;     // running spot rollouts (not their first fetch)
  uint64_t from_trainer = 0;  // bytes of this version the trainer sent
  size_t fetches = 0, bad = 0;
  bool with_joiner = false;
};

struct SystemRun {
  std::string system, note;
  double wan_per_round_S = 0;  // bytes out of the trainer's DC onto the WAN
  std::vector<Round> rounds;
  std::vector<Join> joins;
  bool ok = true;
  std::string error;

  double Blocked() const {
    double s = 0;
    for (const Round& r : rounds) s += r.blocked_s;
    return s;
  }
  double Waits() const {
    double s = 0;
    for (const Round& r : rounds) s += r.steady_wait_s + r.spot_wait_s;
    for (const Join& j : joins) s += j.fetch_s;
    return s;
  }
  double Stall() const { return Blocked() + Waits(); }
  // Over the versions some steady rollout fetched (one that fell behind
  // skips to the newest, so a version may have none).
  double MeanUpdate() const {
    double s = 0;
    size_t n = 0;
    for (const Round& r : rounds) {
      if (r.update_s > 0) {
        s += r.update_s;
        ++n;
      }
    }
    return n ? s / n : 0;
  }
  double MeanJoin() const {
    double s = 0;
    size_t n = 0;
    for (const Join& j : joins)
      if (j.ok) {
        s += j.fetch_s;
        ++n;
      }
    return n ? s / n : 0;
  }
};

// Everything the trainer and rollout threads share, under `mu`.
struct Shared {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Clock::time_point> published_at,
      round_start;  // by version / round
  std::vector<std::string> digest;
  uint64_t newest = 0, retiring = 0;
  std::vector<uint64_t> held;               // steady rollouts, then spot hosts
  std::vector<bool> present;                // spot hosts currently in the run
  std::map<uint64_t, int> fetching;         // version -> fetches in flight
  std::vector<std::vector<Fetch>> fetches;  // by version
  std::vector<std::vector<Fetch>> spot_fetches;
  std::vector<Clock::time_point> last_steady_hold, first_steady_ready;
  bool failed = false;
  std::string error;

  void Fail(const std::string& what) {
    std::lock_guard<std::mutex> l(mu);
    if (!failed) error = what;
    failed = true;
    cv.notify_all();
  }
};

// Waits under `l` until pred() or failure, at most `timeout_ms`.
template <typename Pred>
bool WaitFor(Shared& s, std::unique_lock<std::mutex>& l, int64_t timeout_ms,
             Pred pred) {
  bool ok = s.cv.wait_for(l, std::chrono::milliseconds(timeout_ms),
                          [&] { return s.failed || pred(); });
  return ok && !s.failed;
}

// A graceful leave: the role unpublishes and leaves the hub on "quit";
// its stdout closes when it has exited. Killed if it takes over 10 s.
void Quit(Subprocess& role) {
  if (role.Send("quit").ok()) {
    Deadline deadline = Deadline::AfterMs(10000);
    while (role.ReadLine(deadline).ok()) {
    }
  }
  role.Stop(2000);
}

// One fetch of `v` by a reader role; updates the shared counters.
bool DoFetch(Shared& s, Subprocess& reader, uint64_t v,
             const std::string& trainer_id, int64_t timeout_ms,
             FetchedReply* out) {
  if (!reader.Send("fetch " + std::to_string(v)).ok()) {
    s.Fail("a reader's pipe closed");
    return false;
  }
  auto line = reader.ReadLine(Deadline::AfterMs(timeout_ms));
  auto fetched = line.ok() ? ParseFetched(*line)
                           : ::tensorhub::Result<FetchedReply>(line.status());
  if (!fetched.ok()) {
    s.Fail("fetch of version " + std::to_string(v) + ": " +
           fetched.status().ToString());
    return false;
  }
  *out = std::move(fetched).value();
  (void)trainer_id;
  return true;
}

SystemRun RunPeerToPeerOrHub(const Testbed& tb, const Config& c, bool p2p,
                             int port) {
  SystemRun res;
  res.system = p2p ? "point-to-point" : "tensorhub";
  std::string hub;
  auto hub_proc = SpawnHub(tb, std::to_string(port), &hub);
  std::string trainer_id;
  auto trainer =
      hub_proc.ok() ? SpawnTrainer(tb, hub, c.bytes, c.chunk_bytes, &trainer_id)
                    : ::tensorhub::Result<Subprocess>(hub_proc.status());
  if (!trainer.ok()) {
    res.ok = false;
    res.error = trainer.status().ToString();
    return res;
  }
  std::vector<Subprocess> steady;
  for (size_t i = 1; i <= c.steady; ++i) {
    auto r = SpawnReader(tb, i, hub, "rollout-" + std::to_string(i), c.bytes,
                         !p2p, c.connections);
    if (!r.ok()) {
      res.ok = false;
      res.error = r.status().ToString();
      return res;
    }
    steady.push_back(std::move(r).value());
  }
  for (Subprocess& r : steady) {
    auto id = WaitReady(r, 60000);
    if (!id.ok()) {
      res.ok = false;
      res.error = id.status().ToString();
      return res;
    }
  }
  std::vector<Join> joins =
      c.workload == "elastic" ? SpotSchedule(c) : std::vector<Join>{};

  Shared s;
  const uint64_t R = c.rounds;
  s.published_at.resize(R + 2);
  s.round_start.resize(R + 2);
  s.digest.resize(R + 2);
  s.fetches.resize(R + 2);
  s.spot_fetches.resize(R + 2);
  s.last_steady_hold.resize(R + 2);
  s.first_steady_ready.assign(R + 2, Clock::time_point::max());
  s.held.assign(c.steady, 0);
  std::vector<double> blocked(R + 2, 0);
  const auto start = Clock::now();

  std::thread trainer_thread([&] {
    // Steps 1..R+1: after step R+1 the obligation for version R is met and
    // version R+1 (fetched by nobody) is published.
    for (uint64_t v = 1; v <= R + 1; ++v) {
      {
        std::lock_guard<std::mutex> l(s.mu);
        s.round_start[v] = Clock::now();
        s.cv.notify_all();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(c.step_ms));
      if (!p2p && v == R + 1) {
        // Version R+1 exists only to end the loop: let every steady rollout
        // get R first. Not counted: the trainer would be computing anyway.
        std::unique_lock<std::mutex> l(s.mu);
        if (!WaitFor(s, l, c.timeout_ms, [&] {
              for (uint64_t h : s.held)
                if (h < R) return false;
              return true;
            })) {
          l.unlock();
          s.Fail("trainer: rollouts did not get version " + std::to_string(R));
          return;
        }
      }
      auto ready = Clock::now();
      if (!p2p && v > 1) {
        // No fetch may pick v-1 from now on: it is about to be withdrawn.
        std::lock_guard<std::mutex> l(s.mu);
        s.retiring = v - 1;
      }
      if (p2p && v > 1) {
        // Only the trainer holds v-1: it may overwrite it once every
        // rollout present holds it and no fetch of it is in flight.
        std::unique_lock<std::mutex> l(s.mu);
        bool ok = WaitFor(s, l, c.timeout_ms, [&] {
          for (uint64_t h : s.held)
            if (h < v - 1) return false;
          return s.fetching[v - 1] == 0;
        });
        if (!ok) {
          l.unlock();
          s.Fail("trainer: rollouts did not get version " +
                 std::to_string(v - 1));
          return;
        }
        s.retiring = v - 1;
      }
      uint64_t copies = p2p ? 0 : c.copies;
      Status sent = trainer->Send("publish " + std::to_string(v) + " " +
                                  std::to_string(copies) + " " +
                                  std::to_string(c.timeout_ms));
      auto line =
          sent.ok()
              ? trainer->ReadLine(Deadline::AfterMs(c.timeout_ms + 130000))
              : ::tensorhub::Result<std::string>(sent);
      auto pub = line.ok() ? ParsePublished(*line)
                           : ::tensorhub::Result<PublishedReply>(line.status());
      if (!pub.ok()) {
        s.Fail(pub.status().ToString());
        return;
      }
      auto done = Clock::now();
      std::lock_guard<std::mutex> l(s.mu);
      // Until its buffers are free for v: the driver-side wait (p2p), the
      // copies wait and the drain; the fill is the optimizer's own work.
      if (v > 1)
        blocked[v - 1] += Seconds(done - ready) - pub->fill_s - pub->publish_s;
      if (v <= R) blocked[v] += pub->publish_s;
      s.published_at[v] = done;
      s.digest[v] = pub->digest;
      s.newest = v;
      s.cv.notify_all();
    }
  });

  // A rollout: batch, fetch the newest version, until it holds `last`.
  // Returns false on failure. `slot` indexes s.held (steady) or -1 (spot).
  auto rollout = [&](Subprocess& reader, Clock::time_point batch_end,
                     uint64_t held, uint64_t last, int slot,
                     bool skip_retiring) -> uint64_t {
    while (held < last) {
      std::this_thread::sleep_until(batch_end);
      uint64_t v;
      Clock::time_point ready;
      {
        std::unique_lock<std::mutex> l(s.mu);
        if (!WaitFor(s, l, c.timeout_ms, [&] {
              return s.newest > held &&
                     !(skip_retiring && s.newest == s.retiring);
            })) {
          return held;
        }
        v = std::min<uint64_t>(s.newest, R);
        // Point-to-point: the trainer has let go of the last version.
        if (skip_retiring && s.retiring >= v) return held;
        ready = std::max(batch_end, s.published_at[v]);
        ++s.fetching[v];
      }
      FetchedReply f;
      bool ok = DoFetch(s, reader, v, trainer_id, c.timeout_ms, &f);
      auto now = Clock::now();
      {
        std::lock_guard<std::mutex> l(s.mu);
        --s.fetching[v];
        if (!ok) return held;
        Fetch rec{Seconds(now - ready), f.BytesFrom(trainer_id),
                  f.digest == s.digest[v]};
        if (slot >= 0) {
          s.held[slot] = v;
          s.fetches[v].push_back(rec);
          s.last_steady_hold[v] = std::max(s.last_steady_hold[v], now);
          s.first_steady_ready[v] = std::min(s.first_steady_ready[v], ready);
        } else {
          s.spot_fetches[v].push_back(rec);
        }
        s.cv.notify_all();
      }
      held = v;
      batch_end = Clock::now() + std::chrono::milliseconds(c.batch_ms);
    }
    return held;
  };

  std::vector<std::thread> threads;
  for (size_t i = 0; i < c.steady; ++i) {
    threads.emplace_back([&, i] {
      rollout(steady[i], start + std::chrono::milliseconds(c.batch_ms), 0, R,
              static_cast<int>(i), true);
    });
  }
  // One thread per spot host walks its joins in order.
  std::map<size_t, std::vector<Join*>> by_host;
  for (Join& j : joins) by_host[j.host].push_back(&j);
  for (auto& [host, list] : by_host) {
    threads.emplace_back([&, host = host, list = list] {
      int n = 0;
      for (Join* j : list) {
        {
          std::unique_lock<std::mutex> l(s.mu);
          if (!WaitFor(s, l, c.timeout_ms, [&] {
                return s.round_start[j->round] != Clock::time_point{};
              })) {
            return;
          }
          auto at =
              s.round_start[j->round] + std::chrono::milliseconds(j->offset_ms);
          l.unlock();
          std::this_thread::sleep_until(at);
        }
        auto t_spawn = Clock::now();
        auto reader = SpawnReader(
            tb, host, hub,
            "spot-" + std::to_string(host) + "-" + std::to_string(++n), c.bytes,
            !p2p, c.connections);
        if (!reader.ok()) {
          s.Fail(reader.status().ToString());
          return;
        }
        if (auto id = WaitReady(*reader, 60000); !id.ok()) {
          s.Fail(id.status().ToString());
          return;
        }
        j->ready_s = Seconds(Clock::now() - t_spawn);
        uint64_t v;
        {
          std::unique_lock<std::mutex> l(s.mu);
          if (!WaitFor(s, l, c.timeout_ms, [&] {
                return s.newest >= 1 && s.newest != s.retiring;
              })) {
            return;
          }
          v = std::min<uint64_t>(s.newest, R);
          if (s.retiring >= v) {  // the run is over: nothing left to fetch
            l.unlock();
            Quit(*reader);
            return;
          }
          ++s.fetching[v];
        }
        j->t0 = Clock::now();
        FetchedReply f;
        bool ok = DoFetch(s, *reader, v, trainer_id, c.timeout_ms, &f);
        j->t1 = Clock::now();
        {
          std::lock_guard<std::mutex> l(s.mu);
          --s.fetching[v];
          s.cv.notify_all();
          if (!ok) return;
          j->version = v;
          j->fetch_s = Seconds(j->t1 - j->t0);
          j->ok = f.digest == s.digest[v];
          j->from_trainer = f.BytesFrom(trainer_id);
        }
        rollout(*reader, Clock::now() + std::chrono::milliseconds(c.batch_ms),
                v, std::min<uint64_t>(R, v + j->stay), -1, true);
        Quit(*reader);
      }
    });
  }
  trainer_thread.join();
  for (std::thread& t : threads) t.join();
  for (Subprocess& r : steady) Quit(r);
  Quit(*trainer);
  hub_proc->Stop(5000);

  if (s.failed) {
    res.ok = false;
    res.error = s.error;
  }
  res.rounds.resize(R);
  for (uint64_t v = 1; v <= R; ++v) {
    Round& r = res.rounds[v - 1];
    r.blocked_s = blocked[v];
    if (s.last_steady_hold[v] != Clock::time_point{}) {
      r.update_s = Seconds(s.last_steady_hold[v] - s.first_steady_ready[v]);
    }
    for (const Fetch& f : s.fetches[v]) {
      r.steady_wait_s += f.wait_s;
      r.from_trainer += f.from_trainer;
      r.bad += !f.digest_ok;
      ++r.fetches;
    }
    for (const Fetch& f : s.spot_fetches[v]) {
      r.spot_wait_s += f.wait_s;
      r.from_trainer += f.from_trainer;
      r.bad += !f.digest_ok;
      ++r.fetches;
    }
    for (const Join& j : joins) {
      if (!j.ok && j.version == 0) continue;
      if (j.version == v) r.from_trainer += j.from_trainer;
      // The join overlapped this version's update.
      if (j.t0 < s.last_steady_hold[v] && j.t1 > s.published_at[v])
        r.with_joiner = true;
    }
    if (r.bad > 0) {
      res.ok = false;
      res.error = "digest mismatch in version " + std::to_string(v);
    }
  }
  for (const Join& j : joins) {
    if (j.version != 0 && !j.ok) {
      res.ok = false;
      res.error = "a joiner got wrong bytes";
    }
  }
  res.joins = joins;
  return res;
}

// Runs bench/mpi_bcast.sh in workload mode and parses its best line:
// "mpi_workload_best ... algorithm=A blocked_s=a,b update_s=.. wait_s=..
// verified=1".
SystemRun RunMpi(const Testbed& tb, const Config& c, const std::string& script,
                 const std::string& algorithms) {
  SystemRun res;
  res.system = "MPI_Bcast";
  std::string cmd =
      "bash " + script + " --prefix " + tb.prefix + " --bytes " +
      std::to_string(c.bytes) + " --receivers " + std::to_string(c.steady) +
      " --iters " + std::to_string(c.rounds) + " --algorithms '" + algorithms +
      "' --step-ms " + std::to_string(c.step_ms) + " --batch-ms " +
      std::to_string(c.batch_ms) + " --timeout-s " +
      std::to_string(c.timeout_ms / 1000) + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) {
    res.ok = false;
    res.error = "cannot run " + script;
    return res;
  }
  std::string best;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p) != nullptr) {
    std::string line(buf);
    std::fputs(("  | " + line).c_str(), stdout);
    if (line.rfind("mpi_workload_best ", 0) == 0) best = line;
  }
  std::fflush(stdout);
  int rc = ::pclose(p);
  if (best.empty()) {
    res.ok = false;
    res.error =
        "mpi_bcast.sh printed no result (exit " + std::to_string(rc) + ")";
    return res;
  }
  auto field = [&](const std::string& k) {
    size_t at = best.find(" " + k + "=");
    if (at == std::string::npos) return std::string();
    at += k.size() + 2;
    return best.substr(at, best.find_first_of(" \n", at) - at);
  };
  auto list = [&](const std::string& k) {
    std::vector<double> v;
    std::stringstream ss(field(k));
    for (std::string x; std::getline(ss, x, ',');)
      v.push_back(std::atof(x.c_str()));
    return v;
  };
  std::vector<double> blocked = list("blocked_s"), update = list("update_s"),
                      wait = list("wait_s");
  if (blocked.size() != c.rounds || update.size() != c.rounds ||
      wait.size() != c.rounds || field("verified") != "1") {
    res.ok = false;
    res.error = "bad mpi_workload_best line: " + best;
    return res;
  }
  res.note = "algorithm " + field("algorithm");
  res.rounds.resize(c.rounds);
  for (size_t i = 0; i < c.rounds; ++i) {
    res.rounds[i].blocked_s = blocked[i];
    res.rounds[i].update_s = update[i];
    res.rounds[i].steady_wait_s = wait[i];
    res.rounds[i].from_trainer = 0;  // not measured for MPI
    res.rounds[i].fetches = c.steady;
  }
  return res;
}

void PrintResult(const SystemRun& r, const Config& c, double bound_s,
                 double bound_host_s) {
  std::printf("\n%s%s%s:\n", r.system.c_str(), r.note.empty() ? "" : " ",
              r.note.empty() ? "" : ("(" + r.note + ")").c_str());
  if (!r.ok) std::printf("  FAILED: %s\n", r.error.c_str());
  if (r.wan_per_round_S > 0) {
    std::printf(
        "  WAN out of the trainer's datacenter: %.3f S per round (framing "
        "included)\n",
        r.wan_per_round_S);
  }
  for (size_t i = 0; i < r.rounds.size(); ++i) {
    const Round& x = r.rounds[i];
    std::printf(
        "  round %zu: trainer blocked %.2f s, rollout wait %.2f GPU-s (%zu "
        "fetches), "
        "update %.2f s = %.2f x bound",
        i + 1, x.blocked_s, x.steady_wait_s + x.spot_wait_s, x.fetches,
        x.update_s, x.update_s / bound_s);
    if (r.system != "MPI_Bcast") {
      std::printf(", trainer sent %.2f S",
                  static_cast<double>(x.from_trainer) / c.bytes);
    } else {
      std::printf(", trainer sent: not measured");
    }
    if (c.workload == "elastic")
      std::printf("%s", x.with_joiner ? ", joiner active" : "");
    std::printf("\n");
  }
  for (const Join& j : r.joins) {
    std::printf("  join: h%zu in round %" PRIu64 " at +%" PRIu64
                " ms, stays %" PRIu64
                " rounds: started in %.2f s, held version %" PRIu64
                " after %.2f s = %.2f x S/B%s\n",
                j.host, j.round, j.offset_ms, j.stay, j.ready_s, j.version,
                j.fetch_s, j.fetch_s / bound_host_s, j.ok ? "" : " (FAILED)");
  }
}

struct WorkloadFlags {
  std::string workload;
  std::string testbed = "thwl";
  uint64_t bytes = 0;
  uint64_t chunk_bytes = 0;
  uint64_t rounds = 4;
  uint64_t step_ms = 4000;
  uint64_t batch_ms = 4000;
  uint64_t copies = 1;
  int connections = 4;
  int port = 7070;
  uint64_t seed = 1;
  std::optional<uint64_t> spot;  // default: 3 for elastic, else 0
  uint64_t stay_max = 2;
  uint64_t timeout_s = 300;
  std::optional<std::string> systems;
  std::string mpi_script = "bench/mpi_bcast.sh";
  std::string mpi_algorithms = "3 9";
};

int RunBenchWorkload(const WorkloadFlags& f) {
  Config c;
  c.workload = f.workload;
  auto tb = LoadTestbed(f.testbed);
  if (!tb.ok()) return Fail(tb.status());
  c.bytes = f.bytes;
  c.chunk_bytes = f.chunk_bytes;
  c.rounds = f.rounds;
  c.step_ms = f.step_ms;
  c.batch_ms = f.batch_ms;
  c.copies = f.copies;
  c.connections = f.connections;
  c.port = f.port;
  c.seed = f.seed;
  c.spot = f.spot.value_or(c.workload == "elastic" ? 3 : 0);
  c.stay_max = f.stay_max;
  c.timeout_ms = static_cast<int64_t>(f.timeout_s) * 1000;
  const size_t hosts = tb->names.size();
  if (c.rounds < 1 || c.rounds > 50)
    return Fail(InvalidArgument("--rounds must be in [1, 50]"));
  if (c.step_ms > 600000 || c.batch_ms > 600000)
    return Fail(InvalidArgument("--step-ms and --batch-ms at most 600000"));
  if (c.step_ms < 100)
    return Fail(InvalidArgument("--step-ms must be at least 100"));
  if (c.copies < 1 || c.copies + 1 > hosts)
    return Fail(InvalidArgument("--copies must be in [1, hosts - 1]"));
  if (c.connections < 1 || c.connections > 64)
    return Fail(InvalidArgument("--connections in [1, 64]"));
  if (c.stay_max < 1 || c.stay_max > 10)
    return Fail(InvalidArgument("--stay-max in [1, 10]"));
  if (c.timeout_ms < 10000 || c.timeout_ms > 3600000)
    return Fail(InvalidArgument("--timeout-s in [10, 3600]"));
  if (c.bytes < (1 << 20) || c.bytes > (8ull << 30))
    return Fail(InvalidArgument("--bytes in [1 MiB, 8 GiB]"));
  if (c.spot + 2 > hosts)
    return Fail(InvalidArgument("--spot leaves no steady rollout"));
  if (c.workload != "elastic" && c.spot != 0)
    return Fail(InvalidArgument("--spot is for elastic"));
  if (c.workload == "crossdc" && tb->num_dcs < 2) {
    return Fail(InvalidArgument(
        "crossdc needs a test bed with --dcs 2 (bench/testbed.sh up --dcs 2)"));
  }
  if (c.workload != "crossdc" && tb->num_dcs != 1) {
    return Fail(
        InvalidArgument(c.workload + " needs a one-datacenter test bed"));
  }
  c.steady = hosts - 1 - c.spot;
  if (c.copies > c.steady)
    return Fail(InvalidArgument("--copies exceeds the steady rollouts"));
  std::string systems = f.systems.value_or(
      c.workload == "elastic" ? "tensorhub p2p" : "tensorhub p2p mpi");
  std::set<std::string> want;
  {
    std::istringstream ss(systems);
    for (std::string w; ss >> w;) {
      if (w != "tensorhub" && w != "p2p" && w != "mpi") {
        return Fail(InvalidArgument(
            "--systems takes tensorhub, p2p, mpi; not '" + w + "'"));
      }
      want.insert(w);
    }
  }
  if (want.count("mpi") && c.workload == "elastic") {
    return Fail(InvalidArgument(
        "elastic has no MPI baseline: a static group cannot admit joiners"));
  }
  SetLogLevel(LogLevel::kWarn);

  const double link_Bps = tb->host_mbit * 1e6 / 8;
  const double bound_host = c.bytes / link_Bps;
  size_t remote = 0;
  for (size_t i = 1; i < hosts; ++i) remote += tb->dcs[i] != tb->dcs[0];
  const double bound_wan =
      remote && tb->wan_mbit > 0 ? c.bytes / (tb->wan_mbit * 1e6 / 8) : 0;
  const double bound = std::max(bound_host, bound_wan);
  std::printf(
      "workload %s: config hosts=%zu dcs=%d trainer=h0 rollouts=%zu "
      "remote_rollouts=%zu "
      "spot=%" PRIu64 " host_mbit=%.0f wan_mbit=%.0f bytes=%" PRIu64
      " chunk_bytes=%" PRIu64 " step_ms=%" PRIu64 " batch_ms=%" PRIu64
      " rounds=%" PRIu64 " copies=%" PRIu64 " connections=%d seed=%" PRIu64
      "\n",
      c.workload.c_str(), hosts, tb->num_dcs, c.steady, remote, c.spot,
      tb->host_mbit, remote ? tb->wan_mbit : 0.0, c.bytes, c.chunk_bytes,
      c.step_ms, c.batch_ms, c.rounds, c.copies, c.connections, c.seed);
  std::printf("bounds: S/B = %.2f s%s; every host counts as one GPU\n",
              bound_host,
              remote ? (", S/W = " + std::to_string(bound_wan).substr(0, 5) +
                        " s (one copy must cross the WAN)")
                           .c_str()
                     : "");
  if (c.workload == "elastic") {
    for (const Join& j : SpotSchedule(c)) {
      std::printf("schedule: h%zu joins in round %" PRIu64 " at +%" PRIu64
                  " ms, stays %" PRIu64 " round(s)\n",
                  j.host, j.round, j.offset_ms, j.stay);
    }
  }
  std::fflush(stdout);

  std::vector<SystemRun> results;
  int port_next = c.port;
  for (const char* system : {"tensorhub", "p2p", "mpi"}) {
    if (!want.count(system)) continue;
    uint64_t wan0 = remote ? WanTxBytes(*tb, tb->dcs[0]) : 0;
    if (std::string(system) == "mpi") {
      results.push_back(RunMpi(*tb, c, f.mpi_script, f.mpi_algorithms));
    } else {
      results.push_back(RunPeerToPeerOrHub(*tb, c, std::string(system) == "p2p",
                                           port_next++));
    }
    if (remote) {
      results.back().wan_per_round_S =
          static_cast<double>(WanTxBytes(*tb, tb->dcs[0]) - wan0) / c.bytes /
          c.rounds;
    }
    PrintResult(results.back(), c, bound, bound_host);
    std::fflush(stdout);
  }

  // The table, the way the published results state them.
  std::printf(
      "\n%s: %zu GPUs (1 trainer + %zu rollouts%s), S = %s, bound %.2f s\n",
      c.workload.c_str(), hosts, hosts - 1,
      c.spot ? (", " + std::to_string(c.spot) + " of them spot").c_str() : "",
      FormatBytes(c.bytes).c_str(), bound);
  std::printf("%-16s %12s %12s %12s %14s %8s", "system", "stall GPU-s",
              "trainer s", "rollouts s", "update s/round", "x bound");
  if (c.workload == "elastic") std::printf(" %10s %12s", "join s", "slowdown");
  std::printf("\n");
  const SystemRun* ours = nullptr;
  for (const SystemRun& r : results)
    if (r.system == "tensorhub" && r.ok) ours = &r;
  auto slowdown = [](const SystemRun& r) {
    double with = 0, without = 0;
    size_t nw = 0, nn = 0;
    for (const Round& x : r.rounds) {
      double per = x.fetches ? x.steady_wait_s : 0;
      if (x.with_joiner) {
        with += per;
        ++nw;
      } else {
        without += per;
        ++nn;
      }
    }
    if (!nw || !nn || without <= 0) return 0.0;
    return (with / nw) / (without / nn);
  };
  bool all_ok = true;
  for (const SystemRun& r : results) {
    all_ok = all_ok && r.ok;
    std::printf("%-16s %12.2f %12.2f %12.2f %14.2f %8.2f", r.system.c_str(),
                r.Stall(), r.Blocked(), r.Waits(), r.MeanUpdate(),
                r.MeanUpdate() / bound);
    if (c.workload == "elastic")
      std::printf(" %10.2f %12.2f", r.MeanJoin(), slowdown(r));
    std::printf("%s\n", r.ok ? "" : "  FAILED");
  }
  if (ours != nullptr) {
    for (const SystemRun& r : results) {
      if (&r == ours || !r.ok) continue;
      std::printf("ratio %s / tensorhub: stall %.2fx, update time %.2fx",
                  r.system.c_str(), r.Stall() / ours->Stall(),
                  r.MeanUpdate() / ours->MeanUpdate());
      if (c.workload == "elastic" && ours->MeanJoin() > 0) {
        std::printf(", joiner time to hold %.2fx",
                    r.MeanJoin() / ours->MeanJoin());
      }
      std::printf("\n");
    }
  }
  for (const SystemRun& r : results) {
    uint64_t from_trainer = 0;
    for (const Round& x : r.rounds) from_trainer += x.from_trainer;
    // MPI_Bcast does not say which rank sent what: not measured, and said so
    // (a 0 would read as "the trainer sent nothing").
    char trainer_sent[32] = "not_measured";
    if (r.system != "MPI_Bcast") {
      std::snprintf(trainer_sent, sizeof(trainer_sent), "%.2f",
                    static_cast<double>(from_trainer) / c.bytes / c.rounds);
    }
    std::printf(
        "workload_result workload=%s system=%s ok=%d stall_gpu_s=%.3f "
        "trainer_blocked_s=%.3f "
        "rollout_wait_s=%.3f update_s_mean=%.3f bound_s=%.3f bound_host_s=%.3f "
        "update_per_bound=%.3f trainer_sent_per_round_S=%s join_s_mean=%.3f "
        "slowdown=%.3f wan_per_round_S=%.3f %s\n",
        c.workload.c_str(), r.system == "MPI_Bcast" ? "mpi" : r.system.c_str(),
        r.ok ? 1 : 0, r.Stall(), r.Blocked(), r.Waits(), r.MeanUpdate(), bound,
        bound_host, r.MeanUpdate() / bound, trainer_sent, r.MeanJoin(),
        slowdown(r), r.wan_per_round_S,
        r.note.empty()
            ? ""
            : ("mpi_algorithm=" + r.note.substr(r.note.rfind(' ') + 1))
                  .c_str());
  }
  return all_ok ? 0 : 1;
}

}  // namespace

void AddBenchWorkloadCommand(CommandLine& cl, CLI::App* bench) {
  auto f = std::make_shared<WorkloadFlags>();
  CLI::App* c = cl.Add(
      "workload",
      "a trainer loop and rollouts on the test bed: GPU stall "
      "vs point-to-point and MPI_Bcast",
      [f] { return RunBenchWorkload(*f); }, bench);
  c->add_option("workload", f->workload, "the workload")
      ->check(CLI::IsMember({"standalone", "elastic", "crossdc"}))
      ->required();
  c->add_option("--testbed", f->testbed, "the test bed's prefix")
      ->capture_default_str();
  AddBytesOption(c, "--bytes", &f->bytes, "128MiB", "the model's size");
  AddBytesOption(c, "--chunk-bytes", &f->chunk_bytes, "2MiB", "the chunk size");
  c->add_option("--rounds", f->rounds, "training steps (weight updates)")
      ->capture_default_str();
  c->add_option("--step-ms", f->step_ms, "the trainer's step time")
      ->capture_default_str();
  c->add_option("--batch-ms", f->batch_ms, "a rollout's generation time")
      ->capture_default_str();
  c->add_option("--copies", f->copies,
                "complete copies the trainer waits for before overwriting")
      ->capture_default_str();
  c->add_option("--connections", f->connections, "streams per reader")
      ->capture_default_str();
  c->add_option("--port", f->port, "the first hub port on h0")
      ->capture_default_str();
  c->add_option("--seed", f->seed, "the spot schedule's seed")
      ->capture_default_str();
  c->add_option("--spot", f->spot,
                "spot hosts that join and leave (elastic; default 3)");
  c->add_option("--stay-max", f->stay_max, "rounds a spot host stays at most")
      ->capture_default_str();
  c->add_option("--timeout-s", f->timeout_s, "deadline of each system's run")
      ->capture_default_str();
  c->add_option("--systems", f->systems,
                "which to run, of \"tensorhub p2p mpi\" (default: all, "
                "elastic: no mpi)");
  c->add_option("--mpi-script", f->mpi_script, "the MPI_Bcast driver")
      ->capture_default_str();
  c->add_option("--mpi-algorithms", f->mpi_algorithms,
                "OpenMPI broadcast algorithms to try")
      ->capture_default_str();
}

}  // namespace tensorhub::cli
