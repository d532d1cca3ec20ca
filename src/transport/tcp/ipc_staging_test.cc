// The policy of what a holder exports to same-host readers of its device
// memory, and the bookkeeping of its device staging buffers
// (ipc_staging.h), on the host.
#include "transport/tcp/ipc_staging.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

namespace tensorhub::transport {
namespace {

TEST(IpcStagingTest, PolicyNamesRoundTripAndBadOnesSayWhatIsAccepted) {
  for (CudaIpcPolicy p :
       {CudaIpcPolicy::kStaged, CudaIpcPolicy::kDirect, CudaIpcPolicy::kOff}) {
    Result<CudaIpcPolicy> back = ParseCudaIpcPolicy(CudaIpcPolicyName(p));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, p);
  }
  Result<CudaIpcPolicy> bad = ParseCudaIpcPolicy("yes");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("staged"), std::string::npos);
  EXPECT_NE(bad.status().message().find("direct"), std::string::npos);
}

// The hole this closes: before, a holder exported its published allocation
// whenever the published regions covered it, so a same-host reader got the
// engine's own weights read-write, for as long as it kept the handle. By
// default now it never does, covered or not.
TEST(IpcStagingTest, ByDefaultThePublishedAllocationIsNeverShared) {
  const CudaIpcPolicy def = CudaIpcPolicy::kStaged;
  for (bool covered : {true, false}) {
    EXPECT_EQ(ChooseDeviceReadPath(def, covered, true),
              DeviceReadPath::kDeviceStaged);
    EXPECT_EQ(ChooseDeviceReadPath(def, covered, false),
              DeviceReadPath::kHostStaged);
  }
}

TEST(IpcStagingTest, DirectSharesOnlyAnAllocationThePublishedRegionsCover) {
  const CudaIpcPolicy d = CudaIpcPolicy::kDirect;
  EXPECT_EQ(ChooseDeviceReadPath(d, true, true),
            DeviceReadPath::kShareAllocation);
  EXPECT_EQ(ChooseDeviceReadPath(d, true, false),
            DeviceReadPath::kShareAllocation);  // no copy needed
  EXPECT_EQ(ChooseDeviceReadPath(d, false, true),
            DeviceReadPath::kDeviceStaged);
  EXPECT_EQ(ChooseDeviceReadPath(d, false, false), DeviceReadPath::kHostStaged);
}

TEST(IpcStagingTest, OffNeverExportsAnything) {
  for (bool covered : {true, false}) {
    for (bool fits : {true, false}) {
      EXPECT_EQ(ChooseDeviceReadPath(CudaIpcPolicy::kOff, covered, fits),
                DeviceReadPath::kHostStaged);
    }
  }
}

TEST(IpcStagingTest, NeededRoundsUpAndSaturates) {
  StagingSlots s(4, 1000);
  EXPECT_EQ(s.Needed(0), 1u);
  EXPECT_EQ(s.Needed(1), 1u);
  EXPECT_EQ(s.Needed(1000), 1u);
  EXPECT_EQ(s.Needed(1001), 2u);
  EXPECT_EQ(s.Needed(4000), 4u);
  EXPECT_TRUE(s.Fits(4000));
  EXPECT_FALSE(s.Fits(4001));
  EXPECT_FALSE(s.Fits(UINT64_MAX));  // no overflow into "fits"
  EXPECT_EQ(s.Needed(UINT64_MAX), 5u);
}

TEST(IpcStagingTest, TakeIsAllOrNothingAndAllocatesOnlyOnFirstUse) {
  StagingSlots s(3, 100);
  auto a = s.Take(150, /*owner=*/1);  // two slots
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->slots.size(), 2u);
  EXPECT_EQ(a->allocate, a->slots);  // nothing allocated yet
  for (size_t i : a->allocate) s.MarkAllocated(i);
  EXPECT_EQ(s.in_use(), 2u);
  // Two more do not fit in the one left: none taken, nothing changes.
  EXPECT_FALSE(s.Take(200, 2).has_value());
  EXPECT_EQ(s.in_use(), 2u);
  auto b = s.Take(100, 2);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->slots.size(), 1u);
  EXPECT_EQ(b->allocate.size(), 1u);
  // Its allocation failed: the slot stays unallocated.
  s.Give(*b);
  EXPECT_EQ(s.allocated(), 2u);
  s.Give(*a);
  EXPECT_EQ(s.in_use(), 0u);
  // Allocated slots come first: a one-slot read allocates nothing new.
  auto c = s.Take(10, 3);
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(c->allocate.empty());
  EXPECT_EQ(s.allocated_bytes(), 200u);
}

TEST(IpcStagingTest, AReaderGetsBackTheSlotsItHeldBefore) {
  StagingSlots s(4, 100);
  auto a = s.Take(100, 7);
  auto b = s.Take(100, 8);
  ASSERT_TRUE(a && b);
  s.MarkAllocated(a->slots[0]);
  s.MarkAllocated(b->slots[0]);
  s.Give(*a);
  s.Give(*b);
  auto again8 = s.Take(100, 8);
  auto again7 = s.Take(100, 7);
  ASSERT_TRUE(again8 && again7);
  EXPECT_EQ(again8->slots, b->slots);
  EXPECT_EQ(again7->slots, a->slots);
}

// Seeded: readers take and give back at random. A slot is never in two
// leases at once, never allocated twice, and never more than the bound.
TEST(IpcStagingTest, RandomLeasesNeverShareASlotOrPassTheBound) {
  std::mt19937_64 rng(20261128);
  StagingSlots s(8, 1 << 20);
  std::map<int, StagingSlots::Taken> live;
  std::set<size_t> allocated;
  int next = 0;
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 2 == 0) {
      const uint64_t bytes = rng() % (5 << 20);
      auto t = s.Take(bytes, rng() % 5);
      size_t used = 0;
      for (auto& [id, l] : live) used += l.slots.size();
      if (!t) {
        ASSERT_GT(used + s.Needed(bytes), 8u)
            << "refused with room, step " << step;
        continue;
      }
      ASSERT_EQ(t->slots.size(), s.Needed(bytes));
      for (auto& [id, l] : live) {
        for (size_t i : l.slots) {
          for (size_t j : t->slots) ASSERT_NE(i, j) << "step " << step;
        }
      }
      for (size_t i : t->allocate) {
        ASSERT_TRUE(allocated.insert(i).second) << "allocated twice";
        if (rng() % 10 != 0) {
          s.MarkAllocated(i);
        } else {
          allocated.erase(i);  // its allocation failed
        }
      }
      live[next++] = *t;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      s.Give(it->second);
      live.erase(it);
    }
    ASSERT_LE(s.in_use(), 8u);
    ASSERT_EQ(s.allocated(), allocated.size());
  }
}

}  // namespace
}  // namespace tensorhub::transport
