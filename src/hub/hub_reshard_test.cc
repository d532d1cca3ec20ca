// The hub's tiling check at commit: a group's pieces of a logical tensor
// must tile it, or the last rank's publish is refused and nothing changes.
#include <gtest/gtest.h>

#include <deque>

#include "common/checksum.h"
#include "hub/hub_state.h"

namespace tensorhub::hub {
namespace {

class HubReshardTest : public ::testing::Test {
 protected:
  HubReshardTest() : hub_(HubConfig{}) {}

  WorkerId Register(const std::string& name) {
    WorkerRegistration reg;
    reg.name = name;
    reg.data_address = name + ":9000";
    return *hub_.RegisterWorker(reg, 0);
  }

  // Rank `rank` publishes rows [begin, end) of "w" ([rows, 8] U8) as its
  // box, and a whole "n" on rank 0.
  PartLayout Rows(uint32_t rank, uint64_t rows, uint64_t begin, uint64_t end) {
    std::vector<uint8_t>& buf = buffers_.emplace_back((end - begin) * 8, rank);
    std::vector<TensorRef> refs = {{{"w", DType::kU8, {end - begin, 8}},
                                    buf.data(),
                                    buf.size(),
                                    MemoryLocation::Host()}};
    if (rank == 0) {
      refs.push_back({{"n", DType::kU8, {8}},
                      buffers_.emplace_back(8).data(),
                      8,
                      MemoryLocation::Host()});
    }
    PieceOptions opts;
    opts.pieces["w"] = {{rows, 8}, {begin, 0}};
    Result<PartLayout> p = BuildPartLayout(
        rank, refs, kMinChunkBytes,
        [](std::span<const iovec> v) -> Result<uint64_t> {
          return Xxh3Pieces(v);
        },
        opts);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return *p;
  }

  Result<VersionState> Pub(const WorkerId& w, uint32_t rank, uint32_t group,
                           const PartLayout& part) {
    PublishArgs a;
    a.worker = w;
    a.model = "m";
    a.version = Version(1);
    a.rank = rank;
    a.group_size = group;
    a.chunk_bytes = kMinChunkBytes;
    a.part = part;
    a.epoch = 1;
    return hub_.Publish(a, 0);
  }

  HubState hub_;
  std::deque<std::vector<uint8_t>> buffers_;
};

TEST_F(HubReshardTest, ShardsThatTileCommit) {
  const WorkerId a = Register("a"), b = Register("b"), c = Register("c");
  EXPECT_EQ(*Pub(a, 0, 3, Rows(0, 10, 0, 4)), VersionState::kPending);
  EXPECT_EQ(*Pub(c, 2, 3, Rows(2, 10, 7, 10)), VersionState::kPending);
  EXPECT_EQ(*Pub(b, 1, 3, Rows(1, 10, 4, 7)), VersionState::kCommitted);
  Result<Resolution> r = hub_.Resolve(WorkerId("x"), "m", Version(1), true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->manifest->parts()[1].tensors[0].PieceBox(),
            (Box{{4, 0}, {3, 8}}));
}

TEST_F(HubReshardTest, AGapIsRefusedAtCommitAndChangesNothing) {
  const WorkerId a = Register("a"), b = Register("b");
  EXPECT_EQ(*Pub(a, 0, 2, Rows(0, 10, 0, 4)), VersionState::kPending);
  // Rank 1 covers rows 5..10: row 4 is missing.
  Result<VersionState> s = Pub(b, 1, 2, Rows(1, 10, 5, 10));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("tensor 'w'"), std::string::npos)
      << s.status().ToString();
  EXPECT_NE(s.status().message().find("no part covers [4:5, 0:8]"),
            std::string::npos)
      << s.status().ToString();
  EXPECT_NE(s.status().message().find("the last to publish"),
            std::string::npos);
  // Still pending, not readable; a corrected part commits.
  EXPECT_EQ(hub_.Resolve(WorkerId("x"), "m", Version(1), false).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(*Pub(b, 1, 2, Rows(1, 10, 4, 10)), VersionState::kCommitted);
}

TEST_F(HubReshardTest, AnOverlapIsRefusedNamingBothBoxes) {
  const WorkerId a = Register("a"), b = Register("b");
  ASSERT_TRUE(Pub(a, 0, 2, Rows(0, 10, 0, 6)).ok());
  Result<VersionState> s = Pub(b, 1, 2, Rows(1, 10, 5, 10));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(
      s.status().message().find("part 0 [0:6, 0:8] and part 1 [5:10, 0:8] "
                                "overlap"),
      std::string::npos)
      << s.status().ToString();
}

}  // namespace
}  // namespace tensorhub::hub
