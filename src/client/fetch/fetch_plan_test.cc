// Deterministic tests of the fetch policy (fetch_plan.h) on simulated time:
// a small discrete-event simulation plays the stream threads, the holders
// and the hub, so failover, stealing, refresh, the attempt bound and the
// ways a fetch ends are checked at exact simulated times, in milliseconds of
// real time, with no sockets and no threads. Random scenarios are seeded.
#include "client/fetch/fetch_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace tensorhub::client {
namespace {

constexpr uint64_t kChunkBytes = 4096;

// A manifest of `parts` parts of `chunks_per_part` chunks each (zero bytes:
// the plan never looks at them).
Manifest MakeManifest(uint32_t parts, uint64_t chunks_per_part) {
  static std::vector<uint8_t> zeros;
  zeros.assign(chunks_per_part * kChunkBytes, 0);
  std::vector<PartLayout> layouts;
  for (uint32_t r = 0; r < parts; ++r) {
    TensorRef t;
    t.spec.name = "t" + std::to_string(r);
    t.spec.dtype = DType::kU8;
    t.spec.shape = {zeros.size()};
    t.data = zeros.data();
    t.bytes = zeros.size();
    Result<PartLayout> p =
        BuildPartLayout(r, std::span<const TensorRef>(&t, 1), kChunkBytes);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    layouts.push_back(*p);
  }
  Manifest m(parts, kChunkBytes, std::move(layouts));
  EXPECT_TRUE(m.Validate().ok());
  return m;
}

// What a simulated holder does with one read.
enum class Outcome {
  kOk,       // the bytes, after the holder's latency
  kCorrupt,  // bytes that fail their checksum, after the latency
  kRefuse,   // refused at once (connect or request)
  kStall,    // never answers: the read ends at its read deadline
  kClose,    // the connection drops halfway through the latency
  // Refused at once on principle (FAILED_PRECONDITION: e.g. data-plane TLS
  // on one end only). Last: the random scenarios draw from the four above.
  kMismatch,
};

struct SimHolder {
  std::string address;
  std::vector<std::pair<uint64_t, uint64_t>> chunks;
  int64_t latency_ms = 10;
  // Decides each read: (chunk, how many reads this holder got so far).
  std::function<Outcome(uint64_t, int)> behave = [](uint64_t, int) {
    return Outcome::kOk;
  };
  // If set, the latency of the n-th read (overrides latency_ms).
  std::function<int64_t(int)> latency_of;
  bool filling = false;
  bool listed = true;  // given to the plan at the start (else only by the hub)
  std::string hint;    // FetchSource::unreachable_hint
  std::string tcp_address;  // FetchSource::tcp_address
  int reads = 0;
  FetchSource Source() const {
    return FetchSource{address, address, 1,       chunks,
                       filling, hint,    nullptr, tcp_address};
  }
};

using SimRefresher =
    std::function<Result<SourceUpdate>(int64_t now_ms, int call)>;

// Plays `streams` stream threads around one FetchPlan. Every event happens at
// a simulated millisecond; ties go to the lowest stream. A finished read or
// refresh wakes every waiting stream (RunFetch's notify_all).
class Sim {
 public:
  Sim(const Manifest& m, std::vector<SimHolder> holders, FetcherOptions o,
      int64_t deadline_ms, SimRefresher refresher = nullptr,
      size_t max_sources = kFetchMaxSources)
      : options_(o),
        deadline_ms_(deadline_ms),
        refresher_(std::move(refresher)),
        plan_("m@1", m, Sources(holders), static_cast<bool>(refresher_), o, 0,
              deadline_ms, max_sources) {
    for (SimHolder& h : holders) holders_[h.address] = std::move(h);
    done_count.assign(m.num_chunks(), 0);
  }

  // Runs the fetch to its end; returns its status.
  Status Run() {
    streams_.assign(std::max(1, options_.streams), StreamState{});
    for (int guard = 0; guard < 2000000; ++guard) {
      if (ActIdle()) continue;
      if (!NextEvent())
        return plan_.error().ok() ? Status::Ok() : plan_.error();
    }
    ADD_FAILURE() << "simulation did not end";
    return Internal("simulation did not end");
  }

  FetchPlan& plan() { return plan_; }
  SimHolder& holder(const std::string& a) { return holders_.at(a); }

  std::vector<int> done_count;  // verified reads per chunk
  std::vector<int64_t> refresh_ms;
  std::vector<int64_t> recheck_ms;
  // The hub's answers to rechecks (FetcherOptions::recheck must be set for
  // the plan to ask).
  SimRefresher rechecker;
  std::set<std::string>
      corrupt_holders;  // served a corrupt chunk at least once
  int64_t end_ms = -1;  // when the last stream saw kDone
  int64_t now_ms = 0;

 private:
  enum class State {
    kIdle,
    kReading,
    kWaiting,
    kRefreshing,
    kRechecking,
    kDone
  };
  struct StreamState {
    State state = State::kIdle;
    int64_t at_ms = 0;
    FetchStep step;
    Status result;
  };

  static std::vector<FetchSource> Sources(const std::vector<SimHolder>& hs) {
    std::vector<FetchSource> out;
    for (const SimHolder& h : hs) {
      if (h.listed) out.push_back(h.Source());
    }
    return out;
  }

  // Lets the first idle stream take its next step; false if none is idle.
  bool ActIdle() {
    for (StreamState& s : streams_) {
      if (s.state != State::kIdle) continue;
      Act(s, plan_.NextStep(now_ms));
      return true;
    }
    return false;
  }

  void Act(StreamState& s, FetchStep step) {
    switch (step.kind) {
      case FetchStep::Kind::kDone:
        s.state = State::kDone;
        end_ms = now_ms;
        return;
      case FetchStep::Kind::kWait:
        EXPECT_GT(step.until_ms, now_ms);
        EXPECT_LE(step.until_ms, deadline_ms_);
        s = StreamState{State::kWaiting, step.until_ms, step, Status::Ok()};
        return;
      case FetchStep::Kind::kSteal:
        for (StreamState& o : streams_) {
          if (o.state == State::kReading && o.step.chunk == step.chunk) {
            o.at_ms = now_ms;  // Cancel: the read ends at once, with an error
            o.result = Unavailable("read cancelled: too slow");
          }
        }
        return;
      case FetchStep::Kind::kRefresh:
        refresh_ms.push_back(now_ms);
        s = StreamState{State::kRefreshing, std::min(now_ms + 1, deadline_ms_),
                        step, Status::Ok()};
        return;
      case FetchStep::Kind::kRecheck:
        recheck_ms.push_back(now_ms);
        s = StreamState{State::kRechecking, std::min(now_ms + 1, deadline_ms_),
                        step, Status::Ok()};
        return;
      case FetchStep::Kind::kRead:
        StartRead(s, std::move(step));
        return;
    }
  }

  void StartRead(StreamState& s, FetchStep step) {
    SimHolder& h = holders_.at(step.address);
    bool has = false;
    for (const auto& [b, e] : h.chunks)
      has = has || (step.chunk >= b && step.chunk < e);
    EXPECT_TRUE(has) << "chunk " << step.chunk << " read from " << h.address
                     << ", which lacks it";
    const int64_t read_deadline_ms =
        std::min(deadline_ms_, now_ms + options_.read_timeout_ms);
    const int nth = h.reads++;
    const int64_t latency_ms = h.latency_of ? h.latency_of(nth) : h.latency_ms;
    Outcome o = h.behave(step.chunk, nth);
    int64_t at = now_ms + latency_ms;
    Status result = Status::Ok();
    if (o != Outcome::kRefuse && o != Outcome::kMismatch) {
      plan_.ReadConnected(step.chunk);
    }
    switch (o) {
      case Outcome::kOk:
        break;
      case Outcome::kCorrupt:
        result = DataLoss("chunk failed its checksum");
        break;
      case Outcome::kRefuse:
        at = now_ms + 1;
        result = Unavailable("refused");
        break;
      case Outcome::kMismatch:
        at = now_ms + 1;
        result = FailedPrecondition("the holder uses TLS on the data plane");
        break;
      case Outcome::kStall:
        at = read_deadline_ms;
        break;
      case Outcome::kClose:
        at = now_ms + latency_ms / 2;
        result = Unavailable("closed");
        break;
    }
    if (at >= read_deadline_ms) {
      at = read_deadline_ms;
      result = DeadlineExceeded("read timed out");
    }
    s = StreamState{State::kReading, at, std::move(step), result};
  }

  // Moves time to the earliest pending event and plays it; false if every
  // stream is done.
  bool NextEvent() {
    StreamState* next = nullptr;
    for (StreamState& s : streams_) {
      if (s.state == State::kIdle || s.state == State::kDone) continue;
      if (next == nullptr || s.at_ms < next->at_ms) next = &s;
    }
    if (next == nullptr) return false;
    EXPECT_GE(next->at_ms, now_ms);
    now_ms = std::max(now_ms, next->at_ms);
    const State was = next->state;
    next->state = State::kIdle;
    if (was == State::kWaiting) return true;
    if (was == State::kReading) {
      if (next->result.ok()) ++done_count[next->step.chunk];
      if (next->result.code() == StatusCode::kDataLoss)
        corrupt_holders.insert(next->step.address);
      plan_.ReadFinished(now_ms, next->step.chunk, next->result);
    } else if (was == State::kRechecking) {
      plan_.Rechecked(now_ms,
                      rechecker(now_ms, static_cast<int>(recheck_ms.size())));
    } else {
      plan_.SourcesRefreshed(
          now_ms, refresher_(now_ms, static_cast<int>(refresh_ms.size())));
    }
    for (StreamState& s : streams_) {
      if (s.state == State::kWaiting) s.state = State::kIdle;
    }
    return true;
  }

  const FetcherOptions options_;
  const int64_t deadline_ms_;
  SimRefresher refresher_;
  std::map<std::string, SimHolder> holders_;
  FetchPlan plan_;
  std::vector<StreamState> streams_;
};

FetcherOptions PlanOptions() {
  FetcherOptions o;
  o.streams = 4;
  o.read_timeout_ms = 30000;
  o.refresh_interval_ms = 200;
  o.max_attempts_per_chunk = 32;
  o.steal_min_ms = 1000;
  o.steal_factor = 4;
  return o;
}

SimHolder Whole(const std::string& address, const Manifest& m,
                int64_t latency_ms = 10) {
  SimHolder h;
  h.address = address;
  h.chunks = {{0, m.num_chunks()}};
  h.latency_ms = latency_ms;
  return h;
}

Outcome Always(Outcome o) { return o; }

void ExpectEveryChunkOnce(const Sim& sim) {
  for (size_t c = 0; c < sim.done_count.size(); ++c) {
    EXPECT_EQ(sim.done_count[c], 1) << "chunk " << c;
  }
}

TEST(FetchPlanTest, StripesAcrossHolders) {
  Manifest m = MakeManifest(2, 12);
  Sim sim(m, {Whole("a", m), Whole("b", m), Whole("c", m)}, PlanOptions(),
          60000);
  ASSERT_TRUE(sim.Run().ok());
  ExpectEveryChunkOnce(sim);
  FetchReport r = sim.plan().Report();
  EXPECT_EQ(r.sources_used, 3u);
  EXPECT_EQ(r.chunk_retries, 0u);
  EXPECT_EQ(r.bytes, m.total_bytes());
  // 24 chunks, 4 streams, 10 ms each: 6 rounds.
  EXPECT_EQ(sim.end_ms, 60);
}

TEST(FetchPlanTest, FailsOverFromARefusingHolder) {
  Manifest m = MakeManifest(1, 16);
  SimHolder bad = Whole("bad", m);
  bad.behave = [](uint64_t, int) { return Always(Outcome::kRefuse); };
  Sim sim(m, {bad, Whole("good", m)}, PlanOptions(), 60000);
  ASSERT_TRUE(sim.Run().ok());
  ExpectEveryChunkOnce(sim);
  EXPECT_GE(sim.plan().Report().chunk_retries, 1u);
  EXPECT_EQ(sim.plan().Report().sources_used, 1u);
}

TEST(FetchPlanTest, FailsOverWhenAHolderClosesMidFetch) {
  Manifest m = MakeManifest(1, 32);
  SimHolder flaky = Whole("flaky", m);
  flaky.behave = [](uint64_t, int n) {
    return n < 3 ? Outcome::kOk : Outcome::kClose;
  };
  Sim sim(m, {flaky, Whole("good", m)}, PlanOptions(), 60000);
  ASSERT_TRUE(sim.Run().ok());
  ExpectEveryChunkOnce(sim);
  EXPECT_EQ(sim.plan().Report().sources_used, 2u);
}

TEST(FetchPlanTest, CorruptHolderIsMaskedByAnother) {
  Manifest m = MakeManifest(1, 16);
  SimHolder bad = Whole("bad", m);
  bad.behave = [](uint64_t, int) { return Always(Outcome::kCorrupt); };
  Sim sim(m, {bad, Whole("good", m)}, PlanOptions(), 60000);
  ASSERT_TRUE(sim.Run().ok());
  ExpectEveryChunkOnce(sim);
}

// No hub to ask: the corrupt holder is dropped after its first reads, and
// the fetch ends at its deadline with DATA_LOSS (not UNAVAILABLE).
TEST(FetchPlanTest, OnlyACorruptHolderEndsWithDataLossAtTheDeadline) {
  Manifest m = MakeManifest(1, 16);
  SimHolder bad = Whole("bad", m);
  bad.behave = [](uint64_t, int) { return Always(Outcome::kCorrupt); };
  Sim sim(m, {bad}, PlanOptions(), 1500);
  Status s = sim.Run();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find("checksum"), std::string::npos) << s.ToString();
  EXPECT_EQ(sim.end_ms, 1500);
}

// The hub keeps listing the corrupt holder: each chunk is tried up to the
// attempt bound, then the fetch ends DATA_LOSS long before its deadline.
TEST(FetchPlanTest, ARelistedCorruptHolderIsRetriedOnlyUpToTheBound) {
  Manifest m = MakeManifest(1, 8);
  SimHolder bad = Whole("bad", m);
  bad.behave = [](uint64_t, int) { return Always(Outcome::kCorrupt); };
  FetcherOptions o = PlanOptions();
  o.max_attempts_per_chunk = 5;
  o.refresh_interval_ms = 20;
  Sim sim(m, {bad}, o, 600000, [&](int64_t, int) -> Result<SourceUpdate> {
    return SourceUpdate(std::vector<FetchSource>{bad.Source()});
  });
  Status s = sim.Run();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find("failed 5 times"), std::string::npos)
      << s.ToString();
  EXPECT_GE(sim.refresh_ms.size(), 4u);
  EXPECT_LT(sim.end_ms, 10000);
  for (int n : sim.done_count) EXPECT_EQ(n, 0);
}

// One holder corrupt, the other unreachable: not every holder served
// damaged bytes, so the fetch is UNAVAILABLE.
TEST(FetchPlanTest, CorruptAndUnreachableHoldersEndUnavailable) {
  Manifest m = MakeManifest(1, 8);
  SimHolder bad = Whole("bad", m);
  bad.behave = [](uint64_t, int) { return Always(Outcome::kCorrupt); };
  SimHolder gone = Whole("gone", m);
  gone.behave = [](uint64_t, int) { return Always(Outcome::kRefuse); };
  Sim sim(m, {bad, gone}, PlanOptions(), 3000);
  Status s = sim.Run();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_EQ(sim.end_ms, 3000);
}

TEST(FetchPlanTest, RefreshSuppliesAHolderLaterAtTheRefreshInterval) {
  Manifest m = MakeManifest(2, 6);
  SimHolder h = Whole("h", m);
  h.listed = false;  // only the hub knows it, from its third answer on
  Sim sim(m, {h}, PlanOptions(), 60000,
          [&](int64_t, int call) -> Result<SourceUpdate> {
            if (call == 1) return SourceUpdate(std::vector<FetchSource>{});
            if (call == 2) return Unavailable("hub restarting");  // keep trying
            return SourceUpdate(std::vector<FetchSource>{h.Source()});
          });
  ASSERT_TRUE(sim.Run().ok());
  ExpectEveryChunkOnce(sim);
  ASSERT_EQ(sim.refresh_ms.size(), 3u);
  EXPECT_EQ(sim.refresh_ms[0], 0);
  EXPECT_EQ(sim.refresh_ms[1], 200);
  EXPECT_EQ(sim.refresh_ms[2], 400);
}

TEST(FetchPlanTest, RefresherNotFoundEndsTheFetchAtOnce) {
  Manifest m = MakeManifest(1, 4);
  Sim sim(m, {}, PlanOptions(), 60000,
          [](int64_t, int) -> Result<SourceUpdate> {
            return NotFound("version is gone");
          });
  Status s = sim.Run();
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_EQ(sim.end_ms, 1);
}

TEST(FetchPlanTest, HubSayingUnavailableTwiceEndsAFetchNoSourceCanFinish) {
  Manifest m = MakeManifest(1, 4);
  Sim sim(m, {}, PlanOptions(), 60000,
          [](int64_t, int) -> Result<SourceUpdate> {
            SourceUpdate u;
            u.unavailable = "no live worker holds every chunk";
            return u;
          });
  Status s = sim.Run();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("answered twice"), std::string::npos)
      << s.ToString();
  // The second answer, a refresh interval after the first (which took 1 ms),
  // ends it at once.
  ASSERT_EQ(sim.refresh_ms.size(), 2u);
  EXPECT_EQ(sim.refresh_ms[1], 200);
  EXPECT_EQ(sim.end_ms, 201);
}

TEST(FetchPlanTest, OneUnavailableAnswerIsNotFinal) {
  Manifest m = MakeManifest(1, 4);
  SimHolder h = Whole("h", m);
  h.listed = false;
  Sim sim(m, {h}, PlanOptions(), 60000,
          [&](int64_t, int call) -> Result<SourceUpdate> {
            if (call == 1) {
              SourceUpdate u;
              u.unavailable = "no live worker holds every chunk";
              return u;
            }
            return SourceUpdate(std::vector<FetchSource>{h.Source()});
          });
  ASSERT_TRUE(sim.Run().ok());
  ExpectEveryChunkOnce(sim);
}

// Chunks of rank 1 have a holder from the start; rank 0's holder is known
// only once rank 1 is done. The streams must not all wait on chunk 0.
TEST(FetchPlanTest, AChunkWithoutASourceDoesNotHoldUpTheOthers) {
  Manifest m = MakeManifest(2, 8);
  SimHolder r1;
  r1.address = "rank1";
  r1.chunks = {{m.chunk_base(1), m.chunk_base(2)}};
  SimHolder r0;
  r0.address = "rank0";
  r0.chunks = {{0, m.chunk_base(1)}};
  r0.listed = false;
  Sim* self = nullptr;
  Sim sim(m, {r1, r0}, PlanOptions(), 60000,
          [&](int64_t, int) -> Result<SourceUpdate> {
            if (self->plan().chunks_done() < 8)
              return SourceUpdate(std::vector<FetchSource>{});
            return SourceUpdate(std::vector<FetchSource>{r0.Source()});
          });
  self = &sim;
  ASSERT_TRUE(sim.Run().ok());
  ExpectEveryChunkOnce(sim);
}

// A holder that turns very slow loses its chunks to the other: the fetch
// ends about steal_min_ms after the slowdown, not at the read timeout.
TEST(FetchPlanTest, WorkStealingMovesChunksAwayFromAHolderThatTurnsSlow) {
  Manifest m = MakeManifest(1, 40);
  SimHolder slow = Whole("slow", m);
  slow.behave = [](uint64_t, int n) {
    return n < 4 ? Outcome::kOk : Outcome::kStall;
  };
  Sim sim(m, {slow, Whole("fast", m)}, PlanOptions(), 600000);
  ASSERT_TRUE(sim.Run().ok());
  ExpectEveryChunkOnce(sim);
  FetchReport r = sim.plan().Report();
  EXPECT_GE(r.chunks_stolen, 1u);
  EXPECT_LT(sim.end_ms,
            2000);  // simulated: steal_min_ms = 1000, chunks take 10 ms
}

TEST(FetchPlanTest, WorkStealingLeavesTheOnlyHolderAlone) {
  Manifest m = MakeManifest(1, 8);
  SimHolder slow = Whole("slow", m);
  // After two reads, 5 s each: far above steal_min_ms, but nobody else
  // holds the chunks.
  slow.latency_of = [](int n) -> int64_t { return n < 2 ? 10 : 5000; };
  Sim sim(m, {slow}, PlanOptions(), 600000);
  ASSERT_TRUE(sim.Run().ok());
  ExpectEveryChunkOnce(sim);
  EXPECT_EQ(sim.plan().Report().chunks_stolen, 0u);
}

// Bytes still arriving at the deadline: DEADLINE_EXCEEDED, not UNAVAILABLE.
TEST(FetchPlanTest, SlowButLiveHolderEndsDeadlineExceeded) {
  Manifest m = MakeManifest(1, 200);
  FetcherOptions o = PlanOptions();
  o.streams = 1;
  o.steal_min_ms = 0;
  Sim sim(m, {Whole("slow", m, 100)}, o, 1000);
  Status s = sim.Run();
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_EQ(sim.end_ms, 1000);
}

// The only holder stops answering (its connection stays open): no chunk for
// kFetchNoProgressMs before the deadline, so UNAVAILABLE.
TEST(FetchPlanTest, StalledOnlyHolderEndsUnavailableAtTheDeadline) {
  Manifest m = MakeManifest(1, 20);
  SimHolder h = Whole("h", m);
  h.behave = [](uint64_t, int n) {
    return n < 3 ? Outcome::kOk : Outcome::kStall;
  };
  Sim sim(m, {h}, PlanOptions(), 5000);
  Status s = sim.Run();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_EQ(sim.end_ms, 5000);
}

TEST(FetchPlanTest, NoLiveHolderEndsUnavailableAtTheDeadline) {
  Manifest m = MakeManifest(1, 8);
  SimHolder a = Whole("a", m);
  a.behave = [](uint64_t, int) { return Always(Outcome::kRefuse); };
  SimHolder b = Whole("b", m);
  b.behave = a.behave;
  Sim sim(
      m, {a, b}, PlanOptions(), 1000,
      [&](int64_t, int) -> Result<SourceUpdate> {
        return SourceUpdate(std::vector<FetchSource>{a.Source(), b.Source()});
      });
  Status s = sim.Run();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_LE(sim.end_ms, 1000);
  EXPECT_GE(sim.refresh_ms.size(), 1u);
}

// A holder configured differently from the reader (data-plane TLS on one
// end only) is not retried, even when the hub lists it again; the others
// serve the fetch.
TEST(FetchPlanTest, AMismatchedHolderIsNotRetried) {
  Manifest m = MakeManifest(1, 16);
  SimHolder odd = Whole("odd", m);
  odd.behave = [](uint64_t, int) { return Always(Outcome::kMismatch); };
  SimHolder half = Whole("half", m);
  half.chunks = {{0, 8}};  // the rest only odd has, until the hub names late
  SimHolder late = Whole("late", m);
  late.listed = false;
  Sim sim(m, {odd, half, late}, PlanOptions(), 60000,
          [&](int64_t, int) -> Result<SourceUpdate> {
            return SourceUpdate(
                std::vector<FetchSource>{odd.Source(), late.Source()});
          });
  ASSERT_TRUE(sim.Run().ok());
  ExpectEveryChunkOnce(sim);
  EXPECT_GE(sim.refresh_ms.size(), 1u);
  // Only the reads started before its first refusal came back.
  EXPECT_LE(sim.holder("odd").reads, PlanOptions().streams);
  EXPECT_GT(sim.holder("late").reads, 0);
}

// A holder dialled over another transport that refuses a read on principle
// (a UCX holder serving device memory) is read over TCP instead: the same
// holder at its TCP address, with no retry counted and no other holder
// needed. A refresh that lists it again (at its UCX address) keeps it on
// TCP.
TEST(FetchPlanTest, ARefusalOverAnotherTransportMovesTheHolderToTcp) {
  Manifest m = MakeManifest(1, 16);
  SimHolder over_ucx = Whole("ucx://a", m);
  over_ucx.tcp_address = "a";
  over_ucx.behave = [](uint64_t, int) { return Always(Outcome::kMismatch); };
  SimHolder over_tcp = Whole("a", m);
  over_tcp.listed = false;  // reached only through the fallback
  Sim sim(m, {over_ucx, over_tcp}, PlanOptions(), 60000,
          [&](int64_t, int) -> Result<SourceUpdate> {
            return SourceUpdate(std::vector<FetchSource>{over_ucx.Source()});
          });
  ASSERT_TRUE(sim.Run().ok());
  ExpectEveryChunkOnce(sim);
  // Only the reads started before its first refusal went over UCX.
  EXPECT_LE(sim.holder("ucx://a").reads, PlanOptions().streams);
  EXPECT_EQ(sim.holder("a").reads, 16);
  EXPECT_EQ(sim.plan().Report().chunk_retries, 0u);
}

// A holder that served some chunks over UCX before refusing the rest there
// is reported as two entries, one per transport, each with what it carried.
TEST(FetchPlanTest, AMovedHoldersBytesAreReportedPerTransport) {
  Manifest m = MakeManifest(1, 16);
  SimHolder over_ucx = Whole("ucx://a", m);
  over_ucx.tcp_address = "a";
  over_ucx.behave = [](uint64_t chunk, int) {
    return chunk < 2 ? Outcome::kOk : Outcome::kMismatch;
  };
  SimHolder over_tcp = Whole("a", m);
  over_tcp.listed = false;
  FetcherOptions o = PlanOptions();
  o.streams = 1;  // chunks in order: 0 and 1 over UCX, the rest refused
  Sim sim(m, {over_ucx, over_tcp}, o, 60000,
          [&](int64_t, int) -> Result<SourceUpdate> {
            return SourceUpdate(std::vector<FetchSource>{over_ucx.Source()});
          });
  ASSERT_TRUE(sim.Run().ok());
  ExpectEveryChunkOnce(sim);
  FetchReport r = sim.plan().Report();
  EXPECT_EQ(r.sources_used, 1u);
  ASSERT_EQ(r.per_source.size(), 2u);
  EXPECT_EQ(r.per_source[0].address, "ucx://a");
  EXPECT_EQ(r.per_source[0].chunks, 2u);
  EXPECT_EQ(r.per_source[1].address, "a");
  EXPECT_EQ(r.per_source[1].chunks, 14u);
  EXPECT_EQ(r.per_source[0].bytes + r.per_source[1].bytes, r.bytes);
}

// When every holder known refuses on principle, the fetch ends at once with
// the reason, not at its deadline.
TEST(FetchPlanTest, EveryHolderMismatchedEndsTheFetchAtOnce) {
  Manifest m = MakeManifest(1, 8);
  SimHolder a = Whole("a", m);
  a.behave = [](uint64_t, int) { return Always(Outcome::kMismatch); };
  SimHolder b = Whole("b", m);
  b.behave = a.behave;
  Sim sim(
      m, {a, b}, PlanOptions(), 60000,
      [&](int64_t, int) -> Result<SourceUpdate> {
        return SourceUpdate(std::vector<FetchSource>{a.Source(), b.Source()});
      });
  Status s = sim.Run();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("uses TLS on the data plane"), std::string::npos)
      << s.ToString();
  EXPECT_LE(sim.end_ms, 10);
}

// Each read of a chunk costs an attempt; the bound ends the fetch.
TEST(FetchPlanTest, AttemptsPerChunkAreBounded) {
  Manifest m = MakeManifest(1, 1);
  SimHolder a = Whole("a", m);
  a.behave = [](uint64_t, int) { return Always(Outcome::kClose); };
  FetcherOptions o = PlanOptions();
  o.max_attempts_per_chunk = 3;
  o.refresh_interval_ms = 20;
  Sim sim(m, {a}, o, 600000, [&](int64_t, int) -> Result<SourceUpdate> {
    return SourceUpdate(std::vector<FetchSource>{a.Source()});
  });
  Status s = sim.Run();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("failed 3 times"), std::string::npos)
      << s.ToString();
  EXPECT_EQ(sim.holder("a").reads, 3);
}

// A holder out of reach with a reason known (a loopback address handed to
// a reader on another host): the fetch's error leads with that reason, once,
// not with one failed read after another.
TEST(FetchPlanTest, AnUnreachableHoldersReasonLeadsTheError) {
  Manifest m = MakeManifest(1, 4);
  SimHolder a = Whole("127.0.0.1:7001", m);
  a.behave = [](uint64_t, int) { return Always(Outcome::kRefuse); };
  a.hint = "holder w1 advertises 127.0.0.1:7001, which is loopback";
  FetcherOptions o = PlanOptions();
  o.refresh_interval_ms = 20;
  Sim sim(m, {a}, o, 600000, [&](int64_t, int) -> Result<SourceUpdate> {
    return SourceUpdate(std::vector<FetchSource>{a.Source()});
  });
  Status s = sim.Run();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_EQ(s.message().rfind(a.hint + "; so: ", 0), 0u) << s.ToString();
  EXPECT_EQ(s.message().find(a.hint, 1), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("failed 32 times"), std::string::npos);
}

// The same at the deadline (a holder still live: DEADLINE_EXCEEDED), and
// the reason of a holder that did not fail is not told.
TEST(FetchPlanTest, OnlyReasonsOfHoldersThatFailedAreTold) {
  Manifest m = MakeManifest(1, 4);
  SimHolder a = Whole("127.0.0.1:7001", m);
  a.behave = [](uint64_t, int) { return Always(Outcome::kRefuse); };
  a.hint = "holder a is out of reach";
  SimHolder b = Whole("127.0.0.1:7002", m);
  b.behave = [](uint64_t, int) { return Always(Outcome::kOk); };
  b.chunks = {{0, 2}};  // chunks 2 and 3: only a
  b.hint = "holder b is out of reach";
  Sim sim(
      m, {a, b}, PlanOptions(), 1000,
      [&](int64_t, int) -> Result<SourceUpdate> {
        return SourceUpdate(std::vector<FetchSource>{a.Source(), b.Source()});
      });
  Status s = sim.Run();
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_NE(s.message().find(a.hint), std::string::npos) << s.ToString();
  EXPECT_EQ(s.message().find(b.hint), std::string::npos) << s.ToString();
}

// A hub that keeps naming new holders cannot grow the plan's source list
// past its bound.
TEST(FetchPlanTest, SourcesAreBounded) {
  Manifest m = MakeManifest(1, 4);
  std::vector<SimHolder> all;
  for (int i = 0; i < 40; ++i) {
    SimHolder h = Whole("h" + std::to_string(i), m);
    h.behave = [](uint64_t, int) { return Always(Outcome::kRefuse); };
    all.push_back(h);
  }
  FetcherOptions o = PlanOptions();
  o.refresh_interval_ms = 20;
  o.max_attempts_per_chunk = 1000;
  Sim* self = nullptr;
  size_t most = 0;
  Sim sim(
      m, all, o, 5000,
      [&](int64_t, int call) -> Result<SourceUpdate> {
        most = std::max(most, self->plan().sources_known());
        std::vector<FetchSource> fresh;
        for (int i = 0; i < 3; ++i)
          fresh.push_back(all[(call * 3 + i) % 40].Source());
        return SourceUpdate(fresh);
      },
      /*max_sources=*/4);
  self = &sim;
  EXPECT_LE(sim.plan().sources_known(), 4u);
  Status s = sim.Run();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_LE(most, 4u);
  EXPECT_LE(sim.plan().sources_known(), 4u);
  EXPECT_GT(sim.refresh_ms.size(), 10u);
}

// Random holders, outcomes and hub answers, seeded: whatever happens, no
// chunk is read from a holder that lacks it, none is done twice, the fetch
// ends by its deadline, and it ends OK exactly when every chunk was done.
TEST(FetchPlanTest, RandomScenariosKeepTheInvariants) {
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const uint32_t parts = 1 + rng() % 3;
    Manifest m = MakeManifest(parts, 1 + rng() % 12);
    std::vector<SimHolder> holders;
    const int n = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < n; ++i) {
      SimHolder h;
      h.address = "h" + std::to_string(i);
      const uint32_t p = rng() % (parts + 1);  // == parts: the whole version
      h.chunks = {p == parts
                      ? std::make_pair(uint64_t{0}, m.num_chunks())
                      : std::make_pair(m.chunk_base(p), m.chunk_base(p + 1))};
      h.latency_ms = 1 + rng() % 200;
      h.filling = rng() % 4 == 0;
      const uint32_t bad_pct = rng() % 60;
      auto r = std::make_shared<std::mt19937>(rng());
      h.behave = [r, bad_pct](uint64_t, int) {
        if ((*r)() % 100 >= bad_pct) return Outcome::kOk;
        return static_cast<Outcome>(1 + (*r)() % 4);
      };
      holders.push_back(h);
    }
    FetcherOptions o = PlanOptions();
    o.streams = 1 + static_cast<int>(rng() % 6);
    o.max_attempts_per_chunk = 1 + static_cast<int>(rng() % 8);
    o.read_timeout_ms = 500 + rng() % 3000;
    o.steal_min_ms = rng() % 2 == 0 ? 0 : 100 + rng() % 1000;
    const int64_t deadline_ms = 1000 + rng() % 20000;
    auto hub_rng = std::make_shared<std::mt19937>(rng());
    SimRefresher hub = [&, hub_rng](int64_t, int) -> Result<SourceUpdate> {
      switch ((*hub_rng)() % 5) {
        case 0:
          return Unavailable("hub restarting");
        case 1: {
          SourceUpdate u;
          u.unavailable = "no complete holder";
          return u;
        }
        default: {
          std::vector<FetchSource> some;
          for (const SimHolder& h : holders) {
            if ((*hub_rng)() % 2 == 0) some.push_back(h.Source());
          }
          return SourceUpdate(some);
        }
      }
    };
    Sim sim(m, holders, o, deadline_ms, rng() % 3 == 0 ? nullptr : hub);
    Status s = sim.Run();
    EXPECT_LE(sim.end_ms, deadline_ms);
    for (int c : sim.done_count) EXPECT_LE(c, 1);
    const bool all_done =
        std::all_of(sim.done_count.begin(), sim.done_count.end(),
                    [](int c) { return c == 1; });
    EXPECT_EQ(s.ok(), all_done) << s.ToString();
    EXPECT_EQ(sim.plan().chunks_done(),
              static_cast<uint64_t>(
                  std::count(sim.done_count.begin(), sim.done_count.end(), 1)));
    const StatusCode c = s.code();
    EXPECT_TRUE(c == StatusCode::kOk || c == StatusCode::kUnavailable ||
                c == StatusCode::kDeadlineExceeded ||
                c == StatusCode::kDataLoss)
        << s.ToString();
    if (c == StatusCode::kDataLoss) {
      EXPECT_FALSE(sim.corrupt_holders.empty());
    }
  }
}

// The hub moved this reader (docs/design.md, "Rack-aware pipelines"): told
// to recheck after 30 ms, the fetch asks, reads from exactly what the hub
// answers from then on (the old source is retired, not failed), and asks
// again as the answer says, until an answer says no more.
TEST(FetchPlanTest, ARecheckReplacesTheSourcesWithTheHubsBooks) {
  Manifest m = MakeManifest(1, 40);
  SimHolder a = Whole("a", m);
  SimHolder b = Whole("b", m);
  b.listed = false;  // only the recheck names it
  FetcherOptions o = PlanOptions();
  o.streams = 2;
  o.recheck_after_ms = 30;
  o.recheck = [] { return Result<SourceUpdate>(SourceUpdate{}); };  // unused
  Sim sim(m, {a, b}, o, 100000);
  sim.rechecker = [&](int64_t, int call) -> Result<SourceUpdate> {
    SourceUpdate u({sim.holder("b").Source()});
    u.recheck_after_ms = call == 1 ? 40 : 0;  // once more, then no more
    return u;
  };
  ASSERT_TRUE(sim.Run().ok());
  for (int n : sim.done_count) EXPECT_EQ(n, 1);
  EXPECT_EQ(sim.recheck_ms, (std::vector<int64_t>{30, 71}));
  // a served until the first recheck (10 ms a read, 2 streams), b after.
  EXPECT_GT(sim.holder("a").reads, 0);
  EXPECT_LE(sim.holder("a").reads, 8);
  EXPECT_GT(sim.holder("b").reads, 30);
  EXPECT_EQ(sim.plan().Report().chunk_retries, 0u);
}

}  // namespace
}  // namespace tensorhub::client
