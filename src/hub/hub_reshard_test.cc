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
        rank, refs, kMinChunkBytes, ChunkChecksum::kXxh3,
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

  // A holder of slices' layout: one box of `name` ([global] U8 matrix of
  // 8 columns), rows [begin, end).
  PartLayout Slices(const std::string& name, uint64_t global_rows,
                    uint64_t begin, uint64_t end, uint64_t segment_bytes = 16) {
    std::vector<uint8_t>& buf = buffers_.emplace_back((end - begin) * 8, 9);
    std::vector<TensorRef> refs = {{{name, DType::kU8, {end - begin, 8}},
                                    buf.data(),
                                    buf.size(),
                                    MemoryLocation::Host()}};
    PieceOptions opts;
    opts.pieces[name] = {{global_rows, 8}, {begin, 0}};
    opts.segment_bytes = segment_bytes;
    Result<PartLayout> p = BuildPartLayout(
        0xFFFFFFFFu, refs, kMinChunkBytes, ChunkChecksum::kXxh3,
        [](std::span<const iovec> v) -> Result<uint64_t> {
          return Xxh3Pieces(v);
        },
        opts);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return *p;
  }

  static std::vector<WorkerId> Ids(const std::vector<HolderView>& hs) {
    std::vector<WorkerId> out;
    for (const HolderView& h : hs) out.push_back(h.worker);
    return out;
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

// A reader of a version of pieces receives logical tensors, not the parts'
// chunks: BeginFetch does not register it as a filling holder (nothing to
// withdraw when the fetch ends), and no other reader is sent to it.
TEST_F(HubReshardTest, AReaderOfPiecesIsNeverAFillingHolder) {
  const WorkerId a = Register("a"), b = Register("b"), r = Register("r");
  ASSERT_TRUE(Pub(a, 0, 2, Rows(0, 10, 0, 5)).ok());
  ASSERT_EQ(*Pub(b, 1, 2, Rows(1, 10, 5, 10)), VersionState::kCommitted);
  BeginFetchArgs args;
  args.reader = r;
  args.model = "m";
  args.version = Version(1);
  args.fill_epoch = 7;
  Result<FetchStart> start = hub_.BeginFetch(args, 0);
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  EXPECT_EQ(start->filling.code(), StatusCode::kFailedPrecondition)
      << start->filling.ToString();
  EXPECT_EQ(start->sources.size(), 2u);  // both ranks, to read from
  const HubSnapshot snap = hub_.Snapshot({}, 0);
  ASSERT_EQ(snap.models.size(), 1u);
  EXPECT_EQ(snap.models[0].versions[0].holders_filling, 0u);
  Result<std::vector<HolderView>> other =
      hub_.Schedule(Register("q"), "m", Version(1), {}, 4);
  ASSERT_TRUE(other.ok());
  for (const HolderView& h : *other) EXPECT_NE(h.worker, r);
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

// Holders of slices go to readers of slices whose boxes they meet, first,
// and never to a full fetch; unpublish and leave drop them.
TEST_F(HubReshardTest, HoldersOfSlicesServeOnlyReadersOfSlicesTheyMeet) {
  const WorkerId t = Register("t"), s = Register("s"), r = Register("r");
  ASSERT_EQ(*Pub(t, 0, 1, Rows(0, 10, 0, 10)), VersionState::kCommitted);
  const PartLayout slices = Slices("w", 10, 0, 4);
  ASSERT_TRUE(hub_.AddSliceHolder(s, "m", Version(1), 7, slices, 0).ok());
  // A full fetch: never the holder of slices.
  EXPECT_EQ(Ids(*hub_.Schedule(r, "m", Version(1), {}, 4)),
            std::vector<WorkerId>{t});
  hub_.FetchDone(r, "m", Version(1));
  EXPECT_EQ(Ids(hub_.Resolve(r, "m", Version(1), false)->holders),
            std::vector<WorkerId>{t});
  // A reader of rows 2..3 of w: the holder of slices first, with its layout.
  const std::vector<SliceWant> meets = {{"w", Box{{2, 0}, {1, 8}}}};
  Result<std::vector<HolderView>> got =
      hub_.ScheduleSlices(r, "m", Version(1), {}, 4, meets);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(Ids(*got), (std::vector<WorkerId>{s, t}));
  EXPECT_TRUE((*got)[0].slice_holder);
  EXPECT_EQ((*got)[0].slices, slices);
  EXPECT_EQ((*got)[0].epoch, 7u);
  EXPECT_TRUE((*got)[0].chunks.empty());
  EXPECT_FALSE((*got)[1].slice_holder);
  // Boxes it does not meet, another tensor, or excluded: not listed.
  for (const std::vector<SliceWant>& w :
       {std::vector<SliceWant>{{"w", Box{{5, 0}, {3, 8}}}},
        std::vector<SliceWant>{{"n", Box{{0}, {8}}}}}) {
    EXPECT_EQ(Ids(*hub_.ScheduleSlices(r, "m", Version(1), {}, 4, w)),
              std::vector<WorkerId>{t});
  }
  EXPECT_EQ(Ids(*hub_.ScheduleSlices(r, "m", Version(1), {s}, 4, meets)),
            std::vector<WorkerId>{t});
  // Unpublish drops it; a second unpublish has nothing to drop.
  ASSERT_TRUE(hub_.Unpublish(s, "m", Version(1), 0).ok());
  EXPECT_EQ(Ids(*hub_.ScheduleSlices(r, "m", Version(1), {}, 4, meets)),
            std::vector<WorkerId>{t});
  EXPECT_EQ(hub_.Unpublish(s, "m", Version(1), 0).code(),
            StatusCode::kNotFound);
  // So does leaving (or a lease ending).
  ASSERT_TRUE(hub_.AddSliceHolder(s, "m", Version(1), 8, slices, 0).ok());
  EXPECT_EQ(Ids(*hub_.ScheduleSlices(r, "m", Version(1), {}, 4, meets)),
            (std::vector<WorkerId>{s, t}));
  ASSERT_TRUE(hub_.Leave(s).ok());
  EXPECT_EQ(Ids(*hub_.ScheduleSlices(r, "m", Version(1), {}, 4, meets)),
            std::vector<WorkerId>{t});
}

TEST_F(HubReshardTest, BadSlicesAreRefusedAndChangeNothing) {
  const WorkerId t = Register("t"), s = Register("s"), r = Register("r");
  // Before the version is committed (e.g. a restarted hub that has not
  // heard from its holders yet): report again later.
  EXPECT_EQ(hub_.AddSliceHolder(s, "m", Version(1), 1, Slices("w", 10, 0, 4), 0)
                .code(),
            StatusCode::kFailedPrecondition);
  ASSERT_EQ(*Pub(t, 0, 1, Rows(0, 10, 0, 10)), VersionState::kCommitted);
  struct Case {
    PartLayout slices;
    std::string says;
  };
  std::vector<Case> cases = {
      {Slices("zz", 10, 0, 4), "no such tensor"},
      {Slices("w", 12, 0, 4), "global shape"},
      {Slices("w", 10, 0, 4, /*segment_bytes=*/0), "no segment checksums"},
  };
  for (const Case& c : cases) {
    Status st = hub_.AddSliceHolder(s, "m", Version(1), 1, c.slices, 0);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.says;
    EXPECT_NE(st.message().find(c.says), std::string::npos) << st.ToString();
  }
  EXPECT_EQ(Ids(*hub_.ScheduleSlices(r, "m", Version(1), {}, 4,
                                     {{"w", Box{{0, 0}, {10, 8}}}})),
            std::vector<WorkerId>{t});
}

}  // namespace
}  // namespace tensorhub::hub
