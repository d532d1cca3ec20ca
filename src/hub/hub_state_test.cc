// Unit tests for the hub's pure state machine. Time is driven by hand.
#include "hub/hub_state.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/checksum.h"
#include "common/manifest.h"

namespace tensorhub::hub {
namespace {

constexpr int64_t kLeaseMs = 1000;

Labels L(std::string dc, std::string rack, std::string host) {
  return Labels{std::move(dc), std::move(rack), std::move(host)};
}

// A readable dump of List(), to compare whole states.
std::string Dump(const std::vector<ModelSummary>& models) {
  std::ostringstream o;
  for (const ModelSummary& m : models) {
    o << m.model << ":";
    for (const VersionSummary& v : m.versions) {
      o << " [v" << v.version.value() << " " << VersionStateName(v.state)
        << " g" << v.group_size << " p" << v.parts_published << " b"
        << v.total_bytes << " h" << v.holders << " t" << v.tensors << "]";
    }
    o << "\n";
  }
  return o.str();
}

class HubStateTest : public ::testing::Test {
 protected:
  static HubConfig DefaultConfig() {
    HubConfig c;
    c.lease_ms = kLeaseMs;
    c.incarnation = 7;
    return c;
  }

  HubStateTest() : hub_(DefaultConfig()) {}

  WorkerId Register(HubState& hub, const std::string& name, Labels labels = {},
                    WorkerId requested = {}, int64_t now_ms = 0) {
    WorkerRegistration reg;
    reg.requested_id = std::move(requested);
    reg.name = name;
    reg.data_address = "tcp://" + name + ":9000";
    reg.labels = std::move(labels);
    Result<WorkerId> id = hub.RegisterWorker(reg, now_ms);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : WorkerId();
  }
  WorkerId Register(const std::string& name, Labels labels = {}) {
    return Register(hub_, name, std::move(labels));
  }

  // A part of real bytes: tensors (name, bytes), checksummed by
  // BuildPartLayout. The bytes live as long as the test.
  PartLayout Part(uint32_t rank,
                  const std::vector<std::pair<std::string, uint64_t>>& tensors,
                  uint8_t seed = 0) {
    std::vector<TensorRef> refs;
    for (const auto& [name, bytes] : tensors) {
      std::vector<uint8_t>& buf = buffers_.emplace_back(bytes);
      for (uint64_t i = 0; i < bytes; ++i) {
        buf[i] = static_cast<uint8_t>(seed * 13 + i * 7 + (i >> 9));
      }
      refs.push_back({TensorSpec{name, DType::kU8, {bytes}},
                      bytes ? buf.data() : nullptr, bytes,
                      MemoryLocation::Host()});
    }
    Result<PartLayout> p = BuildPartLayout(rank, refs, kMinChunkBytes);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? *p : PartLayout{};
  }

  // Parts of a group of `n` ranks; rank r has r + 2 chunks, so chunk ids
  // reveal which part they came from.
  std::vector<PartLayout> Group(const std::string& prefix, uint32_t n,
                                uint8_t seed = 0) {
    std::vector<PartLayout> parts;
    for (uint32_t r = 0; r < n; ++r) {
      std::string base = prefix + ".r" + std::to_string(r);
      parts.push_back(Part(
          r, {{base + ".w", kMinChunkBytes * (r + 1) + 1}, {base + ".b", 10}},
          static_cast<uint8_t>(seed + r)));
    }
    return parts;
  }

  static Manifest ManifestOf(const std::vector<PartLayout>& parts) {
    return Manifest(static_cast<uint32_t>(parts.size()), kMinChunkBytes, parts);
  }

  static PublishArgs Args(const WorkerId& w, const std::string& model,
                          uint64_t version,
                          const std::vector<PartLayout>& parts, uint32_t rank,
                          bool rebuild = false) {
    PublishArgs a;
    a.worker = w;
    a.model = model;
    a.version = Version(version);
    a.rank = rank;
    a.group_size = static_cast<uint32_t>(parts.size());
    a.chunk_bytes = kMinChunkBytes;
    a.part = parts[rank];
    a.epoch = 100 + rank;
    a.rebuild = rebuild;
    return a;
  }

  Result<VersionState> Pub(const WorkerId& w, const std::string& model,
                           uint64_t version,
                           const std::vector<PartLayout>& parts, uint32_t rank,
                           int64_t now_ms = 0, bool rebuild = false) {
    return hub_.Publish(Args(w, model, version, parts, rank, rebuild), now_ms);
  }

  StatusCode ResolveCode(const std::string& model, uint64_t version,
                         const WorkerId& reader = WorkerId("nobody")) {
    return hub_.Resolve(reader, model, Version(version), false).status().code();
  }

  static std::vector<std::string> Ids(const Resolution& r) {
    std::vector<std::string> ids;
    for (const HolderView& h : r.holders) ids.push_back(h.worker.value());
    return ids;
  }

  // A holder of slices' layout: ranges [begin, end) of 1-dimensional U8
  // tensors of `length` bytes.
  struct Held {
    std::string name;
    uint64_t length = 0;
    uint64_t begin = 0, end = 0;
  };
  static PartLayout SliceLayout(const std::vector<Held>& held) {
    std::vector<TensorRef> refs;
    PieceOptions opts;
    opts.segment_bytes = 256;
    std::deque<std::vector<uint8_t>> bytes;  // only checksummed here
    for (const Held& h : held) {
      std::vector<uint8_t>& buf = bytes.emplace_back(h.end - h.begin, 5);
      refs.push_back({TensorSpec{h.name, DType::kU8, {h.end - h.begin}},
                      buf.data(), buf.size(), MemoryLocation::Host()});
      opts.pieces[h.name] = {{h.length}, {h.begin}};
    }
    Result<PartLayout> p = BuildPartLayout(
        0xFFFFFFFFu, refs, kMinChunkBytes, ChunkChecksum::kXxh3,
        [](std::span<const iovec> v) -> Result<uint64_t> {
          return Xxh3Pieces(v);
        },
        opts);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? *p : PartLayout{};
  }

  // The seeded differential run of IndexedScheduleMatchesAReferenceScan.
  template <typename Reference>
  void RunDifferential(uint32_t seed, const HubConfig& config,
                       const std::vector<PartLayout>& g, const Manifest& m,
                       const std::vector<uint64_t>& base, Reference& ref);

  HubState hub_;
  std::deque<std::vector<uint8_t>> buffers_;
};

// ------------------------------------------------------------ names

TEST(ValidateModelNameTest, Rules) {
  EXPECT_TRUE(ValidateModelName("m").ok());
  EXPECT_TRUE(ValidateModelName("org/llama-3_70b.v2~!#").ok());
  EXPECT_TRUE(ValidateModelName(std::string(256, 'a')).ok());
  for (const std::string& bad :
       {std::string(), std::string(257, 'a'), std::string("a b"),
        std::string("m@1"), std::string("tab\t"), std::string("del\x7f"),
        std::string("nul\0x", 5), std::string("hi\xc3\xa9")}) {
    EXPECT_EQ(ValidateModelName(bad).code(), StatusCode::kInvalidArgument)
        << bad;
  }
}

// ------------------------------------------------------------ workers

TEST_F(HubStateTest, RegisterAssignsDistinctIdsCarryingTheIncarnation) {
  WorkerId a = Register("a");
  WorkerId b = Register("b");
  EXPECT_FALSE(a.empty());
  EXPECT_FALSE(b.empty());
  EXPECT_NE(a, b);
  EXPECT_EQ(a.value().rfind("w7-", 0), 0u) << a.value();
  EXPECT_EQ(hub_.num_workers(), 2u);

  HubConfig other = DefaultConfig();
  other.incarnation = 8;
  HubState hub2(other);
  WorkerId c = Register(hub2, "a");
  EXPECT_NE(c, a) << "ids from two hub lives must differ";
}

TEST_F(HubStateTest, RegisterWithRequestedIdUsesIt) {
  WorkerId a = Register(hub_, "a", {}, WorkerId("w3-17"));
  EXPECT_EQ(a, WorkerId("w3-17"));
  EXPECT_EQ(hub_.num_workers(), 1u);
  // Again with the same id: the same worker, not a second one.
  EXPECT_EQ(Register(hub_, "a", {}, WorkerId("w3-17")), a);
  EXPECT_EQ(hub_.num_workers(), 1u);
}

TEST_F(HubStateTest, RegisterRejectsBadRegistrations) {
  WorkerRegistration reg;
  reg.name = "x";
  reg.data_address = "";
  EXPECT_EQ(hub_.RegisterWorker(reg, 0).status().code(),
            StatusCode::kInvalidArgument);
  reg.data_address = std::string(257, 'a');
  EXPECT_EQ(hub_.RegisterWorker(reg, 0).status().code(),
            StatusCode::kInvalidArgument);
  reg.data_address = "tcp://x:1";
  reg.name = std::string(257, 'n');
  EXPECT_EQ(hub_.RegisterWorker(reg, 0).status().code(),
            StatusCode::kInvalidArgument);
  reg.name = "x";
  reg.requested_id = WorkerId(std::string(129, 'i'));
  EXPECT_EQ(hub_.RegisterWorker(reg, 0).status().code(),
            StatusCode::kInvalidArgument);
  reg.requested_id = WorkerId("");
  // Labels come from the network too and are stored per worker.
  for (std::string* label :
       {&reg.labels.datacenter, &reg.labels.rack, &reg.labels.host}) {
    *label = std::string(257, 'l');
    EXPECT_EQ(hub_.RegisterWorker(reg, 0).status().code(),
              StatusCode::kInvalidArgument);
    label->clear();
  }
  EXPECT_EQ(hub_.num_workers(), 0u);
}

TEST_F(HubStateTest, RegisterBoundedByMaxWorkers) {
  HubConfig c = DefaultConfig();
  c.max_workers = 2;
  HubState hub(c);
  WorkerId a = Register(hub, "a");
  Register(hub, "b");
  WorkerRegistration reg;
  reg.name = "c";
  reg.data_address = "tcp://c:1";
  EXPECT_EQ(hub.RegisterWorker(reg, 0).status().code(),
            StatusCode::kResourceExhausted);
  // A known worker may always register again.
  EXPECT_EQ(Register(hub, "a", {}, a), a);
  EXPECT_EQ(hub.num_workers(), 2u);
}

TEST_F(HubStateTest, HeartbeatOfUnknownWorkerIsNotFound) {
  EXPECT_EQ(hub_.Heartbeat(WorkerId("w7-99"), 0).code(), StatusCode::kNotFound);
}

TEST_F(HubStateTest, HeartbeatExtendsTheLease) {
  WorkerId a = Register(hub_, "a", {}, {}, /*now_ms=*/0);
  WorkerId b = Register(hub_, "b", {}, {}, /*now_ms=*/0);
  ASSERT_TRUE(hub_.Heartbeat(a, 900).ok());
  hub_.ExpireLeases(999);
  EXPECT_EQ(hub_.num_workers(), 2u);
  hub_.ExpireLeases(1000);  // b's lease ends exactly now
  EXPECT_EQ(hub_.num_workers(), 1u);
  EXPECT_EQ(hub_.Heartbeat(b, 1000).code(), StatusCode::kNotFound);
  EXPECT_TRUE(hub_.Heartbeat(a, 1000).ok());
  hub_.ExpireLeases(1999);
  EXPECT_EQ(hub_.num_workers(), 1u);
  hub_.ExpireLeases(2000);
  EXPECT_EQ(hub_.num_workers(), 0u);
}

// The heartbeat plan for a fleet: a table of (workers, base lease, budget,
// max lease) -> (interval, lease).
TEST(PlanHeartbeatsTest, Table) {
  struct Row {
    size_t workers;
    int64_t base_lease_ms;
    uint32_t budget_per_s;
    int64_t max_lease_ms;
    HeartbeatPlan want;
  };
  const Row rows[] = {
      // No budget: a third of the lease, within [50 ms, 5 s].
      {10000, 5000, 0, 30000, {1666, 5000}},
      {1, 120, 0, 30000, {50, 120}},
      {1, 60000, 0, 30000, {5000, 60000}},
      // Within the budget: the base plan.
      {1, 5000, 1000, 30000, {1666, 5000}},
      {1666, 5000, 1000, 30000, {1666, 5000}},
      // Over it: the interval at which the fleet sends the budget (rounded
      // up), three of them the lease.
      {1667, 5000, 1000, 30000, {1667, 5001}},
      {5000, 5000, 1000, 30000, {5000, 15000}},
      {10000, 5000, 1000, 30000, {10000, 30000}},
      {3, 5000, 1, 30000, {3000, 9000}},
      // Beyond budget x max lease / 3: capped at the max lease.
      {20000, 5000, 1000, 30000, {10000, 30000}},
      {100000, 5000, 500, 60000, {20000, 60000}},
      // A max lease below the base lease: the base lease is the cap.
      {100000, 9000, 1000, 1000, {3000, 9000}},
      // A base interval over the cap of 5 s grows from there.
      {1000, 60000, 100, 60000, {10000, 60000}},
      {100, 60000, 100, 60000, {5000, 60000}},
  };
  for (const Row& r : rows) {
    const HeartbeatPlan got = PlanHeartbeats(r.workers, r.base_lease_ms,
                                             r.budget_per_s, r.max_lease_ms);
    EXPECT_EQ(got.interval_ms, r.want.interval_ms)
        << r.workers << " workers, lease " << r.base_lease_ms << ", budget "
        << r.budget_per_s << "/s, max lease " << r.max_lease_ms;
    EXPECT_EQ(got.lease_ms, r.want.lease_ms)
        << r.workers << " workers, lease " << r.base_lease_ms << ", budget "
        << r.budget_per_s << "/s, max lease " << r.max_lease_ms;
  }
}

// Invariants over many fleets: two heartbeats may be lost before a lease
// lapses, the lease is bounded, and the fleet keeps to the budget unless
// the bound on the lease forbids it.
TEST(PlanHeartbeatsTest, Invariants) {
  for (size_t workers : {0, 1, 7, 100, 999, 1000, 1001, 4321, 10000, 99999}) {
    for (int64_t base : {100, 999, 5000, 30000}) {
      for (uint32_t budget : {0u, 1u, 10u, 1000u, 100000u}) {
        for (int64_t max_lease : {100, 5000, 30000, 600000}) {
          const HeartbeatPlan p =
              PlanHeartbeats(workers, base, budget, max_lease);
          SCOPED_TRACE(std::to_string(workers) + " " + std::to_string(base) +
                       " " + std::to_string(budget) + " " +
                       std::to_string(max_lease));
          EXPECT_GE(p.interval_ms, kMinHeartbeatIntervalMs);
          EXPECT_LE(3 * p.interval_ms, std::max<int64_t>(p.lease_ms, 150));
          EXPECT_GE(p.lease_ms, base);
          EXPECT_LE(p.lease_ms, std::max(base, max_lease));
          if (budget > 0 && p.interval_ms < std::max(base, max_lease) / 3) {
            // Not capped by the longest lease: the fleet keeps the budget.
            EXPECT_LE(static_cast<double>(workers) * 1000.0 /
                          static_cast<double>(p.interval_ms),
                      static_cast<double>(budget));
          }
        }
      }
    }
  }
}

// The state machine grants the plan of its fleet, and a renewal never
// shortens a lease granted before: a worker told a long interval keeps
// its long lease until a heartbeat tells it the new (shorter) one.
TEST(HubStateLeaseTest, LeaseFollowsTheFleetAndIsNeverShortened) {
  HubConfig c;
  c.lease_ms = 300;               // interval 100 ms
  c.heartbeat_budget_per_s = 20;  // 2 workers at 100 ms: 20/s
  c.max_lease_ms = 1200;
  HubState hub(c);
  auto reg = [&](const std::string& name, int64_t now_ms) {
    WorkerRegistration r;
    r.name = name;
    r.data_address = "tcp://" + name + ":9000";
    Result<WorkerId> id = hub.RegisterWorker(r, now_ms);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : WorkerId();
  };
  WorkerId a = reg("a", 0);
  EXPECT_EQ(hub.plan(), (HeartbeatPlan{100, 300}));
  WorkerId b = reg("b", 0);
  EXPECT_EQ(hub.plan(), (HeartbeatPlan{100, 300}));
  WorkerId d = reg("d", 0);  // 3 workers at 20/s: every 150 ms
  EXPECT_EQ(hub.plan(), (HeartbeatPlan{150, 450}));
  std::vector<WorkerId> more;
  for (int i = 0; i < 7; ++i) more.push_back(reg("m" + std::to_string(i), 0));
  // 10 workers at 20/s: every 500 ms, but the lease is capped at 1200.
  EXPECT_EQ(hub.plan(), (HeartbeatPlan{400, 1200}));
  ASSERT_TRUE(hub.Heartbeat(a, 100).ok());  // a: lease to 1300
  ASSERT_TRUE(hub.Heartbeat(d, 100).ok());  // d: lease to 1300
  // a was told a 400 ms interval; the fleet shrinks to 2 (b, a).
  for (const WorkerId& m : more) ASSERT_TRUE(hub.Leave(m).ok());
  ASSERT_TRUE(hub.Leave(d).ok());
  EXPECT_EQ(hub.plan(), (HeartbeatPlan{100, 300}));
  // A renewal under the short plan keeps a's long lease (until 1300).
  ASSERT_TRUE(hub.Heartbeat(a, 200).ok());
  hub.ExpireLeases(1299);
  EXPECT_EQ(hub.num_workers(), 1u);  // b's lease (0 + 300) ended
  EXPECT_EQ(hub.Heartbeat(b, 1299).code(), StatusCode::kNotFound);
  hub.ExpireLeases(1300);
  EXPECT_EQ(hub.num_workers(), 0u);
}

TEST_F(HubStateTest, ReRegisterWithSameAddressKeepsReferences) {
  WorkerId t = Register("t");
  auto g = Group("m", 1);
  ASSERT_EQ(*Pub(t, "m", 1, g, 0), VersionState::kCommitted);
  EXPECT_EQ(Register(hub_, "t", {}, t), t);
  EXPECT_EQ(ResolveCode("m", 1), StatusCode::kOk);
  Result<Resolution> r = hub_.Resolve(WorkerId("x"), "m", Version(1), false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Ids(*r), std::vector<std::string>{t.value()});
}

TEST_F(HubStateTest, ReRegisterWithNewAddressDropsOldReferences) {
  WorkerId t = Register("t");
  WorkerId u = Register("u");
  auto g1 = Group("m", 1);
  auto g2 = Group("m", 2, 5);
  ASSERT_EQ(*Pub(t, "m", 1, g1, 0), VersionState::kCommitted);
  ASSERT_EQ(*Pub(t, "m", 2, g2, 0), VersionState::kPending);
  ASSERT_EQ(*Pub(u, "m", 2, g2, 1), VersionState::kCommitted);
  ASSERT_EQ(*Pub(t, "m", 3, g2, 0), VersionState::kPending);

  WorkerRegistration reg;
  reg.requested_id = t;
  reg.name = "t";
  reg.data_address = "tcp://t-restarted:9000";
  ASSERT_TRUE(hub_.RegisterWorker(reg, 0).ok());

  // v1: its only holder's references are gone.
  EXPECT_EQ(ResolveCode("m", 1), StatusCode::kUnavailable);
  // v2: part 0's only holder is gone, u still holds part 1.
  EXPECT_EQ(ResolveCode("m", 2), StatusCode::kUnavailable);
  // v3 was pending: a rank left, so it aborted.
  EXPECT_EQ(ResolveCode("m", 3), StatusCode::kAborted);
  EXPECT_EQ(hub_.Unpublish(t, "m", Version(1), 0).code(),
            StatusCode::kNotFound);
  // The new address is what readers see.
  ASSERT_EQ(*Pub(t, "m", 4, g1, 0), VersionState::kCommitted);
  Result<Resolution> r = hub_.Resolve(u, "m", Version(4), false);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->holders.size(), 1u);
  EXPECT_EQ(r->holders[0].data_address, "tcp://t-restarted:9000");
}

TEST_F(HubStateTest, TransportsAWorkerServesAreBoundedAndListedWithIt) {
  WorkerRegistration reg;
  reg.name = "t";
  reg.data_address = "10.0.0.1:9000";
  reg.endpoints = {{"UCX", "10.0.0.1:9001"}};  // names are lowercase
  EXPECT_EQ(hub_.RegisterWorker(reg, 0).status().code(),
            StatusCode::kInvalidArgument);
  reg.endpoints = {{"ucx", ""}};
  EXPECT_EQ(hub_.RegisterWorker(reg, 0).status().code(),
            StatusCode::kInvalidArgument);
  reg.endpoints.assign(kMaxDataEndpoints + 1, {"ucx", "10.0.0.1:9001"});
  EXPECT_EQ(hub_.RegisterWorker(reg, 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(hub_.num_workers(), 0u);

  reg.endpoints = {{"ucx", "10.0.0.1:9001"}};
  Result<WorkerId> t = hub_.RegisterWorker(reg, 0);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto g = Group("m", 1);
  ASSERT_TRUE(Pub(*t, "m", 1, g, 0).ok());
  WorkerId reader = Register("reader");
  Result<Resolution> r = hub_.Resolve(reader, "m", Version(1), false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->holders.size(), 1u);
  EXPECT_EQ(r->holders[0].data_address, "10.0.0.1:9000");
  EXPECT_EQ(r->holders[0].endpoints,
            (std::vector<DataEndpoint>{{"ucx", "10.0.0.1:9001"}}));
}

// ------------------------------------------------------------ publish

TEST_F(HubStateTest, SingleRankPublishCommits) {
  WorkerId t = Register("t");
  auto g = Group("m", 1);
  Result<VersionState> s = Pub(t, "m", 1, g, 0);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(*s, VersionState::kCommitted);

  WorkerId reader = Register("reader");
  Result<Resolution> r = hub_.Resolve(reader, "m", Version(1), false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->version, Version(1));
  EXPECT_EQ(r->state, VersionState::kCommitted);
  ASSERT_TRUE(r->manifest.has_value());
  EXPECT_TRUE(*r->manifest == ManifestOf(g));
  EXPECT_EQ(r->manifest->num_chunks(), 2u);
  ASSERT_EQ(r->holders.size(), 1u);
  EXPECT_EQ(r->holders[0].worker, t);
  EXPECT_EQ(r->holders[0].data_address, "tcp://t:9000");
  EXPECT_EQ(r->holders[0].epoch, 100u);
  EXPECT_EQ(r->holders[0].chunks, (std::vector<ChunkRange>{{0, 2}}));

  // Latest resolves to it.
  Result<Resolution> latest =
      hub_.Resolve(reader, "m", Version::Latest(), false);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->version, Version(1));
}

TEST_F(HubStateTest, GroupIsPendingUntilEveryRankPublished) {
  WorkerId w[3] = {Register("r0"), Register("r1"), Register("r2")};
  auto g = Group("m", 3);
  // Ranks arrive out of order; chunk ids still number part 0 first.
  ASSERT_EQ(*Pub(w[2], "m", 1, g, 2), VersionState::kPending);
  ASSERT_EQ(*Pub(w[0], "m", 1, g, 0), VersionState::kPending);

  Status pending = hub_.Resolve(w[0], "m", Version(1), false).status();
  EXPECT_EQ(pending.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(pending.message().find("2 of 3"), std::string::npos)
      << pending.message();
  EXPECT_EQ(hub_.Resolve(w[0], "m", Version::Latest(), false).status().code(),
            StatusCode::kNotFound);

  Result<Resolution> peek = hub_.Resolve(WorkerId("x"), "m", Version(1),
                                         /*include_uncommitted=*/true);
  ASSERT_TRUE(peek.ok());
  EXPECT_EQ(peek->state, VersionState::kPending);
  EXPECT_FALSE(peek->manifest.has_value());
  ASSERT_EQ(peek->holders.size(), 2u);
  for (const HolderView& h : peek->holders) EXPECT_TRUE(h.chunks.empty());

  std::vector<ModelSummary> ls = hub_.List();
  ASSERT_EQ(ls.size(), 1u);
  ASSERT_EQ(ls[0].versions.size(), 1u);
  EXPECT_EQ(ls[0].versions[0].state, VersionState::kPending);
  EXPECT_EQ(ls[0].versions[0].parts_published, 2u);
  EXPECT_EQ(ls[0].versions[0].group_size, 3u);
  EXPECT_EQ(ls[0].versions[0].tensors, 4u);
  EXPECT_EQ(ls[0].versions[0].total_bytes, g[0].part_bytes + g[2].part_bytes);

  ASSERT_EQ(*Pub(w[1], "m", 1, g, 1), VersionState::kCommitted);
  Result<Resolution> r = hub_.Resolve(WorkerId("x"), "m", Version(1), false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->manifest.has_value());
  const Manifest& m = *r->manifest;
  EXPECT_TRUE(m == ManifestOf(g));
  ASSERT_EQ(m.parts().size(), 3u);
  for (uint32_t p = 0; p < 3; ++p) EXPECT_EQ(m.parts()[p].rank, p);
  // Rank r has r + 2 chunks: bases 0, 2, 5, total 9.
  EXPECT_EQ(m.chunk_base(0), 0u);
  EXPECT_EQ(m.chunk_base(1), 2u);
  EXPECT_EQ(m.chunk_base(2), 5u);
  EXPECT_EQ(m.num_chunks(), 9u);
  EXPECT_EQ(m.Chunk(0).part, 0u);
  EXPECT_EQ(m.Chunk(2).part, 1u);
  EXPECT_EQ(m.Chunk(8).part, 2u);
  EXPECT_EQ(m.Chunk(0).xxh3, g[0].chunk_xxh3[0]);
  // Each rank holds exactly its part's chunk range.
  ASSERT_EQ(r->holders.size(), 3u);
  for (const HolderView& h : r->holders) {
    uint32_t rank = h.worker == w[0] ? 0 : h.worker == w[1] ? 1 : 2;
    EXPECT_EQ(h.epoch, 100u + rank);
    EXPECT_EQ(
        h.chunks,
        (std::vector<ChunkRange>{{m.chunk_base(rank), m.chunk_base(rank + 1)}}))
        << rank;
  }
  ls = hub_.List();
  EXPECT_EQ(ls[0].versions[0].state, VersionState::kCommitted);
  EXPECT_EQ(ls[0].versions[0].parts_published, 3u);
  EXPECT_EQ(ls[0].versions[0].holders, 3u);
  EXPECT_EQ(ls[0].versions[0].tensors, 6u);
  EXPECT_EQ(ls[0].versions[0].total_bytes, m.total_bytes());
}

TEST_F(HubStateTest, PublishOfUnknownWorkerIsNotFound) {
  auto g = Group("m", 1);
  EXPECT_EQ(Pub(WorkerId("w7-42"), "m", 1, g, 0).status().code(),
            StatusCode::kNotFound);
  EXPECT_TRUE(hub_.List().empty());
}

TEST_F(HubStateTest, PublishValidatesArguments) {
  WorkerId t = Register("t");
  auto g = Group("m", 2);
  auto code = [&](PublishArgs a) { return hub_.Publish(a, 0).status().code(); };
  PublishArgs a = Args(t, "m", 1, g, 1);
  a.group_size = 0;
  EXPECT_EQ(code(a), StatusCode::kInvalidArgument) << "group 0";
  a.group_size = kMaxGroupSize + 1;
  EXPECT_EQ(code(a), StatusCode::kInvalidArgument) << "group too large";
  a = Args(t, "m", 1, g, 1);
  a.rank = 2;
  EXPECT_EQ(code(a), StatusCode::kInvalidArgument) << "rank >= group";
  a = Args(t, "m", 1, g, 1);
  a.part.rank = 0;
  EXPECT_EQ(code(a), StatusCode::kInvalidArgument) << "part claims rank 0";
  a = Args(t, "m", 1, g, 1);
  a.chunk_bytes = 2 * kMinChunkBytes;
  EXPECT_EQ(code(a), StatusCode::kInvalidArgument) << "chunk count mismatch";
  a = Args(t, "m", 1, g, 1);
  a.part.chunk_xxh3.pop_back();
  EXPECT_EQ(code(a), StatusCode::kInvalidArgument) << "bad part";
  a = Args(t, "m", 0, g, 1);
  EXPECT_EQ(code(a), StatusCode::kInvalidArgument) << "version 0";
  EXPECT_TRUE(hub_.List().empty()) << Dump(hub_.List());

  // Against an existing version: group size and chunk size must agree.
  ASSERT_EQ(*Pub(t, "m", 1, g, 0), VersionState::kPending);
  const std::string before = Dump(hub_.List());
  WorkerId u = Register("u");
  auto g3 = Group("m", 3);
  EXPECT_EQ(code(Args(u, "m", 1, g3, 1)), StatusCode::kInvalidArgument);
  EXPECT_EQ(Dump(hub_.List()), before);
}

TEST_F(HubStateTest, BadModelNamesRejected) {
  WorkerId t = Register("t");
  auto g = Group("x", 1);
  for (const std::string& bad :
       {std::string(), std::string(257, 'm'), std::string("has space"),
        std::string("m@2")}) {
    EXPECT_EQ(Pub(t, bad, 1, g, 0).status().code(),
              StatusCode::kInvalidArgument)
        << bad;
    EXPECT_EQ(hub_.Resolve(t, bad, Version(1), true).status().code(),
              StatusCode::kInvalidArgument)
        << bad;
    EXPECT_EQ(hub_.AddHolder(t, bad, Version(1), 1, ManifestOf(g), 0).code(),
              StatusCode::kInvalidArgument)
        << bad;
  }
  EXPECT_TRUE(hub_.List().empty());
  EXPECT_TRUE(Pub(t, std::string(256, 'm'), 1, g, 0).ok());
}

TEST_F(HubStateTest, SameRankByAnotherWorkerIsAlreadyExists) {
  WorkerId a = Register("a");
  WorkerId b = Register("b");
  auto g = Group("m", 2);
  auto other = Group("m", 2, 50);  // same names and sizes, other bytes
  ASSERT_EQ(*Pub(a, "m", 1, g, 0), VersionState::kPending);
  const std::string before = Dump(hub_.List());
  EXPECT_EQ(Pub(b, "m", 1, g, 0).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(Pub(b, "m", 1, other, 0).status().code(),
            StatusCode::kAlreadyExists);
  // The same worker with other contents is rejected too.
  EXPECT_EQ(Pub(a, "m", 1, other, 0).status().code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(Dump(hub_.List()), before);
  EXPECT_EQ(hub_.Unpublish(b, "m", Version(1), 0).code(),
            StatusCode::kNotFound);

  // After commit, too.
  WorkerId c = Register("c");
  ASSERT_EQ(*Pub(c, "m", 1, g, 1), VersionState::kCommitted);
  EXPECT_EQ(Pub(b, "m", 1, g, 1).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(Pub(b, "m", 1, other, 1).status().code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(hub_.List()[0].versions[0].holders, 2u);
}

TEST_F(HubStateTest, RepublishingTheSamePartIsIdempotent) {
  WorkerId a = Register("a");
  WorkerId b = Register("b");
  auto g = Group("m", 2);
  ASSERT_EQ(*Pub(a, "m", 1, g, 0), VersionState::kPending);
  const std::string before = Dump(hub_.List());
  ASSERT_EQ(*Pub(a, "m", 1, g, 0), VersionState::kPending);
  EXPECT_EQ(Dump(hub_.List()), before);
  ASSERT_EQ(*Pub(b, "m", 1, g, 1), VersionState::kCommitted);
  const std::string committed = Dump(hub_.List());
  EXPECT_EQ(*Pub(a, "m", 1, g, 0), VersionState::kCommitted);
  EXPECT_EQ(*Pub(b, "m", 1, g, 1), VersionState::kCommitted);
  EXPECT_EQ(Dump(hub_.List()), committed);
}

TEST_F(HubStateTest, OneWorkerCannotHoldTwoRanksOfAGroup) {
  // The hub keeps one reference per worker and version; a second rank from
  // the same worker would silently replace the first, and the committed
  // version would lose the holder of part 0.
  WorkerId a = Register("a");
  WorkerId b = Register("b");
  auto g = Group("m", 2);
  ASSERT_EQ(*Pub(a, "m", 1, g, 0), VersionState::kPending);
  const std::string before = Dump(hub_.List());
  EXPECT_EQ(Pub(a, "m", 1, g, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Dump(hub_.List()), before);
  ASSERT_EQ(*Pub(b, "m", 1, g, 1), VersionState::kCommitted);
  EXPECT_EQ(ResolveCode("m", 1), StatusCode::kOk);
  // After commit too: with rank 1's holder gone, a may not take it over.
  ASSERT_TRUE(hub_.Unpublish(b, "m", Version(1), 0).ok());
  EXPECT_EQ(Pub(a, "m", 1, g, 1).status().code(), StatusCode::kInvalidArgument);
  Result<Resolution> r = hub_.Resolve(WorkerId("x"), "m", Version(1), true);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->holders.size(), 1u);
  EXPECT_EQ(r->holders[0].chunks,
            (std::vector<ChunkRange>{{0, r->manifest->chunk_base(1)}}));
}

// Regression: a worker that fetched a whole version and then published a
// rank of it lost its full reference (the hub replaced it with the one part),
// so the version had one complete holder fewer than it seemed.
TEST_F(HubStateTest, FullHolderPublishingARankKeepsItsFullReference) {
  WorkerId a = Register("a");
  WorkerId b = Register("b");
  WorkerId f = Register("f");
  auto g = Group("m", 2);
  ASSERT_EQ(*Pub(a, "m", 1, g, 0), VersionState::kPending);
  ASSERT_EQ(*Pub(b, "m", 1, g, 1), VersionState::kCommitted);
  ASSERT_TRUE(hub_.AddHolder(f, "m", Version(1), 7, ManifestOf(g), 0).ok());
  const std::string before = Dump(hub_.List());
  Result<VersionState> s = Pub(f, "m", 1, g, 0);
  EXPECT_EQ(s.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(s.status().message().find("already holds all of"),
            std::string::npos)
      << s.status().ToString();
  EXPECT_EQ(Dump(hub_.List()), before);
  // f still serves every chunk: with both trainer ranks gone it is the one
  // complete holder.
  ASSERT_TRUE(hub_.Unpublish(a, "m", Version(1), 0).ok());
  ASSERT_TRUE(hub_.Unpublish(b, "m", Version(1), 0).ok());
  Result<Resolution> r = hub_.Resolve(WorkerId("x"), "m", Version(1), true);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->state, VersionState::kCommitted);
  ASSERT_EQ(Ids(*r), std::vector<std::string>{f.value()});
  EXPECT_EQ(r->holders[0].chunks,
            (std::vector<ChunkRange>{{0, r->manifest->num_chunks()}}));
}

TEST_F(HubStateTest, TensorNamePublishedByTwoRanksRejected) {
  WorkerId a = Register("a");
  WorkerId b = Register("b");
  std::vector<PartLayout> g = {Part(0, {{"shared", 100}, {"a.only", 10}}),
                               Part(1, {{"b.only", 10}, {"shared", 100}})};
  ASSERT_EQ(*Pub(a, "m", 1, g, 0), VersionState::kPending);
  const std::string before = Dump(hub_.List());
  Result<VersionState> s = Pub(b, "m", 1, g, 1);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("shared"), std::string::npos);
  EXPECT_EQ(Dump(hub_.List()), before);
  // The rank is still free for a correct part.
  std::vector<PartLayout> fixed = {g[0], Part(1, {{"b.only", 10}})};
  EXPECT_EQ(*Pub(b, "m", 1, fixed, 1), VersionState::kCommitted);
}

TEST_F(HubStateTest, VersionNotGreaterThanLastIsRejectedAndChangesNothing) {
  WorkerId a = Register("a");
  WorkerId b = Register("b");
  auto g = Group("m", 1);
  ASSERT_EQ(*Pub(a, "m", 5, g, 0), VersionState::kCommitted);
  ASSERT_EQ(*Pub(a, "n", 1, g, 0), VersionState::kCommitted);
  const std::string before = Dump(hub_.List());
  for (uint64_t v : {1ull, 4ull}) {
    Result<VersionState> s = Pub(b, "m", v, g, 0);
    EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition) << v;
    EXPECT_EQ(Dump(hub_.List()), before) << v;
  }
  EXPECT_EQ(Pub(b, "m", 0, g, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Dump(hub_.List()), before);
  // Each model counts its own versions.
  EXPECT_EQ(*Pub(b, "n", 2, g, 0), VersionState::kCommitted);
  EXPECT_EQ(*Pub(b, "m", 6, g, 0), VersionState::kCommitted);
}

TEST_F(HubStateTest, VersionNumbersAreNotReusedAfterAbortOrPrune) {
  HubConfig c = DefaultConfig();
  c.max_dead_versions_per_model = 0;
  HubState hub(c);
  WorkerId a = Register(hub, "a");
  auto g2 = Group("m", 2);
  ASSERT_EQ(*hub.Publish(Args(a, "m", 3, g2, 0), 0), VersionState::kPending);
  ASSERT_TRUE(hub.Unpublish(a, "m", Version(3), 0).ok());
  // Pruned right away (no dead versions kept) ...
  ASSERT_EQ(hub.List().size(), 1u);
  EXPECT_TRUE(hub.List()[0].versions.empty()) << Dump(hub.List());
  // ... but its number stays used.
  auto g1 = Group("m", 1);
  EXPECT_EQ(hub.Publish(Args(a, "m", 3, g1, 0), 0).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(hub.Publish(Args(a, "m", 2, g1, 0), 0).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_TRUE(hub.Publish(Args(a, "m", 4, g1, 0), 0).ok());
}

// ------------------------------------------------------------ abort

TEST_F(HubStateTest, RankUnpublishingWhilePendingAborts) {
  WorkerId w[3] = {Register("r0"), Register("r1"), Register("r2")};
  auto g = Group("m", 3);
  ASSERT_EQ(*Pub(w[0], "m", 1, g, 0), VersionState::kPending);
  ASSERT_EQ(*Pub(w[1], "m", 1, g, 1), VersionState::kPending);
  ASSERT_TRUE(hub_.Unpublish(w[1], "m", Version(1), 0).ok());

  EXPECT_EQ(ResolveCode("m", 1), StatusCode::kAborted);
  Result<Resolution> peek = hub_.Resolve(WorkerId("x"), "m", Version(1), true);
  ASSERT_TRUE(peek.ok());
  EXPECT_EQ(peek->state, VersionState::kAborted);
  EXPECT_TRUE(peek->holders.empty());
  EXPECT_EQ(Pub(w[2], "m", 1, g, 2).status().code(), StatusCode::kAborted);
  EXPECT_EQ(Pub(w[1], "m", 1, g, 1).status().code(), StatusCode::kAborted);
  // The other ranks' references went with it.
  EXPECT_EQ(hub_.Unpublish(w[0], "m", Version(1), 0).code(),
            StatusCode::kNotFound);
  EXPECT_EQ(hub_.AddHolder(w[2], "m", Version(1), 1, ManifestOf(g), 0).code(),
            StatusCode::kAborted);
  std::vector<ModelSummary> ls = hub_.List();
  ASSERT_EQ(ls[0].versions.size(), 1u);
  EXPECT_EQ(ls[0].versions[0].state, VersionState::kAborted);
  EXPECT_EQ(ls[0].versions[0].holders, 0u);
  // The group moves on to a new version.
  EXPECT_EQ(Pub(w[0], "m", 1, g, 0).status().code(), StatusCode::kAborted);
  ASSERT_EQ(*Pub(w[0], "m", 2, g, 0), VersionState::kPending);
}

TEST_F(HubStateTest, RankLeaseExpiringWhilePendingAborts) {
  WorkerId a = Register(hub_, "a", {}, {}, 0);
  WorkerId b = Register(hub_, "b", {}, {}, 0);
  WorkerId c = Register(hub_, "c", {}, {}, 0);
  auto g = Group("m", 3);
  ASSERT_EQ(*Pub(a, "m", 1, g, 0, /*now_ms=*/500), VersionState::kPending);
  ASSERT_EQ(*Pub(b, "m", 1, g, 1, /*now_ms=*/100), VersionState::kPending);
  ASSERT_TRUE(hub_.Heartbeat(c, 600).ok());
  hub_.ExpireLeases(1100);  // b's lease (100 + 1000) ended; a and c live
  EXPECT_EQ(hub_.num_workers(), 2u);
  EXPECT_EQ(ResolveCode("m", 1), StatusCode::kAborted);
  EXPECT_EQ(Pub(c, "m", 1, g, 2, 1200).status().code(), StatusCode::kAborted);
  EXPECT_EQ(hub_.Unpublish(a, "m", Version(1), 1200).code(),
            StatusCode::kNotFound);
}

// ------------------------------------------------------------ availability

TEST_F(HubStateTest, OnlyHolderExpiringMakesVersionUnavailable) {
  WorkerId a = Register(hub_, "a", {}, {}, 0);
  WorkerId b = Register(hub_, "b", {}, {}, 0);
  auto g1 = Group("m", 1, 1);
  auto g2 = Group("m", 1, 2);
  ASSERT_EQ(*Pub(a, "m", 1, g1, 0, 0), VersionState::kCommitted);
  ASSERT_EQ(*Pub(b, "m", 2, g2, 0, 0), VersionState::kCommitted);
  ASSERT_TRUE(hub_.Heartbeat(a, 900).ok());
  hub_.ExpireLeases(1000);  // b gone

  EXPECT_EQ(ResolveCode("m", 2), StatusCode::kUnavailable);
  Result<Resolution> latest =
      hub_.Resolve(WorkerId("x"), "m", Version::Latest(), false);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->version, Version(1));
  // Not dropped: ls still shows it, and include_uncommitted returns it with
  // its manifest.
  std::vector<ModelSummary> ls = hub_.List();
  ASSERT_EQ(ls[0].versions.size(), 2u);
  EXPECT_EQ(ls[0].versions[1].state, VersionState::kUnavailable);
  EXPECT_EQ(ls[0].versions[1].holders, 0u);
  Result<Resolution> peek = hub_.Resolve(WorkerId("x"), "m", Version(2), true);
  ASSERT_TRUE(peek.ok());
  EXPECT_EQ(peek->state, VersionState::kUnavailable);
  ASSERT_TRUE(peek->manifest.has_value());
  EXPECT_TRUE(*peek->manifest == ManifestOf(g2));

  // A full copy reported later makes it readable again.
  ASSERT_TRUE(hub_.AddHolder(a, "m", Version(2), 9, ManifestOf(g2), 950).ok());
  EXPECT_EQ(ResolveCode("m", 2), StatusCode::kOk);
  EXPECT_EQ(hub_.Resolve(WorkerId("x"), "m", Version::Latest(), false)->version,
            Version(2));
  // And when nothing is left, latest is NOT_FOUND.
  hub_.ExpireLeases(5000);
  EXPECT_EQ(hub_.Resolve(WorkerId("x"), "m", Version::Latest(), false)
                .status()
                .code(),
            StatusCode::kNotFound);
}

// BeginFetch answers as Resolve, AddHolder (filling) and Schedule would,
// one after another: here, a version whose last complete holder left, with
// one filling holder still there.
TEST_F(HubStateTest, BeginFetchOfAnUnavailableVersionListsWhatIsLeft) {
  WorkerId a = Register(hub_, "a", {}, {}, 0);
  WorkerId f = Register(hub_, "f", {}, {}, 0);
  WorkerId r = Register(hub_, "r", {}, {}, 0);
  auto g = Group("m", 1, 1);
  ASSERT_EQ(*Pub(a, "m", 1, g, 0, 0), VersionState::kCommitted);
  BeginFetchArgs args;
  args.reader = f;
  args.model = "m";
  args.version = Version::Latest();
  args.fill_epoch = 4;
  Result<FetchStart> first = hub_.BeginFetch(args, 0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->resolution.version, Version(1));
  EXPECT_TRUE(first->filling.ok()) << first->filling.ToString();
  ASSERT_EQ(first->sources.size(), 1u);
  EXPECT_EQ(first->sources[0].worker, a);
  EXPECT_TRUE(first->resolution.holders.empty());  // sources in hand
  ASSERT_TRUE(hub_.Heartbeat(f, 900).ok());
  ASSERT_TRUE(hub_.Heartbeat(r, 900).ok());
  hub_.ExpireLeases(1000);  // a, the only complete holder, is gone

  args.reader = r;
  args.version = Version(1);
  args.fill_epoch.reset();
  args.settled = false;  // rebuilding: no considered answer yet
  Result<FetchStart> early = hub_.BeginFetch(args, 1000);
  EXPECT_EQ(early.status().code(), StatusCode::kUnavailable);
  args.settled = true;
  Result<FetchStart> later = hub_.BeginFetch(args, 1000);
  ASSERT_TRUE(later.ok()) << later.status().ToString();
  EXPECT_EQ(later->resolution.state, VersionState::kUnavailable);
  EXPECT_TRUE(later->resolution.manifest_digest.has_value());
  EXPECT_TRUE(later->sources_unavailable);
  EXPECT_TRUE(later->sources.empty());
  // The fallback: the filling holder, with what it has.
  ASSERT_EQ(Ids(later->resolution), std::vector<std::string>{f.value()});
  EXPECT_TRUE(later->resolution.holders[0].filling);
  EXPECT_EQ(later->resolution.holders[0].epoch, 4u);
}

TEST_F(HubStateTest, AddHolderKeepsVersionCommittedAfterTrainerLeaves) {
  WorkerId t = Register("t");
  WorkerId f = Register("f");
  auto g = Group("m", 1);
  ASSERT_EQ(*Pub(t, "m", 1, g, 0), VersionState::kCommitted);
  ASSERT_TRUE(hub_.AddHolder(f, "m", Version(1), 77, ManifestOf(g), 0).ok());
  EXPECT_EQ(hub_.List()[0].versions[0].holders, 2u);
  ASSERT_TRUE(hub_.Unpublish(t, "m", Version(1), 0).ok());
  Result<Resolution> r = hub_.Resolve(WorkerId("x"), "m", Version(1), false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->holders.size(), 1u);
  EXPECT_EQ(r->holders[0].worker, f);
  EXPECT_EQ(r->holders[0].epoch, 77u);
  EXPECT_EQ(r->holders[0].chunks,
            (std::vector<ChunkRange>{{0, ManifestOf(g).num_chunks()}}));
  // Adding the same holder again is harmless.
  ASSERT_TRUE(hub_.AddHolder(f, "m", Version(1), 78, ManifestOf(g), 0).ok());
  EXPECT_EQ(hub_.List()[0].versions[0].holders, 1u);
}

TEST_F(HubStateTest, TrainerRankThatFetchedEverythingBecomesFullHolder) {
  WorkerId a = Register("a");
  WorkerId b = Register("b");
  auto g = Group("m", 2);
  ASSERT_EQ(*Pub(a, "m", 1, g, 0), VersionState::kPending);
  ASSERT_EQ(*Pub(b, "m", 1, g, 1), VersionState::kCommitted);
  ASSERT_TRUE(hub_.AddHolder(a, "m", Version(1), 5, ManifestOf(g), 0).ok());
  // b leaves; a covers part 1 too now.
  ASSERT_TRUE(hub_.Unpublish(b, "m", Version(1), 0).ok());
  EXPECT_EQ(ResolveCode("m", 1), StatusCode::kOk);
}

TEST_F(HubStateTest, AddHolderRejections) {
  WorkerId t = Register("t");
  WorkerId f = Register("f");
  auto g = Group("m", 2);
  auto other = Group("m", 2, 9);
  ASSERT_EQ(*Pub(t, "m", 1, g, 0), VersionState::kPending);
  WorkerId t1 = Register("t1");
  ASSERT_EQ(*Pub(t1, "m", 1, g, 1), VersionState::kCommitted);
  const std::string before = Dump(hub_.List());

  EXPECT_EQ(hub_.AddHolder(f, "m", Version(1), 1, ManifestOf(other), 0).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(hub_.AddHolder(f, "m", Version(1), 1,
                           Manifest(2, 2 * kMinChunkBytes, g), 0)
                .code(),
            StatusCode::kInvalidArgument)
      << "invalid manifest";
  EXPECT_EQ(hub_.AddHolder(f, "m", Version(0), 1, ManifestOf(g), 0).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      hub_.AddHolder(WorkerId("w7-99"), "m", Version(1), 1, ManifestOf(g), 0)
          .code(),
      StatusCode::kNotFound);
  EXPECT_EQ(Dump(hub_.List()), before);
  EXPECT_EQ(hub_.Unpublish(f, "m", Version(1), 0).code(),
            StatusCode::kNotFound);
}

TEST_F(HubStateTest, CommittedOnlyWhileEveryChunkHasAHolder) {
  WorkerId a = Register("a");
  WorkerId b = Register("b");
  WorkerId f = Register("f");
  auto g = Group("m", 2);
  ASSERT_EQ(*Pub(a, "m", 1, g, 0), VersionState::kPending);
  ASSERT_EQ(*Pub(b, "m", 1, g, 1), VersionState::kCommitted);
  ASSERT_TRUE(hub_.AddHolder(f, "m", Version(1), 1, ManifestOf(g), 0).ok());

  // The holder of part 1 leaves: f still covers everything.
  ASSERT_TRUE(hub_.Unpublish(b, "m", Version(1), 0).ok());
  EXPECT_EQ(ResolveCode("m", 1), StatusCode::kOk);
  // f leaves too: part 1's chunks have no holder.
  ASSERT_TRUE(hub_.Unpublish(f, "m", Version(1), 0).ok());
  EXPECT_EQ(ResolveCode("m", 1), StatusCode::kUnavailable);
  Result<Resolution> peek = hub_.Resolve(WorkerId("x"), "m", Version(1), true);
  ASSERT_TRUE(peek.ok());
  ASSERT_EQ(peek->holders.size(), 1u);
  EXPECT_EQ(peek->holders[0].chunks,
            (std::vector<ChunkRange>{{0, peek->manifest->chunk_base(1)}}));
  // A worker that holds part 1 publishes it again: covered again.
  WorkerId b2 = Register("b2");
  EXPECT_EQ(*Pub(b2, "m", 1, g, 1), VersionState::kCommitted);
  EXPECT_EQ(ResolveCode("m", 1), StatusCode::kOk);
  // Part 0's holder leaves: part 0 uncovered.
  ASSERT_TRUE(hub_.Unpublish(a, "m", Version(1), 0).ok());
  EXPECT_EQ(ResolveCode("m", 1), StatusCode::kUnavailable);
}

// ------------------------------------------------------------ resolve

TEST_F(HubStateTest, ResolveErrors) {
  WorkerId t = Register("t");
  EXPECT_EQ(ResolveCode("m", 1), StatusCode::kNotFound);
  EXPECT_EQ(hub_.Resolve(t, "m", Version::Latest(), true).status().code(),
            StatusCode::kNotFound);
  auto g = Group("m", 1);
  ASSERT_TRUE(Pub(t, "m", 2, g, 0).ok());
  EXPECT_EQ(ResolveCode("m", 1), StatusCode::kNotFound);
  EXPECT_EQ(ResolveCode("m", 3), StatusCode::kNotFound);
  EXPECT_EQ(ResolveCode("m", 2), StatusCode::kOk);
}

TEST_F(HubStateTest, ResolveOrdersHoldersByTopologyAndExcludesReader) {
  // Registered far-to-near so that id order is the reverse of the answer.
  WorkerId other_dc = Register("other_dc", L("dc2", "r1", "h1"));
  WorkerId same_dc = Register("same_dc", L("dc1", "r9", "h9"));
  WorkerId same_rack = Register("same_rack", L("dc1", "r1", "h8"));
  WorkerId same_host = Register("same_host", L("dc1", "r1", "h1"));
  WorkerId reader = Register("reader", L("dc1", "r1", "h1"));
  auto g = Group("m", 1);
  ASSERT_TRUE(Pub(other_dc, "m", 1, g, 0).ok());
  for (const WorkerId& w : {same_dc, same_rack, same_host, reader}) {
    ASSERT_TRUE(hub_.AddHolder(w, "m", Version(1), 1, ManifestOf(g), 0).ok());
  }
  const std::vector<std::string> want = {same_host.value(), same_rack.value(),
                                         same_dc.value(), other_dc.value()};
  for (int i = 0; i < 5; ++i) {  // rotation never reorders distinct tiers
    Result<Resolution> r = hub_.Resolve(reader, "m", Version(1), false);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(Ids(*r), want) << i;
  }
  // A reader the hub does not know sees every holder.
  Result<Resolution> r =
      hub_.Resolve(WorkerId("stranger"), "m", Version(1), false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->holders.size(), 5u);
}

TEST_F(HubStateTest, ResolveRotatesEquallyNearHolders) {
  WorkerId reader = Register("reader", L("dc1", "r1", "h1"));
  WorkerId near = Register("near", L("dc1", "r1", "h1"));
  WorkerId e[3] = {Register("e0", L("dc1", "r2", "h2")),
                   Register("e1", L("dc1", "r3", "h3")),
                   Register("e2", L("dc1", "r4", "h4"))};
  auto g = Group("m", 1);
  ASSERT_TRUE(Pub(e[0], "m", 1, g, 0).ok());
  ASSERT_TRUE(hub_.AddHolder(e[1], "m", Version(1), 1, ManifestOf(g), 0).ok());
  ASSERT_TRUE(hub_.AddHolder(e[2], "m", Version(1), 1, ManifestOf(g), 0).ok());

  // Only equally near holders: three calls put each one first once.
  std::set<std::string> firsts;
  const std::set<std::string> all = {e[0].value(), e[1].value(), e[2].value()};
  for (int i = 0; i < 3; ++i) {
    Result<Resolution> r = hub_.Resolve(reader, "m", Version(1), false);
    ASSERT_TRUE(r.ok());
    std::vector<std::string> ids = Ids(*r);
    ASSERT_EQ(ids.size(), 3u);
    EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()), all);
    firsts.insert(ids[0]);
  }
  EXPECT_EQ(firsts, all);

  // A nearer holder always comes first; the rest still rotate.
  ASSERT_TRUE(hub_.AddHolder(near, "m", Version(1), 1, ManifestOf(g), 0).ok());
  std::set<std::string> seconds;
  for (int i = 0; i < 8; ++i) {
    Result<Resolution> r = hub_.Resolve(reader, "m", Version(1), false);
    ASSERT_TRUE(r.ok());
    std::vector<std::string> ids = Ids(*r);
    ASSERT_EQ(ids.size(), 4u);
    EXPECT_EQ(ids[0], near.value());
    seconds.insert(ids[1]);
  }
  EXPECT_GE(seconds.size(), 2u);
}

// ------------------------------------------------------------ unpublish

TEST_F(HubStateTest, UnpublishErrors) {
  WorkerId t = Register("t");
  EXPECT_EQ(hub_.Unpublish(WorkerId("w7-99"), "m", Version(1), 0).code(),
            StatusCode::kNotFound);
  EXPECT_EQ(hub_.Unpublish(t, "m", Version(1), 0).code(),
            StatusCode::kNotFound);
  auto g = Group("m", 1);
  ASSERT_TRUE(Pub(t, "m", 1, g, 0).ok());
  ASSERT_TRUE(hub_.Unpublish(t, "m", Version(1), 0).ok());
  EXPECT_EQ(hub_.Unpublish(t, "m", Version(1), 0).code(),
            StatusCode::kNotFound);
}

TEST_F(HubStateTest, CallsFromAWorkerRenewItsLease) {
  WorkerId t = Register(hub_, "t", {}, {}, 0);
  auto g = Group("m", 1);
  ASSERT_TRUE(Pub(t, "m", 1, g, 0, /*now_ms=*/800).ok());
  hub_.ExpireLeases(1500);
  EXPECT_EQ(hub_.num_workers(), 1u);
  ASSERT_TRUE(hub_.AddHolder(t, "m", Version(1), 1, ManifestOf(g), 1700).ok());
  hub_.ExpireLeases(2600);
  EXPECT_EQ(hub_.num_workers(), 1u);
  hub_.ExpireLeases(2700);
  EXPECT_EQ(hub_.num_workers(), 0u);
}

// ------------------------------------------------------------ rebuild

TEST_F(HubStateTest, RebuildAfterRestartRestoresCommittedVersions) {
  auto g1 = Group("m", 2, 1);
  auto g2 = Group("m", 2, 2);
  WorkerId r0 = Register("r0");
  WorkerId r1 = Register("r1");
  WorkerId f = Register("f");
  ASSERT_TRUE(Pub(r0, "m", 1, g1, 0).ok());
  ASSERT_EQ(*Pub(r1, "m", 1, g1, 1), VersionState::kCommitted);
  ASSERT_TRUE(Pub(r0, "m", 2, g2, 0).ok());
  ASSERT_EQ(*Pub(r1, "m", 2, g2, 1), VersionState::kCommitted);
  ASSERT_TRUE(hub_.AddHolder(f, "m", Version(1), 3, ManifestOf(g1), 0).ok());
  ASSERT_TRUE(hub_.AddHolder(f, "m", Version(2), 3, ManifestOf(g2), 0).ok());
  const Manifest m1 = *hub_.Resolve(f, "m", Version(1), false)->manifest;
  const Manifest m2 = *hub_.Resolve(f, "m", Version(2), false)->manifest;
  const std::string before = Dump(hub_.List());

  // The hub restarts and forgets everything.
  HubConfig c = DefaultConfig();
  c.incarnation = 8;
  HubState fresh(c);
  EXPECT_EQ(fresh.Heartbeat(r0, 0).code(), StatusCode::kNotFound);
  EXPECT_EQ(Register(fresh, "r0", {}, r0), r0);
  EXPECT_EQ(Register(fresh, "r1", {}, r1), r1);
  EXPECT_EQ(Register(fresh, "f", {}, f), f);
  // Ranks report the newest version first, then the older one: the older
  // one is not greater than the highest, which rebuild allows.
  ASSERT_EQ(*fresh.Publish(Args(r0, "m", 2, g2, 0, true), 0),
            VersionState::kPending);
  EXPECT_EQ(fresh.Publish(Args(r0, "m", 1, g1, 0, false), 0).status().code(),
            StatusCode::kFailedPrecondition);
  ASSERT_EQ(*fresh.Publish(Args(r0, "m", 1, g1, 0, true), 0),
            VersionState::kPending);
  ASSERT_EQ(*fresh.Publish(Args(r1, "m", 1, g1, 1, true), 0),
            VersionState::kCommitted);
  // Only rank 0 of v2 came back; the full holder proves it committed.
  ASSERT_TRUE(fresh.AddHolder(f, "m", Version(2), 3, m2, 0).ok());
  ASSERT_TRUE(fresh.AddHolder(f, "m", Version(1), 3, m1, 0).ok());

  Result<Resolution> v1 = fresh.Resolve(WorkerId("x"), "m", Version(1), false);
  Result<Resolution> v2 = fresh.Resolve(WorkerId("x"), "m", Version(2), false);
  ASSERT_TRUE(v1.ok()) << v1.status().ToString();
  ASSERT_TRUE(v2.ok()) << v2.status().ToString();
  EXPECT_TRUE(*v1->manifest == m1);
  EXPECT_TRUE(*v2->manifest == m2);
  EXPECT_EQ(v1->holders.size(), 3u);
  EXPECT_EQ(v2->holders.size(), 2u);
  // Rank 1 reports v2 late; all is as before the restart.
  ASSERT_EQ(*fresh.Publish(Args(r1, "m", 2, g2, 1, true), 0),
            VersionState::kCommitted);
  EXPECT_EQ(Dump(fresh.List()), before);
  // New versions still must be greater.
  auto g3 = Group("m", 1, 3);
  EXPECT_EQ(fresh.Publish(Args(r0, "m", 2, g3, 0, false), 0).status().code(),
            StatusCode::kInvalidArgument)
      << "v2 exists with group size 2";
  EXPECT_TRUE(fresh.Publish(Args(r0, "m", 3, g3, 0, false), 0).ok());
}

TEST_F(HubStateTest, RebuiltRankMustMatchWhatIsCommitted) {
  auto g = Group("m", 2, 1);
  auto other = Group("m", 2, 2);
  WorkerId f = Register("f");
  WorkerId r0 = Register("r0");
  // On a fresh hub, a full holder reports first.
  ASSERT_TRUE(hub_.AddHolder(f, "m", Version(4), 1, ManifestOf(g), 0).ok());
  EXPECT_EQ(hub_.Publish(Args(r0, "m", 4, other, 0, true), 0).status().code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(*hub_.Publish(Args(r0, "m", 4, g, 0, true), 0),
            VersionState::kCommitted);
  EXPECT_EQ(hub_.List()[0].versions[0].holders, 2u);
}

TEST_F(HubStateTest, AddHolderDisagreeingWithRebuiltPartRejected) {
  auto g = Group("m", 2, 1);
  auto other = Group("m", 2, 2);
  WorkerId r1 = Register("r1");
  WorkerId f = Register("f");
  ASSERT_EQ(*hub_.Publish(Args(r1, "m", 1, g, 1, true), 0),
            VersionState::kPending);
  const std::string before = Dump(hub_.List());
  EXPECT_EQ(hub_.AddHolder(f, "m", Version(1), 1, ManifestOf(other), 0).code(),
            StatusCode::kInvalidArgument);
  // A manifest of another group size (fewer parts than the published rank).
  auto single = Group("m", 1, 1);
  EXPECT_EQ(hub_.AddHolder(f, "m", Version(1), 1, ManifestOf(single), 0).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Dump(hub_.List()), before);
  ASSERT_TRUE(hub_.AddHolder(f, "m", Version(1), 1, ManifestOf(g), 0).ok());
  EXPECT_EQ(ResolveCode("m", 1), StatusCode::kOk);
}

TEST_F(HubStateTest, AddHolderOfUnknownVersionCreatesItCommitted) {
  auto g = Group("m", 3, 4);
  WorkerId f = Register("f");
  ASSERT_TRUE(hub_.AddHolder(f, "m", Version(9), 2, ManifestOf(g), 0).ok());
  std::vector<ModelSummary> ls = hub_.List();
  ASSERT_EQ(ls.size(), 1u);
  ASSERT_EQ(ls[0].versions.size(), 1u);
  const VersionSummary& v = ls[0].versions[0];
  EXPECT_EQ(v.version, Version(9));
  EXPECT_EQ(v.state, VersionState::kCommitted);
  EXPECT_EQ(v.group_size, 3u);
  EXPECT_EQ(v.parts_published, 3u);
  EXPECT_EQ(v.holders, 1u);
  EXPECT_EQ(v.tensors, 6u);
  EXPECT_EQ(v.total_bytes, ManifestOf(g).total_bytes());
  Result<Resolution> latest =
      hub_.Resolve(WorkerId("x"), "m", Version::Latest(), false);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->version, Version(9));
  // It counts as the highest version seen.
  EXPECT_EQ(Pub(f, "m", 8, Group("m", 1), 0).status().code(),
            StatusCode::kFailedPrecondition);
}

// ------------------------------------------------------------ pruning

TEST_F(HubStateTest, KeepsAtMostMaxDeadVersionsPerModel) {
  HubConfig c = DefaultConfig();
  c.max_dead_versions_per_model = 2;
  HubState hub(c);
  WorkerId t = Register(hub, "t");
  WorkerId keeper = Register(hub, "keeper");
  auto g = Group("m", 1);
  auto g2 = Group("m", 2);
  // v1 stays held throughout and is never pruned.
  ASSERT_TRUE(hub.Publish(Args(t, "m", 1, g, 0), 0).ok());
  ASSERT_TRUE(hub.AddHolder(keeper, "m", Version(1), 1, ManifestOf(g), 0).ok());
  for (uint64_t v = 2; v <= 7; ++v) {
    // Even versions die unavailable, odd ones abort.
    auto& parts = v % 2 == 0 ? g : g2;
    ASSERT_TRUE(hub.Publish(Args(t, "m", v, parts, 0), 0).ok()) << v;
    ASSERT_TRUE(hub.Unpublish(t, "m", Version(v), 0).ok()) << v;
  }
  ASSERT_TRUE(hub.Unpublish(t, "m", Version(1), 0).ok());
  std::vector<ModelSummary> ls = hub.List();
  ASSERT_EQ(ls.size(), 1u);
  std::vector<uint64_t> kept;
  for (const VersionSummary& s : ls[0].versions)
    kept.push_back(s.version.value());
  EXPECT_EQ(kept, (std::vector<uint64_t>{1, 6, 7})) << Dump(ls);
  EXPECT_EQ(ls[0].versions[1].state, VersionState::kUnavailable);
  EXPECT_EQ(ls[0].versions[2].state, VersionState::kAborted);
  EXPECT_EQ(ls[0].versions[0].state, VersionState::kCommitted);
}

}  // namespace
}  // namespace tensorhub::hub

namespace tensorhub::hub {
namespace {

TEST_F(HubStateTest, LeaveDropsEveryReferenceAtOnce) {
  WorkerId t = Register("t");
  WorkerId r = Register("r");
  auto g = Group("m", 1, 3);
  ASSERT_EQ(*Pub(t, "m", 1, g, 0), VersionState::kCommitted);
  auto g2 = Group("p", 2, 4);
  ASSERT_EQ(*Pub(r, "p", 1, g2, 0), VersionState::kPending);
  ASSERT_TRUE(hub_.Leave(t).ok());
  EXPECT_EQ(ResolveCode("m", 1), StatusCode::kUnavailable);
  EXPECT_EQ(hub_.num_workers(), 1u);
  EXPECT_EQ(hub_.Heartbeat(t, 0).code(), StatusCode::kNotFound);
  EXPECT_EQ(hub_.Leave(t).code(), StatusCode::kNotFound);
  // A rank of a pending group leaving aborts the group.
  ASSERT_TRUE(hub_.Leave(r).ok());
  EXPECT_EQ(ResolveCode("p", 1), StatusCode::kAborted);
}

}  // namespace
}  // namespace tensorhub::hub

namespace tensorhub::hub {
namespace {

// Readers arriving together form a pipeline: each holder uploads to one
// reader at a time, filling holders only feed readers that joined later.
TEST_F(HubStateTest, ScheduleFormsAPipelineWithoutCycles) {
  WorkerId t = Register("t");
  auto g = Group("m", 1, 5);
  Manifest m = ManifestOf(g);
  ASSERT_EQ(*Pub(t, "m", 1, g, 0), VersionState::kCommitted);
  std::vector<WorkerId> readers;
  for (int i = 0; i < 4; ++i) {
    readers.push_back(Register("r" + std::to_string(i)));
    // Every reader registers as a filling holder before it asks.
    ASSERT_TRUE(hub_.AddHolder(readers.back(), "m", Version(1), 10 + i, m, 0,
                               /*filling=*/true)
                    .ok());
  }
  // All four registered before any scheduled: the worst case for cycles.
  std::map<std::string, std::string> parent;
  for (const WorkerId& r : readers) {
    auto s = hub_.Schedule(r, "m", Version(1), {}, 4);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_EQ(s->size(), 1u);
    parent[r.value()] = (*s)[0].worker.value();
  }
  EXPECT_EQ(parent[readers[0].value()], t.value());
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(parent[readers[i].value()], readers[i - 1].value()) << i;
  }
  // A filling holder is no copy: the version still needs the trainer.
  ASSERT_TRUE(hub_.Unpublish(t, "m", Version(1), 0).ok());
  EXPECT_EQ(ResolveCode("m", 1), StatusCode::kUnavailable);
}

TEST_F(HubStateTest, ScheduleStripesOverIdleCompleteHoldersAndReleases) {
  WorkerId t = Register("t");
  auto g = Group("m", 1, 6);
  Manifest m = ManifestOf(g);
  ASSERT_EQ(*Pub(t, "m", 1, g, 0), VersionState::kCommitted);
  std::vector<WorkerId> full;
  for (int i = 0; i < 3; ++i) {
    full.push_back(Register("f" + std::to_string(i)));
    ASSERT_TRUE(hub_.AddHolder(full.back(), "m", Version(1), 1, m, 0).ok());
  }
  WorkerId late = Register("late");
  auto s = hub_.Schedule(late, "m", Version(1), {}, 3);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->size(), 3u);  // three idle complete holders, one reader
  // While it fetches they count as busy: the next reader gets the fourth.
  WorkerId next = Register("next");
  auto s2 = hub_.Schedule(next, "m", Version(1), {}, 3);
  ASSERT_TRUE(s2.ok());
  ASSERT_EQ(s2->size(), 1u);
  std::set<std::string> first;
  for (const HolderView& h : *s) first.insert(h.worker.value());
  EXPECT_EQ(first.count((*s2)[0].worker.value()), 0u);
  // Released when its fetch ends; excluded holders are never chosen.
  hub_.FetchDone(late, "m", Version(1));
  auto s3 =
      hub_.Schedule(late, "m", Version(1), {full[0], full[1], full[2]}, 3);
  ASSERT_TRUE(s3.ok());
  for (const HolderView& h : *s3) {
    EXPECT_NE(h.worker, full[0]);
    EXPECT_NE(h.worker, full[1]);
    EXPECT_NE(h.worker, full[2]);
  }
  auto none =
      hub_.Schedule(late, "m", Version(1), {t, full[0], full[1], full[2]}, 3);
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable);
}

// The chunks [begin, end) that a set of sources holds, merged.
std::vector<ChunkRange> Covered(const std::vector<HolderView>& sources) {
  std::vector<ChunkRange> all;
  for (const HolderView& h : sources)
    all.insert(all.end(), h.chunks.begin(), h.chunks.end());
  std::sort(all.begin(), all.end(),
            [](const ChunkRange& a, const ChunkRange& b) {
              return a.begin < b.begin;
            });
  std::vector<ChunkRange> out;
  for (const ChunkRange& r : all) {
    if (!out.empty() && r.begin <= out.back().end) {
      out.back().end = std::max(out.back().end, r.end);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

// A group of 8 ranks, each holding one part, and max_sources 4: the sources
// must still cover every chunk (a reader once got the same 4 ranks on every
// call and waited for the rest until its deadline).
TEST_F(HubStateTest, ScheduleCoversEveryPartOfAGroupLargerThanMaxSources) {
  constexpr uint32_t kRanks = 8;
  auto g = Group("m", kRanks, 9);
  Manifest m = ManifestOf(g);
  const std::vector<ChunkRange> everything = {{0, m.num_chunks()}};
  std::vector<WorkerId> ranks;
  for (uint32_t r = 0; r < kRanks; ++r) {
    ranks.push_back(Register("t" + std::to_string(r),
                             L("a", "r1", "h" + std::to_string(r))));
    ASSERT_TRUE(Pub(ranks.back(), "m", 1, g, r).ok());
  }
  ASSERT_EQ(ResolveCode("m", 1), StatusCode::kOk);
  WorkerId r1 = Register("r1", L("a", "r2", "h20"));
  ASSERT_TRUE(hub_.AddHolder(r1, "m", Version(1), 1, m, 0, true).ok());
  for (int call = 0; call < 3; ++call) {  // the same answer on every call
    auto s = hub_.Schedule(r1, "m", Version(1), {}, 4);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->size(), kRanks);  // one per part: max_sources is exceeded
    EXPECT_EQ(Covered(*s), everything);
  }
  // Without rank 3 (it failed this reader) nobody has its part: the others
  // are still given, and a retry without the exclusion covers everything.
  auto s = hub_.Schedule(r1, "m", Version(1), {ranks[3]}, 4);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->size(), kRanks - 1);
  uint64_t part3 = m.chunk_base(3), part4 = m.chunk_base(4);
  EXPECT_EQ(Covered(*s),
            (std::vector<ChunkRange>{{0, part3}, {part4, m.num_chunks()}}));
  ASSERT_TRUE(hub_.Schedule(r1, "m", Version(1), {}, 4).ok());
  // A second reader that joins while r1 fills reads from r1 alone: r1 will
  // hold every chunk and is idle, so the ranks upload each part once.
  WorkerId r2 = Register("r2", L("a", "r2", "h21"));
  ASSERT_TRUE(hub_.AddHolder(r2, "m", Version(1), 1, m, 0, true).ok());
  auto s2 = hub_.Schedule(r2, "m", Version(1), {}, 4);
  ASSERT_TRUE(s2.ok());
  ASSERT_EQ(s2->size(), 1u);
  EXPECT_EQ((*s2)[0].worker, r1);
  // Excluding r1, r2 falls back to the ranks, and again gets all of them.
  auto s3 = hub_.Schedule(r2, "m", Version(1), {r1}, 4);
  ASSERT_TRUE(s3.ok());
  EXPECT_EQ(Covered(*s3), everything);
  // Once r1 holds everything, a reader with max_sources 1 gets r1 and no
  // rank: one holder of every chunk covers the version.
  ASSERT_TRUE(hub_.AddHolder(r1, "m", Version(1), 1, m, 0, false).ok());
  ASSERT_TRUE(hub_.Unpublish(r2, "m", Version(1), 0).ok());
  WorkerId r3 = Register("r3", L("a", "r2", "h22"));
  auto s4 = hub_.Schedule(r3, "m", Version(1), {}, 1);
  ASSERT_TRUE(s4.ok());
  ASSERT_EQ(s4->size(), 1u);
  EXPECT_EQ((*s4)[0].worker, r1);
}

// Readers of one version arrive in random racks. r1 (rack 1) reads from the
// trainer, r2 (rack 2) from r1; r3 lands in rack 1, whose only holder r1
// already uploads to r2. On a full-bisection fabric r3 reads from r2 (idle,
// another rack) so that r1 uploads once. Another datacenter's idle holder
// never beats a busy one in the reader's datacenter. (Oversubscribed racks:
// RackAware* below.)
TEST_F(HubStateTest,
       ScheduleWeighsABusyHolderInTheRackAgainstAnIdleOneOutside) {
  WorkerId t = Register("t", L("a", "r0", "h0"));
  auto g = Group("m", 1, 11);
  Manifest m = ManifestOf(g);
  ASSERT_TRUE(Pub(t, "m", 1, g, 0).ok());
  auto join_and_schedule = [&](const std::string& name, Labels l) {
    WorkerId w = Register(name, std::move(l));
    EXPECT_TRUE(hub_.AddHolder(w, "m", Version(1), 1, m, 0, true).ok());
    auto s = hub_.Schedule(w, "m", Version(1), {}, 4);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s.ok() ? s->size() : 0u, 1u);
    EXPECT_EQ(hub_.RecheckAfterMs(w, "m", Version(1)), 0);
    return std::make_pair(w,
                          s.ok() && !s->empty() ? (*s)[0].worker : WorkerId());
  };
  auto [r1, src1] = join_and_schedule("r1", L("a", "r1", "h1"));
  EXPECT_EQ(src1, t);
  auto [r2, src2] = join_and_schedule("r2", L("a", "r2", "h2"));
  EXPECT_EQ(src2, r1);
  auto [r3, src3] = join_and_schedule("r3", L("a", "r1", "h3"));
  EXPECT_EQ(src3, r2);
  // An idle complete holder in datacenter b: a reader in a, in a rack
  // with no holder, still reads inside a.
  auto b = join_and_schedule("b1", L("b", "r9", "h9"));
  EXPECT_TRUE(hub_.AddHolder(b.first, "m", Version(1), 1, m, 0, false).ok());
  auto r4 = join_and_schedule("r4", L("a", "r4", "h4"));
  EXPECT_NE(r4.second, b.first);
  EXPECT_EQ(r4.second, r3);  // idle in a, and the latest to join
}

// ---------------------------------------------- rack-aware pipelines

class RackAwareTest : public HubStateTest {
 protected:
  static HubConfig RackConfig(double ratio = 4) {
    HubConfig c = DefaultConfig();
    c.rack_oversubscription = ratio;
    return c;
  }
  void SetUp() override {
    g_ = Group("m", 1, 21);
    m_ = ManifestOf(g_);
  }
  // Registers, joins as a filling holder and schedules; the first source.
  WorkerId Join(HubState& hub, const std::string& name, Labels l,
                const std::set<WorkerId>& exclude = {}) {
    WorkerId w = Register(hub, name, std::move(l));
    workers_[name] = w;
    EXPECT_TRUE(hub.AddHolder(w, "m", Version(1), 1, m_, 0, true).ok());
    auto s = hub.Schedule(w, "m", Version(1), exclude, 1);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() && !s->empty() ? (*s)[0].worker : WorkerId();
  }
  WorkerId Source(HubState& hub, const std::string& name) {
    auto s = hub.Recheck(workers_.at(name), "m", Version(1), 1);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() && s->size() == 1 ? (*s)[0].worker : WorkerId();
  }
  WorkerId W(const std::string& name) const { return workers_.at(name); }
  int64_t Recheck(HubState& hub, const std::string& name) const {
    return hub.RecheckAfterMs(workers_.at(name), "m", Version(1));
  }

  std::vector<PartLayout> g_;
  Manifest m_;
  std::map<std::string, WorkerId> workers_;
};

// Readers arrive in random racks all at once, as after a publish. Each rack
// is entered once; a reader arriving in a rack whose holders all feed
// others takes the place of the rack's exit, and the reader outside that
// the exit fed is moved onto it, learning so at its Recheck: the pipeline
// becomes trainer -> rack 1 -> rack 2 -> rack 3, the order a ring would
// have, without knowing in advance who asks.
TEST_F(RackAwareTest, ReadersInARackFeedEachOtherAndTheRackIsEnteredOnce) {
  HubState hub(RackConfig());
  WorkerId t = Register(hub, "t", L("a", "r0", "h0"));
  ASSERT_TRUE(hub.Publish(Args(t, "m", 1, g_, 0), 0).ok());
  EXPECT_EQ(Join(hub, "a1", L("a", "r1", "h1")), t);        // enters rack 1
  EXPECT_EQ(Recheck(hub, "a1"), 2);                         // t's rack: movable
  EXPECT_EQ(Join(hub, "b1", L("a", "r2", "h2")), W("a1"));  // enters rack 2
  EXPECT_EQ(Recheck(hub, "b1"), 2);
  // a2 lands in rack 1, whose only holder feeds b1 in rack 2: a2 takes
  // a1's place as rack 1's exit, b1 now reads from a2.
  EXPECT_EQ(Join(hub, "a2", L("a", "r1", "h3")), W("a1"));
  EXPECT_EQ(Recheck(hub, "a2"), 0);  // reads inside its rack
  EXPECT_EQ(Join(hub, "c1", L("a", "r3", "h4")), W("b1"));  // enters rack 3
  EXPECT_EQ(Join(hub, "b2", L("a", "r2", "h5")), W("b1"));
  EXPECT_EQ(Join(hub, "a3", L("a", "r1", "h6")), W("a2"));
  // The books: t -> a1 -> a2 -> a3 -> b1 -> b2 -> c1.
  EXPECT_EQ(Source(hub, "b1"), W("a3"));
  EXPECT_EQ(Source(hub, "c1"), W("b2"));
  EXPECT_EQ(Source(hub, "a2"), W("a1"));
  // A recheck after a move comes soon again; one that found nothing new,
  // twice as late, up to the bound.
  EXPECT_EQ(Recheck(hub, "b1"), 2);
  EXPECT_EQ(Source(hub, "b1"), W("a3"));
  EXPECT_EQ(Recheck(hub, "b1"), 4);
  for (int i = 0; i < 12; ++i) Source(hub, "b1");
  EXPECT_EQ(Recheck(hub, "b1"), 1000);
  // A reader whose recheck finds a source gone is scheduled anew.
  ASSERT_TRUE(hub.Leave(W("a3")).ok());
  EXPECT_EQ(Source(hub, "b1"), W("a2"));  // a2 is idle again, in rack 1
  EXPECT_EQ(hub.Stats().readers_scheduled, 5u);
}

// The DAG holds when moves happen: a reader placed in its rack's line sits
// before every reader of a later line, so nobody ever reads (transitively)
// from itself, however readers arrive, leave and come back.
TEST_F(RackAwareTest, TheMovedPipelineHasNoCycles) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    HubState hub(RackConfig());
    std::mt19937 rng(seed);
    WorkerId t = Register(hub, "t", L("a", "r0", "h0"));
    ASSERT_TRUE(hub.Publish(Args(t, "m", 1, g_, 0), 0).ok());
    std::vector<WorkerId> readers;
    for (int i = 0; i < 40; ++i) {
      const std::string name = "w" + std::to_string(i);
      Join(hub, name, L("a", "r" + std::to_string(1 + rng() % 5), name));
      readers.push_back(W(name));
      if (rng() % 5 == 0) {  // someone leaves mid-way
        const WorkerId gone = readers[rng() % readers.size()];
        (void)hub.Leave(gone);
        readers.erase(std::find(readers.begin(), readers.end(), gone));
      }
    }
    // Follow each reader's books upstream: the trainer within n steps.
    std::map<WorkerId, WorkerId> up;
    for (const WorkerId& r : readers) {
      auto s = hub.Recheck(r, "m", Version(1), 1);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      ASSERT_EQ(s->size(), 1u);
      up[r] = (*s)[0].worker;
    }
    for (const WorkerId& r : readers) {
      WorkerId at = r;
      size_t steps = 0;
      while (at != t && steps <= readers.size()) {
        ASSERT_TRUE(up.count(at) > 0) << at.value() << " reads from a leaver";
        at = up.at(at);
        ++steps;
      }
      EXPECT_EQ(at, t) << r.value() << " is on a cycle";
    }
  }
}

// When a rack's holders are all busy and no exit can be moved, the rack's
// uplink budget (its workers over its ratio, per-rack figures first)
// decides: cross to an idle holder outside while the uplink has room,
// share the least busy holder in the rack once it has none.
TEST_F(RackAwareTest, TheUplinkBudgetDecidesBetweenCrossingAndSharing) {
  for (double ratio_a : {4.0, 1.2}) {
    SCOPED_TRACE("rack A at " + std::to_string(ratio_a));
    HubConfig config = RackConfig(4);
    config.rack_oversubscription_by_rack[{"dc", "A"}] = ratio_a;
    HubState hub(config);
    workers_.clear();
    WorkerId t = Register(hub, "t", L("dc", "T", "ht"));
    ASSERT_TRUE(hub.Publish(Args(t, "m", 1, g_, 0), 0).ok());
    // An idle complete copy in rack C.
    WorkerId c = Register(hub, "c", L("dc", "C", "hc"));
    EXPECT_EQ(Join(hub, "a1", L("dc", "A", "h1")), t);
    EXPECT_EQ(Join(hub, "b1", L("dc", "B", "h2")), W("a1"));
    ASSERT_TRUE(hub.AddHolder(c, "m", Version(1), 1, m_, 0, false).ok());
    // a2 may not read from a1: it enters rack A again, from C's copy.
    EXPECT_EQ(Join(hub, "a2", L("dc", "A", "h3"), {W("a1")}), c);
    EXPECT_EQ(Join(hub, "a3", L("dc", "A", "h4")), W("a2"));
    // a4 may not read from a3; a1 and a2 are busy, a1's reader b1 sits in
    // a line before a4's, so it cannot be moved onto a4. Rack A's uplink
    // carries 2 streams in; its budget is 4 workers / ratio.
    const WorkerId got = Join(hub, "a4", L("dc", "A", "h5"), {W("a3")});
    if (ratio_a == 4.0) {
      EXPECT_EQ(got, W("a2"));  // budget 1: shares, the latest placed first
    } else {
      EXPECT_EQ(got, W("b1"));  // budget 3: crosses to b1, idle in rack B
    }
  }
}

TEST_F(RackAwareTest, ConfigIsChecked) {
  HubConfig c = RackConfig();
  EXPECT_TRUE(ValidateRackConfig(c).ok());
  c.rack_oversubscription = -1;
  EXPECT_EQ(ValidateRackConfig(c).code(), StatusCode::kInvalidArgument);
  c = RackConfig();
  c.rack_oversubscription = std::nan("");
  EXPECT_EQ(ValidateRackConfig(c).code(), StatusCode::kInvalidArgument);
  c = RackConfig();
  c.rack_oversubscription_by_rack[{"", "r1"}] = 2;
  EXPECT_EQ(ValidateRackConfig(c).code(), StatusCode::kInvalidArgument);
  c = RackConfig();
  c.recheck_ms = 0;
  EXPECT_EQ(ValidateRackConfig(c).code(), StatusCode::kInvalidArgument);
  c = RackConfig();
  c.max_recheck_ms = 1;
  EXPECT_EQ(ValidateRackConfig(c).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(RackOversubscribed(RackConfig(), "a", "r1"));
  EXPECT_FALSE(RackOversubscribed(RackConfig(), "a", ""));
  EXPECT_FALSE(RackOversubscribed(RackConfig(1), "a", "r1"));
}

TEST_F(HubStateTest, ScheduleCrossesTheWideAreaOncePerDatacenter) {
  WorkerId t = Register("t", L("a", "r1", "h1"));
  auto g = Group("m", 1, 7);
  Manifest m = ManifestOf(g);
  ASSERT_EQ(*Pub(t, "m", 1, g, 0), VersionState::kCommitted);
  // Three readers in datacenter b join one after the other.
  std::vector<WorkerId> b;
  int wan = 0;
  for (int i = 0; i < 3; ++i) {
    b.push_back(Register("b" + std::to_string(i),
                         L("b", "r2", "h" + std::to_string(10 + i))));
    ASSERT_TRUE(hub_.AddHolder(b.back(), "m", Version(1), 1, m, 0, true).ok());
    auto s = hub_.Schedule(b.back(), "m", Version(1), {}, 4);
    ASSERT_TRUE(s.ok());
    for (const HolderView& h : *s) wan += h.labels.datacenter != "b";
  }
  EXPECT_EQ(wan, 1);  // only the first reader in b reads across
}

TEST_F(HubStateTest, ScheduleOfUncommittedOrUnknownVersionFailsLikeResolve) {
  WorkerId t = Register("t");
  auto g = Group("m", 2, 8);
  ASSERT_EQ(*Pub(t, "m", 1, g, 0), VersionState::kPending);
  WorkerId r = Register("r");
  EXPECT_EQ(hub_.Schedule(r, "m", Version(1), {}, 4).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(hub_.Schedule(r, "m", Version(9), {}, 4).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(hub_.Schedule(r, "m", Version::Latest(), {}, 4).status().code(),
            StatusCode::kInvalidArgument);
}

// A report by digest: accepted when it names the committed manifest; a
// hub without a committed manifest to compare with asks for the manifest
// (false) and changes nothing; a wrong digest is refused like a wrong
// manifest.
TEST_F(HubStateTest, AddHolderByDigest) {
  WorkerId t = Register("t");
  WorkerId r = Register("r");
  auto g = Group("m", 1, 9);
  const Manifest m = ManifestOf(g);
  EXPECT_EQ(hub_.AddHolderByDigest(WorkerId("w7-99"), "m", Version(1), 1,
                                   m.Digest(), 0)
                .status()
                .code(),
            StatusCode::kNotFound);
  // Unknown version (a restarted hub): asks for the manifest.
  Result<bool> unknown =
      hub_.AddHolderByDigest(r, "m", Version(1), 1, m.Digest(), 0);
  ASSERT_TRUE(unknown.ok()) << unknown.status().ToString();
  EXPECT_FALSE(*unknown);
  EXPECT_TRUE(hub_.List().empty());
  ASSERT_EQ(*Pub(t, "m", 1, g, 0), VersionState::kCommitted);
  ManifestDigest wrong = m.Digest();
  wrong.value ^= 1;
  EXPECT_EQ(
      hub_.AddHolderByDigest(r, "m", Version(1), 1, wrong, 0).status().code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(hub_.List()[0].versions[0].holders, 1u);
  Result<bool> ok =
      hub_.AddHolderByDigest(r, "m", Version(1), 5, m.Digest(), 0, true);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE(*ok);
  EXPECT_EQ(hub_.List()[0].versions[0].holders, 2u);
  // The filling copy is no copy yet; the complete one is.
  ASSERT_TRUE(hub_.Unpublish(t, "m", Version(1), 0).ok());
  EXPECT_EQ(ResolveCode("m", 1), StatusCode::kUnavailable);
  ASSERT_TRUE(
      hub_.AddHolderByDigest(r, "m", Version(1), 5, m.Digest(), 0).ok());
  EXPECT_EQ(ResolveCode("m", 1), StatusCode::kOk);
  // Pending here (rank re-reported after a restart): asks for the manifest.
  auto g2 = Group("p", 2, 10);
  ASSERT_EQ(*Pub(t, "p", 1, g2, 0), VersionState::kPending);
  Result<bool> pending =
      hub_.AddHolderByDigest(r, "p", Version(1), 1, ManifestOf(g2).Digest(), 0);
  ASSERT_TRUE(pending.ok());
  EXPECT_FALSE(*pending);
  ASSERT_TRUE(hub_.Unpublish(t, "p", Version(1), 0).ok());  // aborts it
  EXPECT_EQ(
      hub_.AddHolderByDigest(r, "p", Version(1), 1, ManifestOf(g2).Digest(), 0)
          .status()
          .code(),
      StatusCode::kAborted);
}

// With more holders than the bound, Resolve lists the nearest
// kMaxResolveHolders, still nearest first, and counts them all.
TEST_F(HubStateTest, ResolveListsTheNearestHoldersUpToTheBound) {
  WorkerId reader = Register("reader", L("dc1", "r1", "h1"));
  auto g = Group("m", 1, 11);
  const Manifest m = ManifestOf(g);
  WorkerId t = Register("t", L("dc2", "r9", "h9"));
  ASSERT_EQ(*Pub(t, "m", 1, g, 0), VersionState::kCommitted);
  const size_t far = 2 * kMaxResolveHolders, near = 3;
  for (size_t i = 0; i < far; ++i) {
    WorkerId w = Register("far" + std::to_string(i),
                          L("dc2", "r2", "h" + std::to_string(i)));
    ASSERT_TRUE(hub_.AddHolder(w, "m", Version(1), 1, m, 0).ok());
  }
  std::set<std::string> nearest;
  for (size_t i = 0; i < near; ++i) {
    WorkerId w = Register("near" + std::to_string(i), L("dc1", "r1", "h1"));
    ASSERT_TRUE(hub_.AddHolder(w, "m", Version(1), 1, m, 0, i % 2 == 1).ok());
    nearest.insert(w.value());
  }
  Result<Resolution> r = hub_.Resolve(reader, "m", Version(1), false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->num_holders, far + near + 1);
  ASSERT_EQ(r->holders.size(), kMaxResolveHolders);
  std::vector<std::string> ids = Ids(*r);
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.begin() + near), nearest);
  for (size_t i = near; i < ids.size(); ++i) {
    EXPECT_EQ(r->holders[i].labels.datacenter, "dc2") << i;
  }
}

// ------------------------------------------------- index vs reference scan

// The scheduler as it was before the index: every call scans every holder.
// Pure logic over its own copy of the bookkeeping (who holds what, who joined
// when, who serves how many readers), replayed from the same calls the test
// makes on the hub. Ties the old scan left unspecified (equal keys among the
// extra stripes, trainer ranks that all joined at 0) go by worker id.
class ReferenceScheduler {
 public:
  struct Ref {
    std::optional<uint32_t> rank;
    bool filling = false;
    uint64_t join_seq = 0;
  };

  // Rank r holds chunks [base[r], base[r + 1]).
  explicit ReferenceScheduler(std::vector<uint64_t> base)
      : base_(std::move(base)) {}
  void SetLabels(const WorkerId& w, Labels l) { labels_[w] = std::move(l); }
  void Publish(const WorkerId& w, uint32_t rank) {
    refs_[w] = Ref{rank, false, 0};
  }
  // Mirrors AddHolder on success.
  void AddHolder(const WorkerId& w, bool filling) {
    Ref& r = refs_[w];
    r.rank.reset();
    if (r.join_seq == 0) r.join_seq = next_join_++;
    r.filling = filling;
    if (!filling) Release(w);
  }
  bool HoldsRank(const WorkerId& w) const {
    auto it = refs_.find(w);
    return it != refs_.end() && it->second.rank.has_value();
  }
  void Drop(const WorkerId& w) {
    refs_.erase(w);
    slices_.erase(w);
    Release(w);
    serving_.erase(w);
  }
  void Release(const WorkerId& reader) {
    auto it = assignments_.find(reader);
    if (it == assignments_.end()) return;
    for (const WorkerId& src : it->second) {
      auto s = serving_.find(src);
      if (s != serving_.end() && --s->second <= 0) serving_.erase(s);
    }
    assignments_.erase(it);
    joins_.erase(reader);
  }
  // Holders of slices: each part's tensors (1-dimensional, by name and
  // length), and the ranges [begin, end) of them each holder holds.
  using Ranges =
      std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>>;
  void SetTensors(
      std::vector<std::vector<std::pair<std::string, uint64_t>>> t) {
    tensors_ = std::move(t);
  }
  void AddSlices(const WorkerId& w, Ranges ranges) {
    slices_[w] = std::move(ranges);
  }
  bool HoldsSlices(const WorkerId& w) const { return slices_.count(w) > 0; }
  void DropSlices(const WorkerId& w) { slices_.erase(w); }
  // Whether the ranges of `holders` (all of them: nullptr) cover every
  // tensor of `part` (ranges of thirds: nothing for the cut bound to cut).
  bool PartInSlices(size_t part,
                    const std::set<WorkerId>* holders = nullptr) const {
    for (const auto& [name, length] : tensors_[part]) {
      std::vector<std::pair<uint64_t, uint64_t>> all;
      for (const auto& [w, ranges] : slices_) {
        if (holders != nullptr && holders->count(w) == 0) continue;
        auto it = ranges.find(name);
        if (it != ranges.end()) {
          all.insert(all.end(), it->second.begin(), it->second.end());
        }
      }
      std::sort(all.begin(), all.end());
      uint64_t covered = 0;
      for (const auto& [b, e] : all) {
        if (b > covered) break;
        covered = std::max(covered, e);
      }
      if (covered < length) return false;
    }
    return true;
  }
  // Every chunk held by a complete holder: a full one, or the trainer ranks'
  // parts (rank r holds chunks [base[r], base[r + 1])); or, for a part
  // no rank holds, every byte of it by holders of slices.
  bool Readable(const std::vector<uint64_t>& base) const {
    std::vector<uint64_t> covered_by_rank(base.size() - 1, 0);
    std::vector<bool> have(base.size() - 1, false);
    for (const auto& [w, r] : refs_) {
      if (r.filling) continue;
      if (!r.rank.has_value()) return true;
      have[*r.rank] = true;
    }
    for (size_t r = 0; r + 1 < base.size(); ++r) {
      if (base[r] == base[r + 1] || have[r]) continue;
      if (tensors_.empty() || !PartInSlices(r)) return false;
    }
    return true;
  }

  static int Distance(const Labels& a, const Labels& b) {
    if (a.datacenter != b.datacenter) return 3;
    if (!a.host.empty() && a.host == b.host) return 0;
    if (!a.rack.empty() && a.rack == b.rack) return 1;
    return 2;
  }

  // The old scan; nullopt when no holder is left to read from.
  std::optional<std::vector<WorkerId>> Schedule(
      const WorkerId& reader, const std::set<WorkerId>& exclude,
      size_t max_sources) {
    Release(reader);
    Labels rl;
    if (auto it = labels_.find(reader); it != labels_.end()) rl = it->second;
    uint64_t reader_join = UINT64_MAX;
    if (auto own = refs_.find(reader);
        own != refs_.end() && own->second.filling) {
      reader_join = own->second.join_seq;
    }
    // Idle holders in the reader's datacenter first (nearest first), then
    // the rest nearest first.
    struct Candidate {
      int distance;
      int serving;
      uint64_t join_seq;
      WorkerId worker;
      bool filling;
      bool idle_near() const { return distance <= 2 && serving == 0; }
      bool operator<(const Candidate& o) const {
        if (idle_near() != o.idle_near()) return idle_near();
        if (distance != o.distance) return distance < o.distance;
        if (serving != o.serving) return serving < o.serving;
        if (join_seq != o.join_seq) return join_seq > o.join_seq;
        return worker < o.worker;
      }
    };
    std::vector<Candidate> cands;
    for (const auto& [w, r] : refs_) {
      if (w == reader || exclude.count(w) > 0) continue;
      if (r.filling && r.join_seq >= reader_join) continue;
      auto s = serving_.find(w);
      cands.push_back({Distance(rl, labels_.at(w)),
                       s == serving_.end() ? 0 : s->second, r.join_seq, w,
                       r.filling});
    }
    if (cands.empty()) return std::nullopt;
    std::sort(cands.begin(), cands.end());
    const Candidate best = cands[0];
    std::vector<WorkerId> out = {best.worker};
    for (size_t i = 1;
         i < cands.size() && out.size() < std::max<size_t>(max_sources, 1);
         ++i) {
      const Candidate& c = cands[i];
      if (c.distance == best.distance && c.serving == 0 && !c.filling)
        out.push_back(c.worker);
    }
    // Coverage: each part (in rank order) that no source holds yet gets the
    // first candidate in the same order that holds it; a holder of
    // everything covers the rest.
    auto full = [&](const WorkerId& w) {
      return !refs_.at(w).rank.has_value();
    };
    if (std::none_of(out.begin(), out.end(), full)) {
      std::set<uint32_t> have;
      for (const WorkerId& w : out) have.insert(*refs_.at(w).rank);
      for (uint32_t part = 0; part + 1 < base_.size(); ++part) {
        if (have.count(part) > 0 || base_[part] == base_[part + 1]) continue;
        auto c =
            std::find_if(cands.begin(), cands.end(), [&](const Candidate& k) {
              return full(k.worker) || refs_.at(k.worker).rank == part;
            });
        if (c == cands.end()) continue;
        out.push_back(c->worker);
        if (full(c->worker)) break;
      }
    }
    for (const WorkerId& w : out) {
      assignments_[reader].push_back(w);
      joins_[reader].push_back(refs_.at(w).join_seq);
      ++serving_[w];
    }
    return out;
  }

  void Leave(const WorkerId& w) { Drop(w); }
  // A recheck on a full-bisection hub: the sources as they are, or anew
  // when one left; never a time to recheck.
  std::optional<std::vector<WorkerId>> Recheck(const WorkerId& reader,
                                               size_t max_sources) {
    auto it = assignments_.find(reader);
    bool intact = it != assignments_.end();
    for (size_t i = 0; intact && i < it->second.size(); ++i) {
      auto r = refs_.find(it->second[i]);
      intact = r != refs_.end() && r->second.join_seq == joins_[reader][i];
    }
    if (!intact) return Schedule(reader, {}, max_sources);
    return it->second;
  }
  int64_t RecheckAfterMs(const WorkerId&) const { return 0; }

  const std::map<WorkerId, Ref>& refs() const { return refs_; }
  const Labels& LabelsOf(const WorkerId& w) const { return labels_.at(w); }

 private:
  std::vector<uint64_t> base_;
  std::map<WorkerId, Labels> labels_;
  std::map<WorkerId, Ref> refs_;
  std::map<WorkerId, std::vector<WorkerId>> assignments_;
  // The sources' references when assigned (their join_seq), per reader.
  std::map<WorkerId, std::vector<uint64_t>> joins_;
  std::map<WorkerId, int> serving_;
  uint64_t next_join_ = 1;
  std::vector<std::vector<std::pair<std::string, uint64_t>>> tensors_;
  std::map<WorkerId, Ranges> slices_;
};

// The rack-aware scheduler (RackPlanner) as brute force: every call scans
// every holder and keeps its bookkeeping in plain maps, replayed from the
// same calls the test makes on the hub. Written from the rule in
// hub_state.h (Schedule, Recheck), not from the index: which holder is idle
// at which distance, the rack's exits, the placements, the uplink budget.
class RackReference {
 public:
  using RackKey = std::pair<std::string, std::string>;
  struct Ref {
    std::optional<uint32_t> rank;
    bool filling = false;
    uint64_t join_seq = 0;
    uint64_t placement = 0;
  };
  static constexpr uint64_t kUnplaced = UINT64_MAX - 1;

  RackReference(std::vector<uint64_t> base, HubConfig config)
      : base_(std::move(base)), config_(std::move(config)) {}

  void SetLabels(const WorkerId& w, Labels l) {
    if (auto it = labels_.find(w); it != labels_.end()) Count(it->second, -1);
    Count(l, +1);
    labels_[w] = std::move(l);
  }
  void Leave(const WorkerId& w) {
    Drop(w);
    Count(labels_.at(w), -1);
    labels_.erase(w);
  }
  void Publish(const WorkerId& w, uint32_t rank) {
    refs_[w] = Ref{rank, false, 0, 0};
  }
  void AddHolder(const WorkerId& w, bool filling) {
    auto it = refs_.find(w);
    const bool was_complete = it != refs_.end() && !it->second.filling;
    Ref& r = refs_[w];
    r.rank.reset();
    if (r.join_seq == 0) r.join_seq = next_join_++;
    const bool refill = was_complete && filling;
    if (refill) r.placement = 1;
    r.filling = filling;
    if (!filling || refill) Release(w);
  }
  bool HoldsRank(const WorkerId& w) const {
    auto it = refs_.find(w);
    return it != refs_.end() && it->second.rank.has_value();
  }
  void Drop(const WorkerId& w) {
    refs_.erase(w);
    Release(w);
    serving_.erase(w);
  }
  void Release(const WorkerId& reader) {
    auto it = assignments_.find(reader);
    if (it == assignments_.end()) return;
    for (const Edge& e : it->second.edges) {
      auto s = serving_.find(e.source);
      if (s != serving_.end() && --s->second <= 0) serving_.erase(s);
      if (e.out_of.has_value()) {
        --use_[*e.out_of].out;
        exits_[*e.out_of].erase({e.source, reader});
      }
      if (e.into.has_value()) --use_[*e.into].in;
    }
    assignments_.erase(it);
  }
  bool Readable(const std::vector<uint64_t>& base) const {
    std::vector<bool> have(base.size() - 1, false);
    for (const auto& [w, r] : refs_) {
      if (r.filling) continue;
      if (!r.rank.has_value()) return true;
      have[*r.rank] = true;
    }
    uint64_t covered = 0;
    for (size_t r = 0; r + 1 < base.size(); ++r) {
      if (!have[r]) continue;
      if (base[r] > covered) break;
      covered = std::max(covered, base[r + 1]);
    }
    return covered >= base.back();
  }

  std::optional<std::vector<WorkerId>> Schedule(
      const WorkerId& reader, const std::set<WorkerId>& exclude,
      size_t max_sources) {
    Release(reader);
    std::vector<WorkerId> chosen = Choose(reader, exclude, max_sources);
    if (chosen.empty()) return std::nullopt;
    Assignment& a = assignments_[reader];
    const std::optional<RackKey> into = RackOf(reader);
    for (const WorkerId& w : chosen) {
      Edge e{w, refs_.at(w).join_seq, std::nullopt, std::nullopt};
      const std::optional<RackKey> out_of = RackOf(w);
      if (out_of != into && (out_of.has_value() || into.has_value())) {
        e.out_of = out_of;
        e.into = into;
        if (out_of.has_value()) ++use_[*out_of].out;
        if (into.has_value()) ++use_[*into].in;
        if (out_of.has_value() && Oversubscribed(*out_of)) {
          exits_[*out_of].insert({w, reader});
          a.recheck_ms = config_.recheck_ms;
        }
      }
      a.edges.push_back(e);
      ++serving_[w];
    }
    return chosen;
  }

  std::optional<std::vector<WorkerId>> Recheck(const WorkerId& reader,
                                               size_t max_sources) {
    auto it = assignments_.find(reader);
    bool intact = it != assignments_.end();
    if (intact) {
      for (const Edge& e : it->second.edges) intact = intact && Current(e);
    }
    if (!intact) return Schedule(reader, {}, max_sources);
    Assignment& a = it->second;
    if (a.recheck_ms > 0) {
      a.recheck_ms = a.moved
                         ? config_.recheck_ms
                         : std::min(2 * a.recheck_ms, config_.max_recheck_ms);
      a.moved = false;
    }
    std::vector<WorkerId> out;
    for (const Edge& e : a.edges) out.push_back(e.source);
    return out;
  }
  int64_t RecheckAfterMs(const WorkerId& reader) const {
    auto it = assignments_.find(reader);
    return it == assignments_.end() ? 0 : it->second.recheck_ms;
  }
  // No filling holder waits, through filling holders it reads from, on
  // itself (a complete source has every chunk and ends the wait). A depth
  // first search over the books.
  bool Acyclic() const {
    std::map<WorkerId, int> state;  // 1 on the path, 2 done
    std::function<bool(const WorkerId&)> visit = [&](const WorkerId& w) {
      int& st = state[w];
      if (st == 1) return false;
      if (st == 2) return true;
      st = 1;
      auto a = assignments_.find(w);
      if (a != assignments_.end()) {
        for (const Edge& e : a->second.edges) {
          if (!Current(e) || !refs_.at(e.source).filling) continue;
          if (!visit(e.source)) return false;
        }
      }
      state[w] = 2;
      return true;
    };
    for (const auto& [w, r] : refs_) {
      if (r.filling && !visit(w)) return false;
    }
    return true;
  }

  const std::map<WorkerId, Ref>& refs() const { return refs_; }
  const Labels& LabelsOf(const WorkerId& w) const { return labels_.at(w); }

 private:
  struct Edge {
    WorkerId source;
    uint64_t source_join;  // the source's reference then
    std::optional<RackKey> out_of, into;
  };
  bool Current(const Edge& e) const {
    auto r = refs_.find(e.source);
    return r != refs_.end() && r->second.join_seq == e.source_join;
  }
  struct Assignment {
    std::vector<Edge> edges;
    int64_t recheck_ms = 0;
    bool moved = false;
  };
  struct Use {
    int64_t workers = 0, in = 0, out = 0;
  };
  // A candidate as a Picker sees it.
  struct Cand {
    WorkerId w;
    int distance;
    bool filling;
    int serving;
    uint64_t key;
    // HolderKey's order.
    bool Before(const Cand& o) const {
      if (serving != o.serving) return serving < o.serving;
      if (key != o.key) return key > o.key;
      return w < o.w;
    }
  };

  void Count(const Labels& l, int d) {
    if (!l.rack.empty()) use_[{l.datacenter, l.rack}].workers += d;
  }
  std::optional<RackKey> RackOf(const WorkerId& w) const {
    auto it = labels_.find(w);
    if (it == labels_.end() || it->second.rack.empty()) return std::nullopt;
    return RackKey{it->second.datacenter, it->second.rack};
  }
  Labels LabelsOrNone(const WorkerId& w) const {
    auto it = labels_.find(w);
    return it == labels_.end() ? Labels{} : it->second;
  }
  double Ratio(const RackKey& r) const {
    auto it = config_.rack_oversubscription_by_rack.find(r);
    return it != config_.rack_oversubscription_by_rack.end()
               ? it->second
               : config_.rack_oversubscription;
  }
  bool Oversubscribed(const RackKey& r) const { return Ratio(r) > 1; }
  int64_t Cap(const RackKey& r) const {
    if (Ratio(r) <= 1) return INT64_MAX;
    auto it = use_.find(r);
    const int64_t workers = it == use_.end() ? 0 : it->second.workers;
    return std::max<int64_t>(
        1, static_cast<int64_t>(static_cast<double>(workers) / Ratio(r)));
  }
  static int Distance(const Labels& a, const Labels& b) {
    if (a.datacenter != b.datacenter) return 3;
    if (!a.host.empty() && a.host == b.host) return 0;
    if (!a.rack.empty() && a.rack == b.rack) return 1;
    return 2;
  }
  // Whether `h` is in the index group a Picker searches at distance d.
  static bool InGroup(const Labels& reader, const Labels& h, int d) {
    switch (d) {
      case 0:
        return !reader.host.empty() && reader.datacenter == h.datacenter &&
               reader.host == h.host;
      case 1:
        return !reader.rack.empty() && reader.datacenter == h.datacenter &&
               reader.rack == h.rack;
      case 2:
        return reader.datacenter == h.datacenter;
      default:
        return true;
    }
  }
  uint64_t KeyOf(const Ref& r) const {
    if (!r.filling) return r.join_seq;
    return r.placement > 0 ? r.placement : kUnplaced;
  }
  int Serving(const WorkerId& w) const {
    auto it = serving_.find(w);
    return it == serving_.end() ? 0 : it->second;
  }
  // Every usable holder: not the reader, not excluded, and a filling one
  // only if filed before `order`.
  std::vector<Cand> Usable(const WorkerId& reader,
                           const std::set<WorkerId>& exclude,
                           uint64_t order) const {
    const Labels rl = LabelsOrNone(reader);
    std::vector<Cand> out;
    for (const auto& [w, r] : refs_) {
      if (w == reader || exclude.count(w) > 0) continue;
      if (r.filling && KeyOf(r) >= order) continue;
      out.push_back(
          {w, Distance(rl, LabelsOrNone(w)), r.filling, Serving(w), KeyOf(r)});
    }
    return out;
  }
  // The first idle holder of group `d` (complete before filling), as
  // Picker::Idle.
  std::optional<Cand> Idle(const std::vector<Cand>& cands, const Labels& rl,
                           int d) const {
    std::optional<Cand> best_c, best_f, first_c, first_f;
    for (const Cand& c : cands) {
      if (!InGroup(rl, LabelsOrNone(c.w), d)) continue;
      std::optional<Cand>& first = c.filling ? first_f : first_c;
      if (!first.has_value() || c.Before(*first)) first = c;
    }
    if (first_c.has_value() && first_c->serving == 0) return first_c;
    if (first_f.has_value() && first_f->serving == 0) return first_f;
    return std::nullopt;
  }
  bool AnyIn(const std::vector<Cand>& cands, const Labels& rl, int d) const {
    for (const Cand& c : cands) {
      if (InGroup(rl, LabelsOrNone(c.w), d)) return true;
    }
    return false;
  }
  // All usable candidates in a Picker's Rank order.
  static std::vector<Cand> Ranked(std::vector<Cand> cands, bool nearest_first) {
    auto later = [&](const Cand& c) {
      return nearest_first || c.serving > 0 || c.distance > 2;
    };
    std::sort(cands.begin(), cands.end(), [&](const Cand& a, const Cand& b) {
      if (later(a) != later(b)) return !later(a);
      if (a.distance != b.distance) return a.distance < b.distance;
      return a.Before(b);
    });
    return cands;
  }
  // Picker::WithStripes + CoverMissingParts for a first pick found in
  // group `d`.
  std::vector<WorkerId> Finish(const WorkerId& reader,
                               const std::vector<Cand>& cands,
                               const Cand& first, int d, size_t max_sources,
                               bool nearest_first) const {
    const Labels rl = LabelsOrNone(reader);
    std::vector<WorkerId> out = {first.w};
    // Complete holders of the group (usable or not) in HolderKey order,
    // while idle.
    std::vector<Cand> group;
    for (const auto& [w, r] : refs_) {
      if (r.filling || !InGroup(rl, LabelsOrNone(w), d)) continue;
      group.push_back({w, 0, false, Serving(w), KeyOf(r)});
    }
    std::sort(group.begin(), group.end(),
              [](const Cand& a, const Cand& b) { return a.Before(b); });
    std::set<WorkerId> usable;
    for (const Cand& c : cands) usable.insert(c.w);
    for (const Cand& c : group) {
      if (c.serving != 0 || out.size() >= std::max<size_t>(max_sources, 1))
        break;
      if (c.w != first.w && usable.count(c.w) > 0) out.push_back(c.w);
    }
    Cover(cands, nearest_first, &out);
    return out;
  }
  void Cover(const std::vector<Cand>& cands, bool nearest_first,
             std::vector<WorkerId>* out) const {
    auto full = [&](const WorkerId& w) {
      return !refs_.at(w).rank.has_value();
    };
    if (std::any_of(out->begin(), out->end(), full)) return;
    std::set<uint32_t> have;
    for (const WorkerId& w : *out) have.insert(*refs_.at(w).rank);
    const std::vector<Cand> ranked = Ranked(cands, nearest_first);
    for (uint32_t part = 0; part + 1 < base_.size(); ++part) {
      if (have.count(part) > 0 || base_[part] == base_[part + 1]) continue;
      auto c = std::find_if(ranked.begin(), ranked.end(), [&](const Cand& k) {
        return full(k.w) || refs_.at(k.w).rank == part;
      });
      if (c == ranked.end()) continue;
      out->push_back(c->w);
      if (full(c->w)) break;
    }
  }

  uint64_t NewLine() const { return (next_line_ << 32) | 1; }
  uint64_t Follower(const RackKey& r) const {
    auto it = lines_.find(r);
    if (it == lines_.end() || it->second.second >= (1ull << 32))
      return NewLine();
    return (it->second.first << 32) | it->second.second;
  }
  void Place(const WorkerId& w, uint64_t placement) {
    auto it = refs_.find(w);
    if (it == refs_.end() || placement == 0) return;
    Ref& r = it->second;
    if (!r.filling || r.placement > 0) return;
    const uint64_t line = placement >> 32;
    const std::optional<RackKey> rack = RackOf(w);
    if (line == next_line_) {
      ++next_line_;
      if (rack.has_value()) lines_[*rack] = {line, 2};
    } else {
      ++lines_.at(*rack).second;
    }
    r.placement = placement;
  }
  void Move(const WorkerId& x, const WorkerId& from, const WorkerId& to) {
    Assignment& a = assignments_.at(x);
    for (Edge& e : a.edges) {
      if (e.source != from) continue;
      auto s = serving_.find(from);
      if (s != serving_.end() && --s->second <= 0) serving_.erase(s);
      ++serving_[to];
      exits_[*e.out_of].erase({from, x});
      --use_[*e.out_of].out;
      e.out_of = RackOf(to);
      ++use_[*e.out_of].out;
      exits_[*e.out_of].insert({to, x});
      e.source = to;
      e.source_join = refs_.at(to).join_seq;
      a.moved = true;
      return;
    }
  }

  std::vector<WorkerId> Choose(const WorkerId& reader,
                               const std::set<WorkerId>& exclude,
                               size_t max_sources) {
    const Labels rl = LabelsOrNone(reader);
    const std::optional<RackKey> rack = RackOf(reader);
    const Ref* own = nullptr;
    if (auto it = refs_.find(reader); it != refs_.end() && it->second.filling)
      own = &it->second;
    auto placement_for = [&](bool in_rack) -> uint64_t {
      if (own == nullptr) return 0;
      if (own->placement > 0) return own->placement;
      return in_rack && rack.has_value() ? Follower(*rack) : NewLine();
    };
    auto order_for = [](uint64_t p) { return p > 0 ? p : kUnplaced; };
    const uint64_t entry = placement_for(false);
    if (!rack.has_value() || !Oversubscribed(*rack)) {
      // The idle-first rule, as ReferenceScheduler.
      std::vector<Cand> cands = Usable(reader, exclude, order_for(entry));
      if (cands.empty()) return {};
      std::vector<Cand> ranked = Ranked(cands, false);
      const Cand best = ranked[0];
      std::vector<WorkerId> out = {best.w};
      for (size_t i = 1;
           i < ranked.size() && out.size() < std::max<size_t>(max_sources, 1);
           ++i) {
        const Cand& c = ranked[i];
        if (c.distance == best.distance && c.serving == 0 && !c.filling)
          out.push_back(c.w);
      }
      Cover(cands, false, &out);
      Place(reader, entry);
      return out;
    }
    const uint64_t follower = placement_for(true);
    const std::vector<Cand> in = Usable(reader, exclude, order_for(follower));
    bool rack_has_usable = false;
    for (int d : {0, 1}) {
      if (std::optional<Cand> p = Idle(in, rl, d)) {
        std::vector<WorkerId> out =
            Finish(reader, in, *p, d, max_sources, false);
        Place(reader, follower);
        return out;
      }
      rack_has_usable = rack_has_usable || AnyIn(in, rl, d);
    }
    if (rack_has_usable && own != nullptr) {
      std::set<std::pair<WorkerId, WorkerId>> exits = exits_[*rack];
      for (const auto& [h, x] : exits) {
        auto hr = refs_.find(h);
        auto a = assignments_.find(x);
        bool valid = hr != refs_.end() && RackOf(h) == rack &&
                     a != assignments_.end() && a->second.recheck_ms > 0;
        if (valid) {
          valid = false;
          for (const Edge& e : a->second.edges)
            valid = valid || (e.source == h && Current(e));
        }
        if (!valid) {
          exits_[*rack].erase({h, x});
          continue;
        }
        if (x == reader || h == reader || exclude.count(h) > 0 ||
            (hr->second.filling && KeyOf(hr->second) >= follower)) {
          continue;
        }
        auto xr = refs_.find(x);
        if (xr != refs_.end() && xr->second.filling &&
            xr->second.placement > 0 && xr->second.placement <= follower) {
          continue;
        }
        Move(x, h, reader);
        std::vector<WorkerId> out = {h};
        Cover(in, false, &out);
        Place(reader, follower);
        return out;
      }
    }
    const std::vector<Cand> out_cands =
        Usable(reader, exclude, order_for(entry));
    std::optional<Cand> cross = Idle(out_cands, rl, 2);
    int cross_d = 2;
    if (!cross.has_value() && !AnyIn(out_cands, rl, 2)) {
      cross = Idle(out_cands, rl, 3);
      cross_d = 3;
    }
    auto used = [&](const RackKey& r, bool in_dir) {
      auto it = use_.find(r);
      return it == use_.end() ? 0 : (in_dir ? it->second.in : it->second.out);
    };
    if (cross.has_value()) {
      const std::optional<RackKey> src = RackOf(cross->w);
      const bool allow = used(*rack, true) < Cap(*rack) &&
                         (!src.has_value() || used(*src, false) < Cap(*src));
      if (!rack_has_usable || allow) {
        std::vector<WorkerId> out =
            Finish(reader, out_cands, *cross, cross_d, max_sources, false);
        Place(reader, entry);
        return out;
      }
    }
    // Share: the nearest, least busy.
    if (in.empty()) return {};
    const Cand p = Ranked(in, true)[0];
    std::vector<WorkerId> out =
        Finish(reader, in, p, p.distance, max_sources, true);
    Place(reader, p.distance <= 1 ? follower : entry);
    return out;
  }

  std::vector<uint64_t> base_;
  HubConfig config_;
  std::map<WorkerId, Labels> labels_;
  std::map<WorkerId, Ref> refs_;
  std::map<WorkerId, Assignment> assignments_;
  std::map<WorkerId, int> serving_;
  std::map<RackKey, Use> use_;
  std::map<RackKey, std::set<std::pair<WorkerId, WorkerId>>> exits_;
  std::map<RackKey, std::pair<uint64_t, uint64_t>> lines_;
  uint64_t next_line_ = 1;
  uint64_t next_join_ = 1;
};

template <typename Reference>
void HubStateTest::RunDifferential(uint32_t seed, const HubConfig& config,
                                   const std::vector<PartLayout>& g,
                                   const Manifest& m,
                                   const std::vector<uint64_t>& base,
                                   Reference& ref) {
  const std::vector<std::string> dcs = {"a", "b"};
  const std::vector<std::string> racks = {"", "r1", "r2"};
  const std::vector<std::string> hosts = {"", "h1", "h2", "h3"};
  constexpr uint32_t kRanks = 4;
  HubState hub(config);
  std::mt19937 rng(seed);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  auto random_labels = [&] {
    return L(dcs[pick(dcs.size())], racks[pick(racks.size())],
             hosts[pick(hosts.size())]);
  };
  std::vector<WorkerId> ws;
  std::set<WorkerId> gone;                // left the hub; may re-join
  std::map<WorkerId, std::string> names;  // the name gives the address
  auto join = [&](const std::string& name, Labels l,
                  const WorkerId& id = WorkerId()) {
    WorkerId w = Register(hub, name, l, id);
    ref.SetLabels(w, std::move(l));
    names[w] = name;
    return w;
  };
  for (int i = 0; i < 40; ++i)
    ws.push_back(join("w" + std::to_string(i), random_labels()));
  for (uint32_t r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(hub.Publish(Args(ws[r], "m", 1, g, r), 0).ok());
    ref.Publish(ws[r], r);
  }
  // Holders of slices are drawn on full-bisection hubs (the reference scan
  // knows them); the rack reference plans chunk holders only.
  constexpr bool kSlices = std::is_same_v<Reference, ReferenceScheduler>;
  std::vector<std::vector<std::pair<std::string, uint64_t>>> tensors;
  for (const PartLayout& p : g) {
    tensors.emplace_back();
    for (const TensorLayout& t : p.tensors) {
      tensors.back().emplace_back(t.spec.name, t.spec.shape[0]);
    }
  }
  if constexpr (kSlices) ref.SetTensors(tensors);
  for (int step = 0; step < 2500; ++step) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " step " +
                 std::to_string(step));
    const WorkerId w = ws[pick(ws.size())];
    const int op = static_cast<int>(pick(100));
    if (gone.count(w) > 0) {
      // Back under its old id and address, possibly somewhere else.
      join(names.at(w), random_labels(), w);
      gone.erase(w);
      continue;
    }
    if (op < 30) {  // joins or finishes a fetch
      bool filling = pick(3) != 0;
      Status s;
      if (pick(2) == 0) {
        s = hub.AddHolder(w, "m", Version(1), 1, m, 0, filling);
      } else {
        Result<bool> r = hub.AddHolderByDigest(w, "m", Version(1), 1,
                                               m.Digest(), 0, filling);
        s = r.status();
        if (r.ok()) {
          EXPECT_TRUE(*r);  // the hub has the committed manifest
        }
      }
      if (filling && ref.HoldsRank(w)) {
        EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
      } else {
        ASSERT_TRUE(s.ok()) << s.ToString();
        ref.AddHolder(w, filling);
      }
    } else if (op < 60) {  // schedules, sometimes excluding holders
      std::set<WorkerId> exclude;
      for (size_t k = pick(4); k > 0; --k) exclude.insert(ws[pick(ws.size())]);
      size_t max_sources = 1 + pick(4);
      auto got = hub.Schedule(w, "m", Version(1), exclude, max_sources);
      if (!ref.Readable(base)) {
        EXPECT_EQ(got.status().code(), StatusCode::kUnavailable);
        continue;
      }
      auto want = ref.Schedule(w, exclude, max_sources);
      if (!want.has_value()) {
        EXPECT_EQ(got.status().code(), StatusCode::kUnavailable);
        continue;
      }
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      std::vector<WorkerId> got_ids;
      for (const HolderView& h : *got) got_ids.push_back(h.worker);
      ASSERT_EQ(got_ids, *want);
      ASSERT_EQ(hub.RecheckAfterMs(w, "m", Version(1)), ref.RecheckAfterMs(w));
      // With nothing excluded, a reader that holds no part and serves
      // nothing yet may read every chunk from what it got.
      if (exclude.empty() && ref.refs().count(w) == 0) {
        EXPECT_EQ(Covered(*got),
                  (std::vector<ChunkRange>{{0, m.num_chunks()}}));
      }
    } else if (op < 70) {  // rechecks, as told or not
      size_t max_sources = 1 + pick(4);
      auto got = hub.Recheck(w, "m", Version(1), max_sources);
      if (!ref.Readable(base)) {
        EXPECT_EQ(got.status().code(), StatusCode::kUnavailable);
        continue;
      }
      auto want = ref.Recheck(w, max_sources);
      if (!want.has_value()) {
        EXPECT_EQ(got.status().code(), StatusCode::kUnavailable);
        continue;
      }
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      std::vector<WorkerId> got_ids;
      for (const HolderView& h : *got) got_ids.push_back(h.worker);
      ASSERT_EQ(got_ids, *want);
      ASSERT_EQ(hub.RecheckAfterMs(w, "m", Version(1)), ref.RecheckAfterMs(w));
    } else if (op < 82) {  // a fetch ends without a copy
      hub.FetchDone(w, "m", Version(1));
      ref.Release(w);
    } else if (op < 90) {  // stops serving
      Status s = hub.Unpublish(w, "m", Version(1), 0);
      bool holds_slices = false;
      if constexpr (kSlices) holds_slices = ref.HoldsSlices(w);
      EXPECT_EQ(s.ok(), ref.refs().count(w) > 0 || holds_slices)
          << s.ToString();
      // A holder of slices only: its fetch (if any) goes on.
      if constexpr (kSlices) {
        if (s.ok() && ref.refs().count(w) == 0) ref.DropSlices(w);
      }
      if (s.ok() && ref.refs().count(w) > 0) ref.Drop(w);
    } else if (op < 95) {  // leaves (or its lease ends)
      ASSERT_TRUE(hub.Leave(w).ok());
      ref.Leave(w);
      gone.insert(w);
    } else {  // moves: same process, new labels, keeps what it holds
      WorkerRegistration reg;
      reg.requested_id = w;
      reg.name = names.at(w);
      reg.data_address = "tcp://" + names.at(w) + ":9000";
      reg.labels = random_labels();
      ASSERT_TRUE(hub.RegisterWorker(reg, 0).ok());
      ref.SetLabels(w, reg.labels);
    }
    if constexpr (kSlices) {
      // Holders of slices come and go beside: ranges of thirds of random
      // tensors. They keep the version readable where ranks are gone, and a
      // reader of every tensor whole then gets holders that cover them.
      if (pick(4) == 0 && gone.count(w) == 0) {
        ReferenceScheduler::Ranges ranges;
        std::vector<Held> held;
        for (size_t part = 0; part < tensors.size(); ++part) {
          for (const auto& [name, length] : tensors[part]) {
            if (pick(3) == 0) continue;
            const std::vector<uint64_t> thirds = {0, length / 3, 2 * length / 3,
                                                  length};
            const size_t b = pick(3), e = b + 1 + pick(3 - b);
            if (thirds[b] == thirds[e]) continue;
            ranges[name].push_back({thirds[b], thirds[e]});
            held.push_back({name, length, thirds[b], thirds[e]});
          }
        }
        if (!held.empty()) {
          ASSERT_TRUE(
              hub.AddSliceHolder(w, "m", Version(1), 9, SliceLayout(held), 0)
                  .ok());
          ref.AddSlices(w, std::move(ranges));
        }
      }
      EXPECT_EQ(hub.StateOf("m", Version(1)) == VersionState::kCommitted,
                ref.Readable(base));
      if (ref.Readable(base)) {
        const WorkerId reader = ws[pick(ws.size())];
        std::vector<SliceWant> everything;
        for (const auto& part : tensors) {
          for (const auto& [name, length] : part) {
            everything.push_back({name, Box{{0}, {length}}});
          }
        }
        Result<std::vector<HolderView>> got = hub.ScheduleSlices(
            reader, "m", Version(1), {}, 1 + pick(4), everything);
        hub.FetchDone(reader, "m", Version(1));
        ref.Release(reader);
        if (!got.ok()) {
          // Only the reader itself holds what no other holder does.
          EXPECT_EQ(got.status().code(), StatusCode::kUnavailable);
          EXPECT_TRUE(ref.HoldsSlices(reader) || ref.refs().count(reader) > 0)
              << got.status().ToString();
          continue;
        }
        // Parts the chunk sources hold (complete ones; filling ones, which
        // may never finish), and the holders of slices offered.
        std::vector<bool> held(kRanks, false), filling(kRanks, false);
        std::set<WorkerId> slices;
        for (const HolderView& h : *got) {
          if (h.slice_holder) {
            slices.insert(h.worker);
            continue;
          }
          const ReferenceScheduler::Ref& r = ref.refs().at(h.worker);
          std::vector<bool>& into = r.filling ? filling : held;
          if (!r.rank.has_value()) into.assign(kRanks, true);
          if (r.rank.has_value()) into[*r.rank] = true;
        }
        if (ref.refs().count(reader) > 0 || ref.HoldsSlices(reader)) {
          continue;  // the reader is never offered to itself
        }
        for (uint32_t part = 0; part < kRanks; ++part) {
          if (held[part]) continue;
          // Where holders of slices can cover what no complete chunk source
          // holds, the ones offered do; and every part has a source.
          if (ref.PartInSlices(part)) {
            EXPECT_TRUE(ref.PartInSlices(part, &slices)) << "part " << part;
          } else {
            EXPECT_TRUE(filling[part]) << "part " << part;
          }
        }
      }
    }
    if constexpr (std::is_same_v<Reference, RackReference>) {
      ASSERT_TRUE(ref.Acyclic());
    }
    // Resolve lists every holder but the reader (fewer than the bound
    // here), nearest first.
    if (ref.Readable(base)) {
      const WorkerId reader = ws[pick(ws.size())];
      Result<Resolution> r = hub.Resolve(reader, "m", Version(1), false);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      std::set<WorkerId> want;
      for (const auto& [h, unused] : ref.refs()) {
        if (h != reader) want.insert(h);
      }
      std::set<WorkerId> listed;
      int last = 0;
      for (const HolderView& h : r->holders) {
        listed.insert(h.worker);
        int d = ReferenceScheduler::Distance(
            gone.count(reader) > 0 ? Labels{} : ref.LabelsOf(reader), h.labels);
        EXPECT_GE(d, last);
        last = d;
      }
      EXPECT_EQ(listed, want);
      EXPECT_EQ(r->num_holders, want.size());
    } else {
      EXPECT_EQ(hub.Resolve(w, "m", Version(1), false).status().code(),
                StatusCode::kUnavailable);
    }
  }
}

// Random joins, fills, schedules (with exclusions), completions, fetch ends,
// unpublishes, departures, re-joins, moves between racks and (rack-aware
// hubs) rechecks: after every step the hub's indexed Schedule must answer
// exactly what the reference scan does, and Resolve must list every holder
// nearest first. Seeded: a failure names its seed and step, and replays.
// Odd seeds: full bisection (ReferenceScheduler); even seeds: oversubscribed
// racks, some with their own figures (RackReference).
TEST_F(HubStateTest, IndexedScheduleMatchesAReferenceScan) {
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    HubConfig config = DefaultConfig();
    if (seed % 2 == 0) {
      config.rack_oversubscription = 4;
      if (seed % 4 == 0) {
        // r2 of datacenter a at full bisection, r1 of b at 2:1.
        config.rack_oversubscription_by_rack[{"a", "r2"}] = 1;
        config.rack_oversubscription_by_rack[{"b", "r1"}] = 2;
      }
    }
    constexpr uint32_t kRanks = 4;
    auto g =
        Group("m" + std::to_string(seed), kRanks, static_cast<uint8_t>(seed));
    const Manifest m = ManifestOf(g);
    std::vector<uint64_t> base;
    for (uint32_t r = 0; r <= kRanks; ++r) base.push_back(m.chunk_base(r));
    if (seed % 2 == 0) {
      RackReference ref(base, config);
      RunDifferential(seed, config, g, m, base, ref);
    } else {
      ReferenceScheduler ref(base);
      RunDifferential(seed, config, g, m, base, ref);
    }
  }
}

// ------------------------------------------------------------ durable facts

// The durable facts recorded by an HA leader (DurableChange), and a new
// leader started from them (Restore): version floors, pins and reader
// groups outlive the state machine that made them.
TEST_F(HubStateTest, NothingIsRecordedWithoutRecordDurable) {
  WorkerId a = Register("a");
  auto g = Group("m", 1);
  ASSERT_TRUE(Pub(a, "m", 3, g, 0).ok());
  ASSERT_TRUE(hub_.Retain("m", Version(3), true).ok());
  EXPECT_TRUE(hub_.TakeDurableChanges().empty());
}

TEST_F(HubStateTest, DurableChangesDescribeTheDurableFacts) {
  HubConfig c = DefaultConfig();
  c.record_durable = true;
  c.max_steps_per_group = 2;
  c.group_ttl_ms = 10000;
  HubState hub(c);
  WorkerId a = Register(hub, "a");
  auto g = Group("m", 1);
  DurableState applied;
  auto take = [&] {
    std::vector<DurableChange> changes = hub.TakeDurableChanges();
    for (const DurableChange& ch : changes) ApplyDurableChange(ch, applied);
    return changes;
  };
  ASSERT_TRUE(hub.Publish(Args(a, "m", 5, g, 0), 0).ok());
  std::vector<DurableChange> ch = take();
  ASSERT_EQ(ch.size(), 1u);
  EXPECT_EQ(ch[0].kind, DurableChange::Kind::kHighest);
  EXPECT_EQ(ch[0].version, Version(5));
  // A re-report of an older version raises nothing.
  WorkerId b = Register(hub, "b");
  ASSERT_TRUE(hub.Publish(Args(b, "m", 2, g, 0, /*rebuild=*/true), 0).ok());
  EXPECT_TRUE(take().empty());
  ASSERT_TRUE(hub.Retain("m", Version(5), true).ok());
  ASSERT_TRUE(hub.Retain("m", Version(5), true).ok());  // no second change
  ASSERT_TRUE(hub.Retain("m", Version(2), true).ok());
  ASSERT_TRUE(hub.Retain("m", Version(2), false).ok());
  EXPECT_EQ(take().size(), 3u);
  // Reader groups: a pin per new step; old steps and unused groups go.
  for (uint64_t step : {1, 2, 3}) {
    ASSERT_TRUE(hub.ResolveForGroup(WorkerId("r"), "m", "inst", step, 0).ok());
  }
  ch = take();
  ASSERT_EQ(ch.size(), 3u);
  EXPECT_EQ(ch.back().kind, DurableChange::Kind::kGroup);
  EXPECT_EQ(ch.back().record.steps.size(), 2u);
  EXPECT_EQ(ch.back().record.forgot_below, 2u);
  EXPECT_EQ(applied, hub.Durable());
  hub.ExpireGroups(20000);
  ch = take();
  ASSERT_EQ(ch.size(), 1u);
  EXPECT_EQ(ch[0].kind, DurableChange::Kind::kGroupGone);
  EXPECT_EQ(applied, hub.Durable());
  EXPECT_TRUE(applied.groups.empty());
  EXPECT_EQ(applied.pins.size(), 1u);
  EXPECT_EQ(applied.highest.at("m"), Version(5));
}

TEST_F(HubStateTest, ANewLeaderStartsFromTheDurableFacts) {
  DurableState d;
  d.highest["m"] = Version(7);
  d.pins.insert({"m", Version(6)});
  d.pins.insert({"m", Version(4)});
  d.groups[{"m", "inst"}] = GroupRecord{{{9, Version(6)}}, 5};
  HubConfig c = DefaultConfig();
  c.record_durable = true;
  HubState hub(c);
  hub.Restore(d, 0);
  EXPECT_TRUE(hub.TakeDurableChanges().empty());
  EXPECT_EQ(hub.Durable(), d);
  WorkerId a = Register(hub, "a");
  auto g = Group("m", 1);
  // Numbering never goes backwards, though no worker holds version 7.
  EXPECT_EQ(hub.Publish(Args(a, "m", 7, g, 0), 0).status().code(),
            StatusCode::kFailedPrecondition);
  // A re-reported version gets its pin back.
  ASSERT_TRUE(hub.Publish(Args(a, "m", 6, g, 0, /*rebuild=*/true), 0).ok());
  EXPECT_TRUE(hub.IsRetained("m", Version(6)));
  // A pin of a version nobody re-reported can be withdrawn (and is).
  EXPECT_TRUE(hub.Retain("m", Version(4), false).ok());
  std::vector<DurableChange> ch = hub.TakeDurableChanges();
  ASSERT_EQ(ch.size(), 1u);
  EXPECT_EQ(ch[0].kind, DurableChange::Kind::kUnpin);
  // The group's pin holds: step 9 gets version 6, not the newest (8).
  ASSERT_TRUE(hub.Publish(Args(a, "m", 8, g, 0), 0).ok());
  Result<Resolution> r = hub.ResolveForGroup(WorkerId("r"), "m", "inst", 9, 0);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->version, Version(6));
  EXPECT_EQ(
      hub.ResolveForGroup(WorkerId("r"), "m", "inst", 4, 0).status().code(),
      StatusCode::kFailedPrecondition);  // older than the steps it keeps
}

// ------------------------------------------------------------ top

ProgressReport Progress(const WorkerId& reader, uint64_t done, uint64_t total,
                        int64_t elapsed_ms,
                        std::vector<std::pair<WorkerId, uint64_t>> sources,
                        bool finished = false) {
  ProgressReport p;
  p.reader = reader;
  p.model = "m";
  p.version = Version(1);
  p.bytes_done = done;
  p.bytes_total = total;
  p.elapsed_ms = elapsed_ms;
  p.sources = std::move(sources);
  p.done = finished;
  return p;
}

TEST_F(HubStateTest, SnapshotListsVersionsHoldersAndTransfersInFlight) {
  WorkerId t = Register("trainer");
  auto g = Group("m", 1, 9);
  Manifest m = ManifestOf(g);
  ASSERT_EQ(*Pub(t, "m", 1, g, 0), VersionState::kCommitted);
  WorkerId r = Register("reader");
  ASSERT_TRUE(hub_.AddHolder(r, "m", Version(1), 1, m, 0, true).ok());
  ASSERT_TRUE(hub_.Schedule(r, "m", Version(1), {}, 4).ok());

  HubSnapshot s = hub_.Snapshot(SnapshotLimits{}, 0);
  EXPECT_EQ(s.workers, 2u);
  ASSERT_EQ(s.models.size(), 1u);
  ASSERT_EQ(s.models[0].versions.size(), 1u);
  const SnapshotVersion& v = s.models[0].versions[0];
  EXPECT_EQ(v.state, VersionState::kCommitted);
  EXPECT_EQ(v.total_bytes, m.total_bytes());
  EXPECT_EQ(v.holders_complete, 1u);
  EXPECT_EQ(v.holders_filling, 1u);
  ASSERT_EQ(v.holders.size(), 2u);
  EXPECT_EQ(v.holders[0].name, "trainer");  // complete ones first
  EXPECT_FALSE(v.holders[0].filling);
  EXPECT_EQ(v.holders[1].name, "reader");
  EXPECT_TRUE(v.holders[1].filling);

  // Before its first report: in flight, sources known, progress not.
  ASSERT_EQ(s.transfers_total, 1u);
  ASSERT_EQ(s.transfers.size(), 1u);
  EXPECT_EQ(s.transfers[0].reader_name, "reader");
  EXPECT_FALSE(s.transfers[0].reported);
  EXPECT_EQ(s.transfers[0].bytes_total, m.total_bytes());
  ASSERT_EQ(s.transfers[0].sources.size(), 1u);
  EXPECT_EQ(s.transfers[0].sources[0].name, "trainer");

  ASSERT_TRUE(hub_.ReportProgress(
                      Progress(r, 3000, m.total_bytes(), 1500, {{t, 3000}}), 10)
                  .ok());
  s = hub_.Snapshot(SnapshotLimits{}, 10);
  ASSERT_EQ(s.transfers.size(), 1u);
  const SnapshotTransfer& x = s.transfers[0];
  EXPECT_TRUE(x.reported);
  EXPECT_EQ(x.bytes_done, 3000u);
  EXPECT_EQ(x.elapsed_ms, 1500);
  EXPECT_DOUBLE_EQ(x.bytes_per_second, 2000.0);
  ASSERT_EQ(x.sources.size(), 1u);
  EXPECT_EQ(x.sources[0].bytes, 3000u);
  EXPECT_DOUBLE_EQ(x.sources[0].bytes_per_second, 2000.0);
  EXPECT_TRUE(s.slowest.empty());

  // A full AddHolder ends the fetch: its progress goes with it.
  ASSERT_TRUE(hub_.AddHolder(r, "m", Version(1), 1, m, 20, false).ok());
  s = hub_.Snapshot(SnapshotLimits{}, 20);
  EXPECT_EQ(s.transfers_total, 0u);
  EXPECT_TRUE(s.transfers.empty());
  EXPECT_EQ(s.models[0].versions[0].holders_complete, 2u);
}

TEST_F(HubStateTest, ProgressOfAFetchNotInFlightIsIgnoredAndEndsWithIt) {
  WorkerId t = Register("trainer");
  auto g = Group("m", 1, 9);
  Manifest m = ManifestOf(g);
  ASSERT_EQ(*Pub(t, "m", 1, g, 0), VersionState::kCommitted);
  WorkerId r = Register("reader");
  // Unknown reader: NOT_FOUND (it registers again, as for any call).
  EXPECT_EQ(
      hub_.ReportProgress(Progress(WorkerId("w-x"), 1, 2, 3, {}), 0).code(),
      StatusCode::kNotFound);
  // Not scheduled: nothing is kept, nothing listed.
  EXPECT_TRUE(hub_.ReportProgress(Progress(r, 10, 20, 30, {{t, 10}}), 0).ok());
  EXPECT_TRUE(hub_.Snapshot(SnapshotLimits{}, 0).transfers.empty());
  // Unknown version: ignored too.
  ProgressReport other = Progress(r, 10, 20, 30, {});
  other.version = Version(9);
  EXPECT_TRUE(hub_.ReportProgress(other, 0).ok());

  ASSERT_TRUE(hub_.Schedule(r, "m", Version(1), {}, 4).ok());
  ASSERT_TRUE(hub_.ReportProgress(Progress(r, 10, 20, 30, {{t, 10}}), 0).ok());
  ASSERT_TRUE(hub_.Snapshot(SnapshotLimits{}, 0).transfers[0].reported);
  // Scheduled again (a refresh): the fetch goes on, and so does its progress.
  ASSERT_TRUE(hub_.Schedule(r, "m", Version(1), {}, 4).ok());
  ASSERT_TRUE(hub_.Snapshot(SnapshotLimits{}, 0).transfers[0].reported);
  // FetchDone ends it; a stale report after that is not kept.
  hub_.FetchDone(r, "m", Version(1));
  EXPECT_TRUE(hub_.ReportProgress(Progress(r, 11, 20, 40, {{t, 11}}), 0).ok());
  EXPECT_TRUE(hub_.Snapshot(SnapshotLimits{}, 0).transfers.empty());

  // The reader leaving ends it as well.
  ASSERT_TRUE(hub_.Schedule(r, "m", Version(1), {}, 4).ok());
  ASSERT_TRUE(hub_.ReportProgress(Progress(r, 10, 20, 30, {{t, 10}}), 0).ok());
  ASSERT_TRUE(hub_.Leave(r).ok());
  HubSnapshot s = hub_.Snapshot(SnapshotLimits{}, 0);
  EXPECT_EQ(s.transfers_total, 0u);
  EXPECT_EQ(s.workers, 1u);
}

TEST_F(HubStateTest, SlowestHoldersFromFinishedFetchesBoundedAndForgotten) {
  WorkerId a = Register("a");
  WorkerId b = Register("b");
  WorkerId c = Register("c");
  WorkerId r = Register("reader");
  // Throughputs: a 1000 B/s, b 4000 and 2000 (mean 3000), c 8000.
  ASSERT_TRUE(hub_.ReportProgress(
                      Progress(r, 0, 0, 1000, {{a, 1000}, {b, 4000}}, true), 0)
                  .ok());
  ASSERT_TRUE(
      hub_.ReportProgress(
              Progress(r, 0, 0, 2000,
                       {{b, 4000}, {c, 16000}, {WorkerId("gone"), 1}}, true),
              0)
          .ok());
  HubSnapshot s = hub_.Snapshot(SnapshotLimits{}, 0);
  ASSERT_EQ(s.slowest.size(), 3u);  // the unknown worker is not recorded
  EXPECT_EQ(s.slowest[0].name, "a");
  EXPECT_DOUBLE_EQ(s.slowest[0].bytes_per_second, 1000.0);
  EXPECT_EQ(s.slowest[1].name, "b");
  EXPECT_DOUBLE_EQ(s.slowest[1].bytes_per_second, 3000.0);
  EXPECT_EQ(s.slowest[1].samples, 2u);
  EXPECT_EQ(s.slowest[2].name, "c");
  SnapshotLimits two;
  two.slowest = 2;
  EXPECT_EQ(hub_.Snapshot(two, 0).slowest.size(), 2u);

  // At most kMaxRateSamples per holder, the newest kept.
  for (size_t i = 0; i < kMaxRateSamples + 3; ++i) {
    ASSERT_TRUE(
        hub_.ReportProgress(Progress(r, 0, 0, 1000, {{a, 500}}, true), 1).ok());
  }
  s = hub_.Snapshot(SnapshotLimits{}, 1);
  EXPECT_EQ(s.slowest[0].name, "a");
  EXPECT_EQ(s.slowest[0].samples, kMaxRateSamples);
  EXPECT_DOUBLE_EQ(s.slowest[0].bytes_per_second, 500.0);
  // Old samples fall out of the window; a holder that leaves is forgotten.
  s = hub_.Snapshot(SnapshotLimits{}, 1 + kRateWindowMs + 1);
  EXPECT_TRUE(s.slowest.empty());
  ASSERT_TRUE(hub_.Leave(c).ok());
  s = hub_.Snapshot(SnapshotLimits{}, 0);
  ASSERT_EQ(s.slowest.size(), 2u);
  EXPECT_EQ(s.slowest[1].name, "b");
}

TEST_F(HubStateTest, SnapshotIsBoundedByItsLimits) {
  WorkerId t = Register("trainer");
  std::vector<WorkerId> readers;
  for (int i = 0; i < 5; ++i)
    readers.push_back(Register("r" + std::to_string(i)));
  for (int mi = 0; mi < 3; ++mi) {
    const std::string model = "m" + std::to_string(mi);
    for (uint64_t ver = 1; ver <= 4; ++ver) {
      auto g = Group(model, 1, static_cast<uint8_t>(mi * 10 + ver));
      ASSERT_EQ(*Pub(t, model, ver, g, 0), VersionState::kCommitted);
      for (const WorkerId& r : readers) {
        ASSERT_TRUE(
            hub_.AddHolder(r, model, Version(ver), 1, ManifestOf(g), 0, true)
                .ok());
        ASSERT_TRUE(hub_.Schedule(r, model, Version(ver), {}, 4).ok());
      }
    }
  }
  SnapshotLimits lim;
  lim.models = 2;
  lim.versions_per_model = 3;
  lim.holders_per_version = 4;
  lim.transfers = 7;
  HubSnapshot s = hub_.Snapshot(lim, 0);
  EXPECT_EQ(s.models_total, 3u);
  ASSERT_EQ(s.models.size(), 2u);
  EXPECT_EQ(s.models[0].versions_total, 4u);
  ASSERT_EQ(s.models[0].versions.size(), 3u);
  EXPECT_EQ(s.models[0].versions[0].version, Version(4));  // newest first
  EXPECT_EQ(s.models[0].versions[0].holders_filling, 5u);
  EXPECT_EQ(s.models[0].versions[0].holders.size(), 4u);
  EXPECT_EQ(s.transfers_total, 3u * 4u * 5u);
  EXPECT_EQ(s.transfers.size(), 7u);
  // Limits past the hub's bounds are clamped.
  lim.transfers = 1u << 30;
  EXPECT_EQ(hub_.Snapshot(lim, 0).transfers.size(), 60u);
}

}  // namespace
}  // namespace tensorhub::hub
