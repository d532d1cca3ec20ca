// Unit tests of the hub state machine's retention (Retain, keep-latest K,
// the reliable-copy guarantee, keeper tasks) and reader-group pins.
#include <gtest/gtest.h>

#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "common/manifest.h"
#include "hub/hub_state.h"

namespace tensorhub::hub {
namespace {

class RetainTest : public ::testing::Test {
 protected:
  static HubConfig Config(uint32_t keep_latest = 0) {
    HubConfig c;
    c.lease_ms = 1000;
    c.keep_latest = keep_latest;
    c.max_steps_per_group = 3;
    c.max_groups = 4;
    c.group_ttl_ms = 10000;
    return c;
  }
  RetainTest() : hub_(Config()) {}

  WorkerId Register(const std::string& name,
                    WorkerClass cls = WorkerClass::kReliable) {
    WorkerRegistration reg;
    reg.name = name;
    reg.data_address = name + ":9000";
    reg.worker_class = cls;
    Result<WorkerId> id = hub_.RegisterWorker(reg, 0);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : WorkerId();
  }

  // A one-rank version of two chunks.
  std::vector<PartLayout> Parts(uint8_t seed, uint32_t ranks = 1) {
    std::vector<PartLayout> parts;
    for (uint32_t r = 0; r < ranks; ++r) {
      std::vector<uint8_t>& buf = buffers_.emplace_back(kMinChunkBytes + 7);
      for (size_t i = 0; i < buf.size(); ++i) {
        buf[i] = static_cast<uint8_t>(seed * 31 + r * 7 + i);
      }
      std::vector<TensorRef> t = {
          {{"w" + std::to_string(r), DType::kU8, {buf.size()}},
           buf.data(),
           buf.size(),
           MemoryLocation::Host()}};
      Result<PartLayout> p = BuildPartLayout(r, t, kMinChunkBytes);
      EXPECT_TRUE(p.ok());
      parts.push_back(*p);
    }
    return parts;
  }

  void Publish(const WorkerId& w, const std::string& model, uint64_t version,
               const std::vector<PartLayout>& parts, uint32_t rank = 0) {
    PublishArgs a;
    a.worker = w;
    a.model = model;
    a.version = Version(version);
    a.rank = rank;
    a.group_size = static_cast<uint32_t>(parts.size());
    a.chunk_bytes = kMinChunkBytes;
    a.part = parts[rank];
    a.epoch = 1;
    ASSERT_TRUE(hub_.Publish(a, 0).ok());
  }

  void Hold(const WorkerId& w, const std::string& model, uint64_t version,
            const std::vector<PartLayout>& parts, bool filling = false) {
    Manifest m(static_cast<uint32_t>(parts.size()), kMinChunkBytes, parts);
    ASSERT_TRUE(
        hub_.AddHolder(w, model, Version(version), 2, m, 0, filling).ok());
  }

  bool Retained(const std::string& model, uint64_t v) {
    return hub_.IsRetained(model, Version(v));
  }

  HubState hub_;
  std::deque<std::vector<uint8_t>> buffers_;
};

TEST_F(RetainTest, RetainAndUnretain) {
  WorkerId t = Register("t");
  auto p = Parts(1);
  Publish(t, "m", 1, p);
  EXPECT_FALSE(Retained("m", 1));
  ASSERT_TRUE(hub_.Retain("m", Version(1), true).ok());
  EXPECT_TRUE(Retained("m", 1));
  EXPECT_TRUE(hub_.List()[0].versions[0].retained);
  EXPECT_TRUE(hub_.Resolve(t, "m", Version(1), false)->retained);
  ASSERT_TRUE(hub_.Retain("m", Version(1), true).ok());  // idempotent
  ASSERT_TRUE(hub_.Retain("m", Version(1), false).ok());
  EXPECT_FALSE(Retained("m", 1));
  EXPECT_EQ(hub_.Retain("m", Version(1), false).code(), StatusCode::kNotFound);
  EXPECT_EQ(hub_.Retain("m", Version(9), true).code(), StatusCode::kNotFound);
  EXPECT_EQ(hub_.Retain("m", Version::Latest(), true).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(hub_.Retain("bad name", Version(1), true).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(RetainTest, AbortedOrUnavailableVersionCannotBeRetained) {
  WorkerId a = Register("a"), b = Register("b");
  auto g = Parts(1, 2);
  Publish(a, "m", 1, g, 0);
  ASSERT_TRUE(hub_.Unpublish(a, "m", Version(1), 0).ok());  // aborts
  EXPECT_EQ(hub_.Retain("m", Version(1), true).code(),
            StatusCode::kFailedPrecondition);
  auto p = Parts(2);
  Publish(b, "m", 2, p);
  ASSERT_TRUE(hub_.Unpublish(b, "m", Version(2), 0).ok());  // unavailable
  EXPECT_EQ(hub_.Retain("m", Version(2), true).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_FALSE(Retained("m", 2));
}

TEST_F(RetainTest, ExplicitPinsAreBounded) {
  HubConfig c = Config();
  c.max_retained_per_model = 2;
  hub_ = HubState(c);
  WorkerId t = Register("t");
  for (uint64_t v = 1; v <= 3; ++v) Publish(t, "m", v, Parts(1));
  ASSERT_TRUE(hub_.Retain("m", Version(1), true).ok());
  ASSERT_TRUE(hub_.Retain("m", Version(2), true).ok());
  EXPECT_EQ(hub_.Retain("m", Version(3), true).code(),
            StatusCode::kResourceExhausted);
  EXPECT_FALSE(Retained("m", 3));
}

TEST_F(RetainTest, KeepLatestRetainsTheNewestCommittedVersions) {
  hub_ = HubState(Config(/*keep_latest=*/2));
  WorkerId t = Register("t"), u = Register("u");
  Publish(t, "m", 1, Parts(1));
  Publish(t, "m", 2, Parts(2));
  EXPECT_TRUE(Retained("m", 1));
  EXPECT_TRUE(Retained("m", 2));
  // A pending version does not push an older one out.
  auto g = Parts(3, 2);
  Publish(t, "m", 3, g, 0);
  EXPECT_TRUE(Retained("m", 1));
  EXPECT_FALSE(Retained("m", 3));
  // Once it commits, version 1 drops out of retention.
  Publish(u, "m", 3, g, 1);
  EXPECT_FALSE(Retained("m", 1));
  EXPECT_TRUE(Retained("m", 2));
  EXPECT_TRUE(Retained("m", 3));
  // ... and may be unpublished without waiting; a kept one may not be
  // unretained (it is the policy's, not a pin).
  EXPECT_TRUE(hub_.CheckDeparture(t, "m", Version(1)).ok());
  EXPECT_EQ(hub_.Retain("m", Version(2), false).code(), StatusCode::kNotFound);
  // Models are independent.
  Publish(t, "other", 1, Parts(4));
  EXPECT_TRUE(Retained("other", 1));
  EXPECT_TRUE(Retained("m", 2));
}

TEST_F(RetainTest, UnpublishOfLastReliableCopyIsBlockedUntilAKeeperCopies) {
  WorkerId t = Register("trainer");
  WorkerId k = Register("keeper");
  auto p = Parts(1);
  Publish(t, "m", 1, p);
  // Not retained: nothing to wait for; the keeper has nothing to do.
  EXPECT_TRUE(hub_.CheckDeparture(t, "m", Version(1)).ok());
  EXPECT_TRUE(hub_.KeeperTasks(k).empty());
  ASSERT_TRUE(hub_.Retain("m", Version(1), true).ok());
  Status s = hub_.CheckDeparture(t, "m", Version(1));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("tensorhub keeper"), std::string::npos)
      << s.ToString();
  EXPECT_EQ(hub_.BlockedDepartures(t),
            (std::vector<std::pair<std::string, Version>>{{"m", Version(1)}}));
  // The trainer is a reliable copy until it starts to leave: then the
  // keeper is asked to copy.
  EXPECT_TRUE(hub_.KeeperTasks(k).empty());
  hub_.SetDeparting(t, "m", Version(1), true);
  KeeperWork w = hub_.KeeperTasks(k);
  ASSERT_EQ(w.fetch.size(), 1u);
  EXPECT_EQ(w.fetch[0], (KeeperTask{"m", Version(1), kMinChunkBytes + 7}));
  EXPECT_EQ(w.pinned, w.fetch);  // a Retain pin, not keep-latest
  // The keeper's copy in progress does not count yet, but is not asked
  // for twice.
  Hold(k, "m", 1, p, /*filling=*/true);
  EXPECT_FALSE(hub_.CheckDeparture(t, "m", Version(1)).ok());
  EXPECT_TRUE(hub_.KeeperTasks(k).empty());
  EXPECT_TRUE(hub_.KeeperTasks(Register("keeper2")).empty());
  Hold(k, "m", 1, p);
  EXPECT_TRUE(hub_.CheckDeparture(t, "m", Version(1)).ok());
  EXPECT_TRUE(hub_.Unpublish(t, "m", Version(1), 0).ok());
  EXPECT_EQ(hub_.Resolve(t, "m", Version(1), false)->holders.size(), 1u);
  // Now the keeper holds the last reliable copy; it is told of the pin (to
  // restore it after a hub restart).
  EXPECT_FALSE(hub_.CheckDeparture(k, "m", Version(1)).ok());
  EXPECT_TRUE(hub_.KeeperTasks(k).empty());
  ASSERT_EQ(hub_.KeeperTasks(k).pinned.size(), 1u);
  EXPECT_EQ(hub_.KeeperTasks(k).pinned[0].version, Version(1));
  // Unretained: the keeper is told to release it, and may.
  ASSERT_TRUE(hub_.Retain("m", Version(1), false).ok());
  w = hub_.KeeperTasks(k);
  ASSERT_EQ(w.release.size(), 1u);
  EXPECT_EQ(w.release[0].version, Version(1));
  EXPECT_TRUE(hub_.CheckDeparture(k, "m", Version(1)).ok());
}

TEST_F(RetainTest, AnotherReliableHolderLetsTheTrainerGoAtOnce) {
  WorkerId t = Register("trainer");
  WorkerId r = Register("reader");
  WorkerId s = Register("spot", WorkerClass::kSpot);
  auto p = Parts(1);
  Publish(t, "m", 1, p);
  ASSERT_TRUE(hub_.Retain("m", Version(1), true).ok());
  Hold(s, "m", 1, p);
  // A spot copy is no reliable copy.
  EXPECT_FALSE(hub_.CheckDeparture(t, "m", Version(1)).ok());
  Hold(r, "m", 1, p);
  EXPECT_TRUE(hub_.CheckDeparture(t, "m", Version(1)).ok());
  // Two reliable holders departing at once: the second to ask must wait.
  hub_.SetDeparting(t, "m", Version(1), true);
  EXPECT_FALSE(hub_.CheckDeparture(r, "m", Version(1)).ok());
  hub_.SetDeparting(t, "m", Version(1), false);
  EXPECT_TRUE(hub_.CheckDeparture(r, "m", Version(1)).ok());
}

TEST_F(RetainTest, GroupRanksTogetherFormTheReliableCopy) {
  WorkerId a = Register("a"), b = Register("b"), k = Register("k");
  auto g = Parts(1, 2);
  Publish(a, "m", 1, g, 0);
  Publish(b, "m", 1, g, 1);
  ASSERT_TRUE(hub_.Retain("m", Version(1), true).ok());
  // Each rank holds the only copy of its part.
  EXPECT_FALSE(hub_.CheckDeparture(a, "m", Version(1)).ok());
  EXPECT_FALSE(hub_.CheckDeparture(b, "m", Version(1)).ok());
  Hold(k, "m", 1, g);
  EXPECT_TRUE(hub_.CheckDeparture(a, "m", Version(1)).ok());
  EXPECT_TRUE(hub_.CheckDeparture(b, "m", Version(1)).ok());
}

TEST_F(RetainTest, SpotOnlyCopiesAreCopiedAndTheLastSpotMustWait) {
  WorkerId t = Register("trainer");
  WorkerId s1 = Register("s1", WorkerClass::kSpot);
  WorkerId s2 = Register("s2", WorkerClass::kSpot);
  WorkerId k = Register("k");
  auto p = Parts(1);
  Publish(t, "m", 1, p);
  Hold(s1, "m", 1, p);
  Hold(s2, "m", 1, p);
  ASSERT_TRUE(hub_.Retain("m", Version(1), true).ok());
  ASSERT_TRUE(hub_.Unpublish(t, "m", Version(1), 0).ok());  // not checked here
  // Only spot copies are left: the keeper copies at once.
  ASSERT_EQ(hub_.KeeperTasks(k).fetch.size(), 1u);
  // A spot holder that is not the last copy may go.
  EXPECT_TRUE(hub_.CheckDeparture(s1, "m", Version(1)).ok());
  EXPECT_TRUE(hub_.BlockedDepartures(s1).empty());
  ASSERT_TRUE(hub_.Leave(s1).ok());
  // The last one waits for a reliable copy.
  EXPECT_FALSE(hub_.CheckDeparture(s2, "m", Version(1)).ok());
  EXPECT_EQ(hub_.BlockedDepartures(s2).size(), 1u);
  Hold(k, "m", 1, p);
  EXPECT_TRUE(hub_.BlockedDepartures(s2).empty());
}

TEST_F(RetainTest, KilledLastReliableCopyMakesTheVersionUnavailable) {
  WorkerId t = Register("trainer");
  WorkerId k = Register("keeper");
  auto p = Parts(1);
  Publish(t, "m", 1, p);
  ASSERT_TRUE(hub_.Retain("m", Version(1), true).ok());
  Hold(k, "m", 1, p);
  ASSERT_TRUE(hub_.Unpublish(t, "m", Version(1), 0).ok());
  // The keeper's heartbeats stop (killed): its lease ends.
  ASSERT_TRUE(hub_.Heartbeat(t, 5000).ok());
  hub_.ExpireLeases(1500);
  EXPECT_EQ(hub_.Resolve(t, "m", Version(1), false).status().code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(hub_.List()[0].versions[0].state, VersionState::kUnavailable);
  EXPECT_TRUE(hub_.List()[0].versions[0].retained);
  // Unavailable: no keeper task (nothing to copy from), no departure wait.
  EXPECT_TRUE(hub_.KeeperTasks(t).empty());
}

TEST_F(RetainTest, KeeperIsNotAskedForWhatItHolds) {
  hub_ = HubState(Config(/*keep_latest=*/1));
  WorkerId s = Register("spot", WorkerClass::kSpot);
  WorkerId k = Register("k");
  auto p1 = Parts(1), p2 = Parts(2);
  Publish(s, "m", 1, p1);
  ASSERT_EQ(hub_.KeeperTasks(k).fetch.size(), 1u);
  Hold(k, "m", 1, p1);
  EXPECT_TRUE(hub_.KeeperTasks(k).empty());
  // A newer version commits: 1 leaves retention, the keeper releases it and
  // is asked for 2.
  Publish(s, "m", 2, p2);
  KeeperWork w = hub_.KeeperTasks(k);
  ASSERT_EQ(w.release.size(), 1u);
  EXPECT_EQ(w.release[0].version, Version(1));
  ASSERT_EQ(w.fetch.size(), 1u);
  EXPECT_EQ(w.fetch[0].version, Version(2));
}

// ------------------------------------------------------------ reader groups

TEST_F(RetainTest, GroupRanksGetTheVersionTheFirstRankResolved) {
  WorkerId t = Register("t");
  WorkerId r0 = Register("r0"), r1 = Register("r1");
  Publish(t, "m", 1, Parts(1));
  Result<Resolution> a = hub_.ResolveForGroup(r0, "m", "inst-0", 7, 0);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->version, Version(1));
  // A newer version commits between rank 0's and rank 1's resolve.
  Publish(t, "m", 2, Parts(2));
  Result<Resolution> b = hub_.ResolveForGroup(r1, "m", "inst-0", 7, 1);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->version, Version(1));
  ASSERT_TRUE(b->manifest.has_value());
  // Another group, or the next step, sees the new version.
  EXPECT_EQ(hub_.ResolveForGroup(r1, "m", "inst-1", 7, 1)->version, Version(2));
  EXPECT_EQ(hub_.ResolveForGroup(r0, "m", "inst-0", 8, 1)->version, Version(2));
  EXPECT_EQ(hub_.ResolveForGroup(r1, "m", "inst-0", 7, 1)->version, Version(1));
  EXPECT_EQ(hub_.num_group_pins(), 3u);
}

TEST_F(RetainTest, PinnedVersionThatBecameUnavailableIsAClearError) {
  WorkerId t = Register("t"), u = Register("u");
  Publish(t, "m", 1, Parts(1));
  ASSERT_TRUE(hub_.ResolveForGroup(t, "m", "g", 1, 0).ok());
  Publish(u, "m", 2, Parts(2));
  ASSERT_TRUE(hub_.Unpublish(t, "m", Version(1), 0).ok());
  Result<Resolution> r = hub_.ResolveForGroup(u, "m", "g", 1, 0);
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("pinned to 'm@1'"), std::string::npos)
      << r.status().ToString();
}

TEST_F(RetainTest, GroupPinsAreBounded) {
  WorkerId t = Register("t");
  Publish(t, "m", 1, Parts(1));
  // Per group: the newest 3 steps; an older step is refused, not re-pinned.
  for (uint64_t step = 1; step <= 5; ++step) {
    ASSERT_TRUE(hub_.ResolveForGroup(t, "m", "g", step, 0).ok());
  }
  EXPECT_EQ(hub_.num_group_pins(), 3u);
  Result<Resolution> old = hub_.ResolveForGroup(t, "m", "g", 2, 0);
  EXPECT_EQ(old.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(hub_.ResolveForGroup(t, "m", "g", 3, 0).ok());
  // In all: at most 4 groups, the one unused for longest goes first.
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(
        hub_.ResolveForGroup(t, "m", "h" + std::to_string(i), 1, 10 + i).ok());
  }
  EXPECT_EQ(hub_.num_group_pins(), 4u);  // "g" (3 pins) was evicted
  // Unused groups expire.
  hub_.ExpireGroups(10 + 10000);
  EXPECT_EQ(hub_.num_group_pins(), 3u);
  hub_.ExpireGroups(20000);
  EXPECT_EQ(hub_.num_group_pins(), 0u);
  // Bad input changes nothing.
  EXPECT_EQ(hub_.ResolveForGroup(t, "m", "", 1, 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      hub_.ResolveForGroup(t, "m", std::string(300, 'x'), 1, 0).status().code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(hub_.ResolveForGroup(t, "nope", "g", 1, 0).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(hub_.num_group_pins(), 0u);
}

}  // namespace
}  // namespace tensorhub::hub
