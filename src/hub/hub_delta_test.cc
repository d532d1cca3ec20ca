// The hub's side of deltas (docs/design.md, "Deltas on slow links"): which
// deltas (base -> version) exist and where, who computes one, and which
// reader is offered one. Pure state machine, time driven by hand.
#include <gtest/gtest.h>

#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "common/manifest.h"
#include "hub/hub_state.h"

namespace tensorhub::hub {
namespace {

Labels Dc(std::string dc, std::string host) {
  return Labels{std::move(dc), "rack", std::move(host)};
}

class HubDeltaTest : public ::testing::Test {
 protected:
  HubDeltaTest() : hub_(Config()) {}
  static HubConfig Config() {
    HubConfig c;
    c.lease_ms = 1000;
    return c;
  }

  WorkerId Register(const std::string& name, Labels labels,
                    bool nearby_deltas = false) {
    WorkerRegistration reg;
    reg.name = name;
    reg.data_address = "tcp://" + name + ":9000";
    reg.labels = std::move(labels);
    reg.nearby_deltas = nearby_deltas;
    Result<WorkerId> id = hub_.RegisterWorker(reg, 0);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : WorkerId();
  }

  // A one-rank version of `chunks` chunks whose bytes depend on `seed`.
  Manifest Make(uint64_t chunks, uint8_t seed) {
    std::vector<uint8_t>& buf = buffers_.emplace_back(chunks * kMinChunkBytes);
    for (size_t i = 0; i < buf.size(); ++i) {
      buf[i] = static_cast<uint8_t>(seed + i * 7);
    }
    TensorRef t{TensorSpec{"w", DType::kU8, {buf.size()}}, buf.data(),
                buf.size(), MemoryLocation::Host()};
    Result<PartLayout> p = BuildPartLayout(0, {&t, 1}, kMinChunkBytes);
    EXPECT_TRUE(p.ok());
    return Manifest(1, kMinChunkBytes, {*p});
  }

  // `trainer` publishes model m, versions 1..n (one rank each, 4 chunks).
  void Publish(const WorkerId& trainer, uint64_t n, uint64_t chunks = 4) {
    for (uint64_t v = 1; v <= n; ++v) {
      manifests_.push_back(Make(chunks, static_cast<uint8_t>(v)));
      PublishArgs a;
      a.worker = trainer;
      a.model = "m";
      a.version = Version(v);
      a.group_size = 1;
      a.chunk_bytes = kMinChunkBytes;
      a.part = manifests_.back().parts()[0];
      a.epoch = 10 + v;
      ASSERT_EQ(*hub_.Publish(a, 0), VersionState::kCommitted);
    }
  }
  // `w` holds version v whole (a finished fetch).
  void Hold(const WorkerId& w, uint64_t v) {
    ASSERT_TRUE(
        hub_.AddHolder(w, "m", Version(v), 50, manifests_[v - 1], 0).ok());
  }
  Result<bool> Claim(const WorkerId& w, uint64_t v, uint64_t base) {
    return hub_.ClaimDelta(w, "m", Version(v), Version(base), 0);
  }
  Status Ready(const WorkerId& w, uint64_t v, uint64_t base,
               uint64_t bytes = 1000) {
    return hub_.AddDelta(w, "m", Version(v), Version(base), bytes, 0);
  }
  // `reader` starts a fetch of version v (BeginFetch), registered as a
  // filling holder under `fill_epoch` if given.
  Result<FetchStart> Begin(const WorkerId& reader, uint64_t v,
                           std::optional<uint64_t> fill_epoch = {}) {
    BeginFetchArgs b;
    b.reader = reader;
    b.model = "m";
    b.version = Version(v);
    b.fill_epoch = fill_epoch;
    return hub_.BeginFetch(b, 0);
  }
  std::vector<HolderView> Sources(const WorkerId& reader, uint64_t v) {
    auto s = hub_.Schedule(reader, "m", Version(v), {}, 4);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? *s : std::vector<HolderView>{};
  }

  HubState hub_;
  std::deque<std::vector<uint8_t>> buffers_;
  std::vector<Manifest> manifests_;  // version v at v - 1
};

TEST_F(HubDeltaTest, OneWorkerComputesEachDelta) {
  const WorkerId trainer = Register("trainer", Dc("a", "t"));
  const WorkerId keeper = Register("keeper", Dc("a", "k"));
  Publish(trainer, 3);
  for (uint64_t v : {1, 2, 3}) Hold(keeper, v);
  EXPECT_TRUE(*Claim(trainer, 2, 1));
  EXPECT_TRUE(*Claim(trainer, 2, 1));  // asking again: still its own
  EXPECT_FALSE(*Claim(keeper, 2, 1));  // claimed by the trainer
  EXPECT_TRUE(*Claim(keeper, 3, 1));   // another (base, version)
  EXPECT_FALSE(*Claim(trainer, 3, 1));
  EXPECT_TRUE(*Claim(trainer, 3, 2));
  // Ready or claimed, the trainer's delta (1 -> 2) stays the only one.
  ASSERT_TRUE(Ready(trainer, 2, 1).ok());
  EXPECT_FALSE(*Claim(keeper, 2, 1));
}

TEST_F(HubDeltaTest, ClaimNeedsBothVersionsWholeAndTheSameChunks) {
  const WorkerId trainer = Register("trainer", Dc("a", "t"));
  const WorkerId reader = Register("reader", Dc("b", "r"));
  Publish(trainer, 2);
  EXPECT_EQ(Claim(trainer, 2, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Claim(trainer, 1, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Claim(trainer, 9, 1).status().code(), StatusCode::kNotFound);
  // The reader holds version 2 only, and then 1 only filling.
  Hold(reader, 2);
  EXPECT_EQ(Claim(reader, 2, 1).status().code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(
      hub_.AddHolder(reader, "m", Version(1), 51, manifests_[0], 0, true).ok());
  EXPECT_EQ(Claim(reader, 2, 1).status().code(),
            StatusCode::kFailedPrecondition);
  // A version cut into other chunks than its base: no delta between them.
  const WorkerId other = Register("other", Dc("a", "o"));
  manifests_.push_back(Make(5, 3));  // version 3: 5 chunks, 2 has 4
  PublishArgs a;
  a.worker = other;
  a.model = "m";
  a.version = Version(3);
  a.group_size = 1;
  a.chunk_bytes = kMinChunkBytes;
  a.part = manifests_.back().parts()[0];
  a.epoch = 1;
  ASSERT_TRUE(hub_.Publish(a, 0).ok());
  Hold(other, 2);
  EXPECT_EQ(Claim(other, 3, 2).status().code(),
            StatusCode::kFailedPrecondition);
  // Sizes a delta of version 2 cannot have; a delta of a version the
  // worker does not hold.
  EXPECT_EQ(Ready(trainer, 2, 1, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Ready(trainer, 2, 1, 1ull << 40).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Ready(other, 1, 0).code(), StatusCode::kInvalidArgument);
  const WorkerId stranger = Register("stranger", Dc("a", "s"));
  EXPECT_EQ(Ready(stranger, 2, 1).code(), StatusCode::kFailedPrecondition);
}

TEST_F(HubDeltaTest, ReadyDeltaIsOfferedOnlyToReadersHoldingTheBase) {
  const WorkerId trainer = Register("trainer", Dc("a", "t"));
  const WorkerId with_base = Register("r1", Dc("b", "r1"));
  const WorkerId without = Register("r2", Dc("b", "r2"));
  Publish(trainer, 2);
  Hold(with_base, 1);
  ASSERT_TRUE(*Claim(trainer, 2, 1));
  // Claimed, not ready: nothing offered yet, but the reader may wait.
  std::vector<HolderView> s = Sources(with_base, 2);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(s[0].deltas.empty());
  EXPECT_TRUE(hub_.DeltaPending(with_base, "m", Version(2)));
  EXPECT_FALSE(hub_.DeltaPending(without, "m", Version(2)));
  ASSERT_TRUE(Ready(trainer, 2, 1, 1234).ok());
  EXPECT_FALSE(hub_.DeltaPending(with_base, "m", Version(2)));
  s = Sources(with_base, 2);
  ASSERT_EQ(s.size(), 1u);
  ASSERT_EQ(s[0].deltas.size(), 1u);
  EXPECT_EQ(s[0].deltas[0], (DeltaOffer{Version(1), 1234}));
  s = Sources(without, 2);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(s[0].deltas.empty());
  // Resolve lists it too; BeginFetch answers with it.
  auto res = hub_.Resolve(with_base, "m", Version(2), false);
  ASSERT_TRUE(res.ok());
  ASSERT_EQ(res->holders.size(), 1u);
  EXPECT_EQ(res->holders[0].deltas.size(), 1u);
  auto start = Begin(with_base, 2);
  ASSERT_TRUE(start.ok());
  ASSERT_EQ(start->sources.size(), 1u);
  EXPECT_EQ(start->sources[0].deltas.size(), 1u);
  EXPECT_FALSE(start->delta_pending);
}

TEST_F(HubDeltaTest, RemoteReaderReadsTheDeltaHolderAloneItsPeersReadIt) {
  // Datacenter a: the trainer (computed the delta 1 -> 2) and a newer full
  // holder, which Schedule would rank first. Datacenter b: two readers
  // holding version 1, one with no base.
  const WorkerId trainer = Register("trainer", Dc("a", "t"));
  const WorkerId full = Register("full", Dc("a", "f"));
  const WorkerId r1 = Register("r1", Dc("b", "r1"));
  const WorkerId r2 = Register("r2", Dc("b", "r2"));
  const WorkerId r3 = Register("r3", Dc("b", "r3"));
  Publish(trainer, 2);
  Hold(full, 2);
  Hold(r1, 1);
  Hold(r2, 1);
  ASSERT_TRUE(*Claim(trainer, 2, 1));
  ASSERT_TRUE(Ready(trainer, 2, 1).ok());
  // Without a base: the nearest full copies, across the link, striped.
  std::vector<HolderView> s = Sources(r3, 2);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].worker, full);
  hub_.FetchDone(r3, "m", Version(2));
  // With the base: the delta's holder alone.
  s = Sources(r1, 2);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].worker, trainer);
  EXPECT_EQ(s[0].deltas.size(), 1u);
  // r1 fills; r2 (also holding the base) reads from r1 inside its
  // datacenter, in full: the delta crossed the link once.
  ASSERT_TRUE(
      hub_.AddHolder(r1, "m", Version(2), 60, manifests_[1], 0, true).ok());
  ASSERT_TRUE(
      hub_.AddHolder(r2, "m", Version(2), 61, manifests_[1], 0, true).ok());
  s = Sources(r2, 2);
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(s[0].worker, r1);
  for (const HolderView& h : s) EXPECT_NE(h.worker, trainer);
  // The delta holder excluded (it failed the reader): full copies again.
  auto again = hub_.Schedule(r1, "m", Version(2), {trainer}, 4);
  ASSERT_TRUE(again.ok());
  ASSERT_FALSE(again->empty());
  EXPECT_EQ((*again)[0].worker, full);
}

TEST_F(HubDeltaTest, ARemoteDatacentersFirstReaderMakesTheDeltaForItsPeers) {
  // Datacenter a: the trainer with the delta 1 -> 2 and a keeper of both.
  // Datacenter b: three readers holding version 1.
  const WorkerId trainer = Register("trainer", Dc("a", "t"));
  const WorkerId keeper = Register("keeper", Dc("a", "k"));
  // b's links are slow: its readers take deltas from holders in b too.
  const WorkerId r1 = Register("r1", Dc("b", "r1"), true);
  const WorkerId r2 = Register("r2", Dc("b", "r2"), true);
  const WorkerId r3 = Register("r3", Dc("b", "r3"), true);
  Publish(trainer, 2);
  for (uint64_t v : {1, 2}) Hold(keeper, v);
  for (const WorkerId& r : {r1, r2, r3}) Hold(r, 1);
  ASSERT_TRUE(*Claim(trainer, 2, 1));
  ASSERT_TRUE(Ready(trainer, 2, 1).ok());
  EXPECT_FALSE(*Claim(keeper, 2, 1));  // once per datacenter: a has it
  // r1 starts first (BeginFetch: a filling holder, then its sources): the
  // delta's holder across the link, and the delta is claimed for r1, to
  // make for datacenter b once it holds version 2.
  auto start = Begin(r1, 2, 60);
  ASSERT_TRUE(start.ok());
  ASSERT_EQ(start->sources.size(), 1u);
  EXPECT_EQ(start->sources[0].worker, trainer);
  EXPECT_FALSE(start->delta_pending);  // it has one to read
  // r2 starts: r1 is its nearest source (whole chunks), and the delta is
  // pending in its datacenter, so it may wait for it.
  start = Begin(r2, 2, 61);
  ASSERT_TRUE(start.ok());
  ASSERT_FALSE(start->sources.empty());
  EXPECT_EQ(start->sources[0].worker, r1);
  EXPECT_TRUE(start->sources[0].deltas.empty());
  EXPECT_TRUE(start->delta_pending);
  EXPECT_FALSE(Claim(r2, 2, 1).ok());  // it does not hold version 2 yet
  // r1 holds version 2 whole: its DeltaMaker's claim is granted (it was
  // made for it), nobody else's in b is; once ready, r2 and r3 read it
  // from r1 inside their datacenter.
  Hold(r1, 2);
  EXPECT_TRUE(hub_.DeltaPending(r2, "m", Version(2)));  // still r1's
  EXPECT_TRUE(*Claim(r1, 2, 1));
  Hold(r3, 2);
  EXPECT_FALSE(*Claim(r3, 2, 1));
  ASSERT_TRUE(Ready(r1, 2, 1, 777).ok());
  EXPECT_FALSE(hub_.DeltaPending(r2, "m", Version(2)));
  // r2 is sent to r1's delta alone (r3, a full holder in b, would send
  // whole chunks).
  std::vector<HolderView> s = Sources(r2, 2);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].worker, r1);
  ASSERT_EQ(s[0].deltas.size(), 1u);
  EXPECT_EQ(s[0].deltas[0], (DeltaOffer{Version(1), 777}));
}

TEST_F(HubDeltaTest, ASlowLinkedReaderWhoseNeighbourCannotRelayReadsAcross) {
  // b's first reader x holds no base: it reads whole chunks across the
  // link and will make no delta. y (base, slow links in b) would wait in
  // vain for one from x: it is sent to the delta across the link instead
  // and makes it for b; z then waits for y's.
  const WorkerId trainer = Register("trainer", Dc("a", "t"));
  const WorkerId x = Register("x", Dc("b", "x"), true);
  const WorkerId y = Register("y", Dc("b", "y"), true);
  const WorkerId z = Register("z", Dc("b", "z"), true);
  Publish(trainer, 2);
  for (const WorkerId& r : {y, z}) Hold(r, 1);
  ASSERT_TRUE(*Claim(trainer, 2, 1));
  ASSERT_TRUE(Ready(trainer, 2, 1).ok());
  auto start = Begin(x, 2, 60);
  ASSERT_TRUE(start.ok());
  ASSERT_FALSE(start->sources.empty());
  EXPECT_TRUE(start->sources[0].deltas.empty());  // no base: whole chunks
  start = Begin(y, 2, 61);
  ASSERT_TRUE(start.ok());
  ASSERT_EQ(start->sources.size(), 1u);
  EXPECT_EQ(start->sources[0].worker, trainer);
  EXPECT_EQ(start->sources[0].deltas.size(), 1u);
  start = Begin(z, 2, 62);
  ASSERT_TRUE(start.ok());
  ASSERT_FALSE(start->sources.empty());
  for (const HolderView& h : start->sources) EXPECT_NE(h.worker, trainer);
  EXPECT_TRUE(start->delta_pending);  // y's, in b
  Hold(y, 2);
  ASSERT_TRUE(*Claim(y, 2, 1));
  ASSERT_TRUE(Ready(y, 2, 1).ok());
  std::vector<HolderView> s = Sources(z, 2);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].worker, y);
}

TEST_F(HubDeltaTest, OnAFastLocalLinkTheDatacentersReadersFeedEachOther) {
  // Readers registered without nearby_deltas (the default: full chunks win
  // on a datacenter's link) are not all sent to the one delta holder.
  const WorkerId trainer = Register("trainer", Dc("a", "t"));
  const WorkerId full = Register("full", Dc("a", "f"));
  const WorkerId fast = Register("fast", Dc("a", "r"));
  const WorkerId slow = Register("slow", Dc("a", "s"), true);
  Publish(trainer, 2);
  for (const WorkerId& r : {fast, slow}) Hold(r, 1);
  ASSERT_TRUE(*Claim(trainer, 2, 1));
  ASSERT_TRUE(Ready(trainer, 2, 1).ok());
  Hold(full, 2);
  hub_.FetchDone(full, "m", Version(2));
  std::vector<HolderView> s = Sources(fast, 2);
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(s[0].worker, full);  // the idle full holder first, striped
  hub_.FetchDone(fast, "m", Version(2));
  s = Sources(slow, 2);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].worker, trainer);
  EXPECT_EQ(s[0].deltas.size(), 1u);
}

TEST_F(HubDeltaTest, ARelayThatLeavesOrOnlyFetchesLeavesNoClaim) {
  const WorkerId trainer = Register("trainer", Dc("a", "t"));
  const WorkerId r1 = Register("r1", Dc("b", "r1"));
  const WorkerId r2 = Register("r2", Dc("b", "r2"));
  Publish(trainer, 2);
  for (const WorkerId& r : {r1, r2}) Hold(r, 1);
  ASSERT_TRUE(*Claim(trainer, 2, 1));
  ASSERT_TRUE(Ready(trainer, 2, 1).ok());
  // A reader that only fetches (no filling registration: it serves
  // nothing) is pointed at the delta; nothing is claimed for it.
  auto start = Begin(r1, 2);
  ASSERT_TRUE(start.ok());
  ASSERT_EQ(start->sources.size(), 1u);
  EXPECT_EQ(start->sources[0].worker, trainer);
  EXPECT_FALSE(hub_.DeltaPending(r2, "m", Version(2)));
  hub_.FetchDone(r1, "m", Version(2));
  // A filling reader gets the claim; when it withdraws it (it will not
  // make it: DropDelta) its peers stop waiting, and its later asks for
  // sources (failing over) do not claim it again.
  ASSERT_TRUE(Begin(r1, 2, 60).ok());
  EXPECT_TRUE(hub_.DeltaPending(r2, "m", Version(2)));
  ASSERT_TRUE(hub_.DropDelta(r1, "m", Version(2), Version(1), 0).ok());
  EXPECT_FALSE(hub_.DeltaPending(r2, "m", Version(2)));
  Sources(r1, 2);
  EXPECT_FALSE(hub_.DeltaPending(r2, "m", Version(2)));
  // A reader that leaves takes its claim along.
  ASSERT_TRUE(hub_.Leave(r1).ok());
  const WorkerId r3 = Register("r3", Dc("b", "r3"));
  Hold(r3, 1);
  ASSERT_TRUE(
      hub_.AddHolder(r3, "m", Version(2), 62, manifests_[1], 0, true).ok());
  Sources(r3, 2);
  EXPECT_TRUE(hub_.DeltaPending(r2, "m", Version(2)));
  ASSERT_TRUE(hub_.Leave(r3).ok());
  EXPECT_FALSE(hub_.DeltaPending(r2, "m", Version(2)));
}

TEST_F(HubDeltaTest, DeltaGoesWithItsHoldersReference) {
  const WorkerId trainer = Register("trainer", Dc("a", "t"));
  const WorkerId keeper = Register("keeper", Dc("a", "k"));
  const WorkerId reader = Register("reader", Dc("b", "r"));
  Publish(trainer, 2);
  for (uint64_t v : {1, 2}) Hold(keeper, v);
  Hold(reader, 1);
  ASSERT_TRUE(*Claim(trainer, 2, 1));
  ASSERT_TRUE(Ready(trainer, 2, 1).ok());
  // Dropping the base keeps the delta: it no longer needs it.
  ASSERT_TRUE(hub_.Unpublish(trainer, "m", Version(1), 0).ok());
  EXPECT_FALSE(*Claim(keeper, 2, 1));
  // Dropping the version takes the delta: another worker may compute it.
  ASSERT_TRUE(hub_.Unpublish(trainer, "m", Version(2), 0).ok());
  EXPECT_TRUE(*Claim(keeper, 2, 1));
  EXPECT_TRUE(hub_.DeltaPending(reader, "m", Version(2)));
  // A worker that leaves takes its claim with it.
  ASSERT_TRUE(hub_.Leave(keeper).ok());
  EXPECT_FALSE(hub_.DeltaPending(reader, "m", Version(2)));
}

TEST_F(HubDeltaTest, DropDeltaWithdrawsAClaimOrADelta) {
  const WorkerId trainer = Register("trainer", Dc("a", "t"));
  const WorkerId keeper = Register("keeper", Dc("a", "k"));
  Publish(trainer, 2);
  for (uint64_t v : {1, 2}) Hold(keeper, v);
  EXPECT_EQ(hub_.DropDelta(trainer, "m", Version(2), Version(1), 0).code(),
            StatusCode::kNotFound);
  ASSERT_TRUE(*Claim(trainer, 2, 1));
  ASSERT_TRUE(hub_.DropDelta(trainer, "m", Version(2), Version(1), 0).ok());
  EXPECT_TRUE(*Claim(keeper, 2, 1));
}

TEST_F(HubDeltaTest, DeltasPerVersionAreBounded) {
  const WorkerId trainer = Register("trainer", Dc("a", "t"));
  const uint64_t n = kMaxDeltasPerVersion + 2;
  Publish(trainer, n);
  for (uint64_t base = 1; base <= kMaxDeltasPerVersion; ++base) {
    ASSERT_TRUE(*Claim(trainer, n, base));
  }
  EXPECT_FALSE(*Claim(trainer, n, kMaxDeltasPerVersion + 1));
  EXPECT_EQ(Ready(trainer, n, kMaxDeltasPerVersion + 1).code(),
            StatusCode::kResourceExhausted);
  ASSERT_TRUE(Ready(trainer, n, 1).ok());  // a claimed one becomes ready
}

}  // namespace
}  // namespace tensorhub::hub
