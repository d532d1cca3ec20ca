// Retain, the keeper and reader groups end to end: a real hub, real clients
// and the real TCP data plane, in this process; the keeper-killed case with
// the keeper in its own process (SIGKILL).
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <future>
#include <sstream>
#include <thread>

#include "client/keeper.h"
#include "common/deadline.h"
#include "common/test_point.h"
#include "demo_model.h"
#include "hub/hub_service.h"
#include "process_util.h"
#include "subprocess.h"
#include "tensorhub/client.h"
#include "test_roles.h"

namespace tensorhub::testing {
namespace {

using cli::Subprocess;
using cli::SyntheticModel;
using client::Keeper;
using client::KeeperOptions;

constexpr uint64_t kBytes = 8ull << 20;

class RetainE2E : public ::testing::Test {
 protected:
  void StartHub(uint32_t keep_latest = 0, int64_t lease_ms = 5000) {
    HubOptions o;
    o.listen_address = "127.0.0.1:0";
    o.lease_ms = lease_ms;
    o.keep_latest = keep_latest;
    auto hub = hub::HubServer::Start(o);
    ASSERT_TRUE(hub.ok()) << hub.status().ToString();
    hub_ = std::move(hub).value();
  }
  ClientOptions Options(const std::string& name,
                        WorkerClass cls = WorkerClass::kReliable) {
    ClientOptions o;
    o.hub_address = hub_->address();
    o.name = name;
    o.worker_class = cls;
    o.heartbeat_interval_ms = 200;
    // Tests end with workers holding retained versions; do not let every
    // teardown wait for a keeper. The test of the leave wait sets its own.
    o.leave_timeout_ms = 200;
    return o;
  }
  std::unique_ptr<Client> NewClient(const std::string& name,
                                    WorkerClass cls = WorkerClass::kReliable,
                                    int64_t leave_timeout_ms = 200) {
    ClientOptions o = Options(name, cls);
    o.leave_timeout_ms = leave_timeout_ms;
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  std::unique_ptr<Keeper> NewKeeper(uint64_t limit = 0) {
    KeeperOptions ko;
    ko.client = Options("keeper");
    ko.memory_limit_bytes = limit;
    ko.poll_wait_ms = 500;
    auto k = Keeper::Start(ko);
    EXPECT_TRUE(k.ok()) << k.status().ToString();
    return k.ok() ? std::move(k).value() : nullptr;
  }
  // The keeper counts a copy just after the hub learned of it (which is
  // what releases a waiting unpublish), so poll its counters briefly.
  static client::KeeperStats StatsWhen(
      Keeper& k, bool (*pred)(const client::KeeperStats&)) {
    Deadline d = Deadline::AfterMs(10000);
    while (!d.expired() && !pred(k.stats())) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return k.stats();
  }
  static bool Fetched(const client::KeeperStats& s) { return s.fetched > 0; }
  static bool Released(const client::KeeperStats& s) { return s.released > 0; }

  // Polls Describe until `pred` holds or 10 s pass.
  template <typename Pred>
  Result<VersionInfo> WaitFor(Client& c, const std::string& model, Version v,
                              Pred pred) {
    Deadline d = Deadline::AfterMs(10000);
    Result<VersionInfo> info = NotFound("not yet");
    while (!d.expired()) {
      info = c.Describe(model, v);
      if (info.ok() && pred(*info)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return info;
  }
  uint64_t FetchDigest(Client& c, const std::string& model, Version v,
                       Version* got = nullptr, const std::string& group = "",
                       uint64_t step = 0) {
    SyntheticModel dst(TestLayout(kBytes));
    FetchOptions fo;
    fo.timeout_ms = 30000;
    fo.group = group;
    fo.group_step = step;
    fo.serve = false;  // `dst` goes away on return
    auto st = c.Fetch(model, v, dst.tensors(), fo);
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    if (!st.ok()) return 0;
    if (got != nullptr) *got = st->version;
    return dst.Digest();
  }

  std::unique_ptr<hub::HubServer> hub_;
};

TEST_F(RetainE2E, RetainedVersionSurvivesTheTrainerUnpublishing) {
  StartHub();
  SyntheticModel src(TestLayout(kBytes));
  src.Fill(1);
  auto trainer = NewClient("trainer");
  ASSERT_TRUE(trainer->Publish("m", Version(1), src.tensors()).ok());
  ASSERT_TRUE(trainer->Retain("m", Version(1)).ok());
  auto info = trainer->Describe("m", Version(1));
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->retained);

  // No keeper: the unpublish waits, then refuses and keeps the reference.
  auto t0 = NowMs();
  Status s = trainer->Unpublish("m", Version(1), 1500);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("tensorhub keeper"), std::string::npos)
      << s.ToString();
  EXPECT_GE(NowMs() - t0, 1000);
  EXPECT_LT(NowMs() - t0, 1500 + kDeadlineSlackMs);  // by its own deadline
  auto reader = NewClient("reader");
  EXPECT_EQ(FetchDigest(*reader, "m", Version(1)), src.Digest());

  // With a keeper, the unpublish waits until the keeper copied it.
  auto keeper = NewKeeper();
  ASSERT_TRUE(trainer->Unpublish("m", Version(1), 20000).ok());
  EXPECT_EQ(StatsWhen(*keeper, Fetched).fetched, 1u);
  // The trainer may now overwrite its memory; the bytes live on.
  const uint64_t published = src.Digest();
  src.Fill(99);
  auto late = NewClient("late");
  EXPECT_EQ(FetchDigest(*late, "m", Version(1)), published);
  info = late->Describe("m", Version(1));
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state, VersionState::kCommitted);
  EXPECT_TRUE(info->retained);
  bool keeper_holds = false;
  for (const HolderInfo& h : info->holders)
    keeper_holds |= h.worker == keeper->id();
  EXPECT_TRUE(keeper_holds);

  // Unretained: the keeper drops its copy.
  ASSERT_TRUE(late->Unretain("m", Version(1)).ok());
  EXPECT_EQ(StatsWhen(*keeper, Released).released, 1u);
  EXPECT_EQ(keeper->stats().bytes_held, 0u);
}

TEST_F(RetainE2E, ForcedUnpublishDropsTheReference) {
  StartHub();
  SyntheticModel src(TestLayout(kBytes));
  src.Fill(1);
  auto trainer = NewClient("trainer");
  ASSERT_TRUE(trainer->Publish("m", Version(1), src.tensors()).ok());
  ASSERT_TRUE(trainer->Retain("m", Version(1)).ok());
  ASSERT_TRUE(trainer->Unpublish("m", Version(1), 5000, /*force=*/true).ok());
  auto info = trainer->Describe("m", Version(1));
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state, VersionState::kUnavailable);
}

TEST_F(RetainE2E, SpotReaderLeavingWaitsForTheKeeper) {
  StartHub();
  SyntheticModel src(TestLayout(kBytes));
  src.Fill(3);
  auto trainer = NewClient("trainer");
  auto spot = NewClient("spot", WorkerClass::kSpot, /*leave_timeout_ms=*/20000);
  ASSERT_TRUE(trainer->Publish("m", Version(3), src.tensors()).ok());
  ASSERT_TRUE(trainer->Retain("m", Version(3)).ok());
  SyntheticModel spot_copy(TestLayout(kBytes));
  FetchOptions fo;
  fo.timeout_ms = 30000;
  ASSERT_TRUE(spot->Fetch("m", Version(3), spot_copy.tensors(), fo).ok());
  // The trainer goes without waiting (forced): only the spot copy is left.
  ASSERT_TRUE(trainer->Unpublish("m", Version(3), 5000, true).ok());
  trainer.reset();
  // The spot worker shuts down; its leave waits (still serving) ...
  std::promise<void> held;
  std::atomic<bool> said{false};
  testpoint::Arm("hub.departure_held", [&](uint64_t) {
    if (!said.exchange(true)) held.set_value();
  });
  std::thread leaving([&] { spot.reset(); });
  // ... once the hub holds it, for the keeper that starts then to copy it.
  const bool was_held = held.get_future().wait_for(std::chrono::seconds(20)) ==
                        std::future_status::ready;
  testpoint::Disarm("hub.departure_held");
  auto keeper = NewKeeper();
  leaving.join();
  ASSERT_TRUE(was_held) << "the hub never held the spot worker's leave";
  EXPECT_EQ(StatsWhen(*keeper, Fetched).fetched, 1u);
  auto reader = NewClient("reader");
  EXPECT_EQ(FetchDigest(*reader, "m", Version(3)), src.Digest());
}

TEST_F(RetainE2E, KeepLatestRetainsNewestAndKeeperReleasesOlder) {
  StartHub(/*keep_latest=*/1);
  SyntheticModel a(TestLayout(kBytes)),
      b(TestLayout(kBytes));  // outlive clients
  auto keeper = NewKeeper();
  auto trainer = NewClient("trainer");
  a.Fill(1);
  ASSERT_TRUE(trainer->Publish("m", Version(1), a.tensors()).ok());
  auto info = trainer->Describe("m", Version(1));
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->retained);
  // The latest version: its unpublish waits for the keeper's copy.
  ASSERT_TRUE(trainer->Unpublish("m", Version(1), 20000).ok());
  EXPECT_EQ(StatsWhen(*keeper, Fetched).fetched, 1u);
  // A newer version commits: version 1 leaves retention and the keeper
  // drops it (so it becomes unavailable: nobody else holds it).
  b.Fill(2);
  ASSERT_TRUE(trainer->Publish("m", Version(2), b.tensors()).ok());
  info = WaitFor(*trainer, "m", Version(1), [](const VersionInfo& v) {
    return v.state == VersionState::kUnavailable;
  });
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->state, VersionState::kUnavailable);
  EXPECT_FALSE(info->retained);
  EXPECT_EQ(StatsWhen(*keeper, Released).released, 1u);
  auto v2 = trainer->Describe("m", Version(2));
  ASSERT_TRUE(v2.ok());
  EXPECT_TRUE(v2->retained);
}

TEST_F(RetainE2E, KeeperRefusesWhatDoesNotFitItsMemoryLimit) {
  StartHub();
  auto keeper = NewKeeper(/*limit=*/1 << 20);
  SyntheticModel src(TestLayout(kBytes));
  src.Fill(1);
  auto trainer = NewClient("trainer");
  ASSERT_TRUE(trainer->Publish("m", Version(1), src.tensors()).ok());
  ASSERT_TRUE(trainer->Retain("m", Version(1)).ok());
  Status s = trainer->Unpublish("m", Version(1), 1500);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_EQ(keeper->stats().refused, 1u);
  EXPECT_EQ(keeper->stats().bytes_held, 0u);
  // Still published and fetchable: nothing changed.
  auto reader = NewClient("reader");
  EXPECT_EQ(FetchDigest(*reader, "m", Version(1)), src.Digest());
}

TEST_F(RetainE2E, ReaderGroupRanksFetchTheSameVersion) {
  StartHub();
  SyntheticModel v1(TestLayout(kBytes)),
      v2(TestLayout(kBytes));  // outlive clients
  auto trainer = NewClient("trainer");
  v1.Fill(1);
  v2.Fill(2);
  ASSERT_TRUE(trainer->Publish("m", Version(1), v1.tensors()).ok());
  std::vector<std::unique_ptr<Client>> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.push_back(NewClient("rank" + std::to_string(r)));
  auto solo = NewClient("solo");
  Version got;
  EXPECT_EQ(FetchDigest(*ranks[0], "m", Version::Latest(), &got, "inst-a", 10),
            v1.Digest());
  EXPECT_EQ(got, Version(1));
  // Version 2 commits between rank 0's fetch and the others'.
  ASSERT_TRUE(trainer->Publish("m", Version(2), v2.tensors()).ok());
  for (int r = 1; r < 3; ++r) {
    EXPECT_EQ(
        FetchDigest(*ranks[r], "m", Version::Latest(), &got, "inst-a", 10),
        v1.Digest());
    EXPECT_EQ(got, Version(1)) << "rank " << r;
  }
  // Without a group, latest is version 2; the group's next step too.
  EXPECT_EQ(FetchDigest(*solo, "m", Version::Latest(), &got), v2.Digest());
  EXPECT_EQ(got, Version(2));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(
        FetchDigest(*ranks[r], "m", Version::Latest(), &got, "inst-a", 11),
        v2.Digest());
    EXPECT_EQ(got, Version(2));
  }
  // Describe with the group reports the pin (the CLI resolves this way).
  auto info = solo->Describe("m", Version::Latest(), "inst-a", 10);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->version, Version(1));
}

// ---------------------------------------------------------- multi-process

TEST_F(RetainE2E, KeeperProcessKeepsTheVersionUntilKilledThenUnavailable) {
  StartHub(/*keep_latest=*/0, /*lease_ms=*/1000);
  const std::string addr = hub_->address();
  const std::string bytes = std::to_string(kBytes);
  Subprocess trainer =
      MustSpawn({"--role=trainer", "--hub", addr, "--bytes", bytes});
  Subprocess keeper = MustSpawn({"--role=keeper", "--hub", addr});
  auto ready = keeper.ReadLine(Deadline::AfterMs(30000));
  ASSERT_TRUE(ready.ok() && Word(*ready, 0) == "ready")
      << ready.status().ToString();
  std::string pub = Ask(trainer, "publish 1");
  ASSERT_EQ(Word(pub, 0), "published") << pub;
  auto observer = NewClient("observer");
  ASSERT_TRUE(observer->Retain("test-model", Version(1)).ok());
  // The trainer process unpublishes: the keeper process copies first.
  ASSERT_EQ(Ask(trainer, "unpublish 1"), "unpublished 1");
  Subprocess reader =
      MustSpawn({"--role=reader", "--hub", addr, "--bytes", bytes});
  EXPECT_EQ(Ask(reader, "fetch 1"), "fetched 1 " + Word(pub, 2));
  // The reader (reliable) also holds it now; it leaves first, waiting for
  // nothing (the keeper has a reliable copy).
  reader.Stop(5000);
  // The keeper dies without leaving: the last reliable copy is gone, and
  // the version is reported UNAVAILABLE, never silently dropped.
  ::kill(keeper.pid(), SIGKILL);
  keeper.Stop(1000);
  auto info =
      WaitFor(*observer, "test-model", Version(1), [](const VersionInfo& v) {
        return v.state == VersionState::kUnavailable;
      });
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->state, VersionState::kUnavailable);
  EXPECT_TRUE(info->retained);
  SyntheticModel dst(TestLayout(kBytes));
  FetchOptions fo;
  fo.timeout_ms = 3000;
  auto t0 = NowMs();
  auto st = observer->Fetch("test-model", Version(1), dst.tensors(), fo);
  EXPECT_EQ(st.status().code(), StatusCode::kUnavailable)
      << st.status().ToString();
  EXPECT_LT(NowMs() - t0, fo.timeout_ms + kDeadlineSlackMs);  // by its deadline
}

TEST_F(RetainE2E, RetainedVersionSurvivesAHubRestart) {
  const int port = FreePort();
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  const std::string bytes = std::to_string(kBytes);
  auto start_hub = [&] {
    Subprocess h = MustSpawn(
        {"--role=hub", "--port", std::to_string(port), "--lease-ms", "2000"});
    auto ready = h.ReadLine(Deadline::AfterMs(30000));
    EXPECT_TRUE(ready.ok() && Word(*ready, 0) == "ready");
    return h;
  };
  Subprocess hub = start_hub();
  Subprocess trainer =
      MustSpawn({"--role=trainer", "--hub", addr, "--bytes", bytes});
  Subprocess keeper = MustSpawn({"--role=keeper", "--hub", addr});
  auto ready = keeper.ReadLine(Deadline::AfterMs(30000));
  ASSERT_TRUE(ready.ok() && Word(*ready, 0) == "ready");
  std::string pub = Ask(trainer, "publish 1");
  ASSERT_EQ(Word(pub, 0), "published") << pub;
  ClientOptions o;
  o.hub_address = addr;
  o.name = "observer";
  o.heartbeat_interval_ms = 200;
  o.leave_timeout_ms = 0;
  auto observer = Client::Connect(o);
  ASSERT_TRUE(observer.ok()) << observer.status().ToString();
  ASSERT_TRUE((*observer)->Retain("test-model", Version(1)).ok());
  ASSERT_EQ(Ask(trainer, "unpublish 1"), "unpublished 1");  // keeper copied
  // The hub dies and comes back: it forgot the pin; the keeper re-reports
  // its copy and pins it again instead of dropping it.
  ::kill(hub.pid(), SIGKILL);
  hub.Stop(1000);
  Subprocess hub2 = start_hub();
  auto info =
      WaitFor(**observer, "test-model", Version(1), [](const VersionInfo& v) {
        return v.state == VersionState::kCommitted && v.retained;
      });
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->state, VersionState::kCommitted);
  EXPECT_TRUE(info->retained);
  Subprocess reader =
      MustSpawn({"--role=reader", "--hub", addr, "--bytes", bytes});
  EXPECT_EQ(Ask(reader, "fetch 1"), "fetched 1 " + Word(pub, 2));
}

}  // namespace
}  // namespace tensorhub::testing

int main(int argc, char** argv) {
  return tensorhub::testing::RoleOrTestsMain(argc, argv,
                                             &tensorhub::testing::MaybeRunRole);
}
