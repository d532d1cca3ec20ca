// The hub's tiling check at commit: a group's pieces of a logical tensor
// must tile it, or the last rank's publish is refused and nothing changes.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <optional>

#include "common/checksum.h"
#include "hub/hub_state.h"

namespace tensorhub::hub {
namespace {

class HubReshardTest : public ::testing::Test {
 protected:
  HubReshardTest() : hub_(HubConfig{}) {}

  WorkerId Register(const std::string& name) { return Join(hub_, name); }
  static WorkerId Join(HubState& hub, const std::string& name) {
    WorkerRegistration reg;
    reg.name = name;
    reg.data_address = name + ":9000";
    return *hub.RegisterWorker(reg, 0);
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

  // A holder of slices' layout of several boxes: (tensor, its global
  // shape, the box), U8.
  struct Held {
    std::string name;
    std::vector<uint64_t> shape;
    Box box;
  };
  PartLayout Boxes(const std::vector<Held>& held) {
    std::vector<TensorRef> refs;
    PieceOptions opts;
    opts.segment_bytes = 16;
    for (const Held& h : held) {
      std::vector<uint8_t>& buf =
          buffers_.emplace_back(std::max<uint64_t>(1, h.box.Elements()), 9);
      refs.push_back({{h.name, DType::kU8, h.box.extent},
                      buf.data(),
                      h.box.Elements(),
                      MemoryLocation::Host()});
      opts.pieces[h.name] = {h.shape, h.box.offset};
    }
    Result<PartLayout> p = BuildPartLayout(
        0xFFFFFFFFu, refs, kMinChunkBytes, ChunkChecksum::kXxh3,
        [](std::span<const iovec> v) -> Result<uint64_t> {
          return Xxh3Pieces(v);
        },
        opts);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return *p;
  }
  // The same tensors as Rows, published whole by one rank, not as pieces.
  PartLayout Plain(uint64_t rows) {
    std::vector<uint8_t>& w = buffers_.emplace_back(rows * 8, 1);
    std::vector<uint8_t>& n = buffers_.emplace_back(8, 2);
    std::vector<TensorRef> refs = {
        {{"w", DType::kU8, {rows, 8}},
         w.data(),
         w.size(),
         MemoryLocation::Host()},
        {{"n", DType::kU8, {8}}, n.data(), 8, MemoryLocation::Host()}};
    Result<PartLayout> p = BuildPartLayout(
        0, refs, kMinChunkBytes, ChunkChecksum::kXxh3,
        [](std::span<const iovec> v) -> Result<uint64_t> {
          return Xxh3Pieces(v);
        },
        PieceOptions{});
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return *p;
  }
  BeginFetchArgs Begin(const WorkerId& reader, size_t max_sources = 4) {
    BeginFetchArgs a;
    a.reader = reader;
    a.model = "m";
    a.version = Version(1);
    a.fill_epoch = 7;
    a.max_sources = max_sources;
    return a;
  }
  std::optional<VersionState> State() { return hub_.StateOf("m", Version(1)); }

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

// Holders of slices count towards availability: a version of pieces whose
// trainer ranks all left stays COMMITTED while the readers' boxes cover
// every tensor, BeginFetch hands those readers out (holders of slices only:
// a whole fetch reads them as slices), and it is UNAVAILABLE once they do
// not cover it.
TEST_F(HubReshardTest, HoldersOfSlicesKeepAVersionOfPiecesAvailable) {
  const WorkerId a = Register("a"), b = Register("b");
  const WorkerId whole = Register("whole"), r = Register("r");
  ASSERT_TRUE(Pub(a, 0, 2, Rows(0, 10, 0, 5)).ok());
  ASSERT_EQ(*Pub(b, 1, 2, Rows(1, 10, 5, 10)), VersionState::kCommitted);
  // A whole fetch of it, served onward: boxes that are the whole tensors.
  const PartLayout all =
      Boxes({{"w", {10, 8}, Box{{0, 0}, {10, 8}}}, {"n", {8}, Box{{0}, {8}}}});
  ASSERT_TRUE(hub_.AddSliceHolder(whole, "m", Version(1), 3, all, 0).ok());
  // While the ranks hold it, BeginFetch offers the holder of slices first,
  // then both ranks.
  Result<FetchStart> start = hub_.BeginFetch(Begin(r), 0);
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  EXPECT_EQ(Ids(start->sources), (std::vector<WorkerId>{whole, a, b}));
  EXPECT_TRUE(start->sources[0].slice_holder);
  EXPECT_EQ(start->filling.code(), StatusCode::kFailedPrecondition);
  hub_.FetchDone(r, "m", Version(1));
  ASSERT_TRUE(hub_.Unpublish(a, "m", Version(1), 0).ok());
  ASSERT_TRUE(hub_.Unpublish(b, "m", Version(1), 0).ok());
  EXPECT_EQ(State(), VersionState::kCommitted);
  // Latest still names it, and a fetch of it gets the holder of slices.
  Result<Resolution> latest = hub_.Resolve(r, "m", Version::Latest(), false);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  EXPECT_EQ(latest->version, Version(1));
  start = hub_.BeginFetch(Begin(r), 0);
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  EXPECT_TRUE(start->sources_status.ok()) << start->sources_status.ToString();
  EXPECT_EQ(Ids(start->sources), std::vector<WorkerId>{whole});
  // A reader of slices too; a full fetch of chunks finds no holder.
  const std::vector<SliceWant> rows = {{"w", Box{{2, 0}, {6, 8}}}};
  EXPECT_EQ(Ids(*hub_.ScheduleSlices(r, "m", Version(1), {}, 4, rows)),
            std::vector<WorkerId>{whole});
  EXPECT_EQ(hub_.Schedule(r, "m", Version(1), {}, 4).status().code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(
      hub_.ScheduleSlices(r, "m", Version(1), {whole}, 4, rows).status().code(),
      StatusCode::kUnavailable);
  // A holder of part of it does not keep it: gone is gone.
  const WorkerId part = Register("part");
  ASSERT_TRUE(hub_.AddSliceHolder(part, "m", Version(1), 4,
                                  Boxes({{"w", {10, 8}, Box{{0, 0}, {6, 8}}},
                                         {"n", {8}, Box{{0}, {8}}}}),
                                  0)
                  .ok());
  ASSERT_TRUE(hub_.Unpublish(whole, "m", Version(1), 0).ok());
  EXPECT_EQ(State(), VersionState::kUnavailable);
  EXPECT_EQ(hub_.Resolve(r, "m", Version(1), false).status().code(),
            StatusCode::kUnavailable);
  // The rest of the rows from another holder: committed again; a reader
  // that may use one source gets both, which it takes to cover the rows.
  const WorkerId rest = Register("rest");
  ASSERT_TRUE(hub_.AddSliceHolder(rest, "m", Version(1), 5,
                                  Boxes({{"w", {10, 8}, Box{{6, 0}, {4, 8}}}}),
                                  0)
                  .ok());
  EXPECT_EQ(State(), VersionState::kCommitted);
  start = hub_.BeginFetch(Begin(r, /*max_sources=*/1), 0);
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  std::vector<WorkerId> got = Ids(start->sources);
  std::sort(got.begin(), got.end());
  std::vector<WorkerId> both = {part, rest};
  std::sort(both.begin(), both.end());
  EXPECT_EQ(got, both);
  // Leaving drops a holder of slices as unpublishing does.
  ASSERT_TRUE(hub_.Leave(rest).ok());
  EXPECT_EQ(State(), VersionState::kUnavailable);
}

// A version published whole (no pieces) that readers of slices hold: once
// its trainer left, holders of slices keep it, and a whole fetch of it is
// told so (holders of slices among its sources, no filling registration:
// it reads slices). While complete holders of chunks cover it, a whole
// fetch reads chunks as before.
TEST_F(HubReshardTest, HoldersOfSlicesKeepAPlainVersionAvailable) {
  const WorkerId t = Register("t"), r = Register("r");
  const WorkerId h0 = Register("h0"), h1 = Register("h1");
  ASSERT_EQ(*Pub(t, 0, 1, Plain(10)), VersionState::kCommitted);
  // Two TP ranks' slices: rows 0..5 and 5..10 of w, n whole on both.
  ASSERT_TRUE(hub_.AddSliceHolder(h0, "m", Version(1), 3,
                                  Boxes({{"w", {10, 8}, Box{{0, 0}, {5, 8}}},
                                         {"n", {8}, Box{{0}, {8}}}}),
                                  0)
                  .ok());
  ASSERT_TRUE(hub_.AddSliceHolder(h1, "m", Version(1), 3,
                                  Boxes({{"w", {10, 8}, Box{{5, 0}, {5, 8}}},
                                         {"n", {8}, Box{{0}, {8}}}}),
                                  0)
                  .ok());
  Result<FetchStart> start = hub_.BeginFetch(Begin(r), 0);
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  EXPECT_TRUE(start->filling.ok()) << start->filling.ToString();
  EXPECT_EQ(Ids(start->sources), std::vector<WorkerId>{t});
  ASSERT_TRUE(hub_.Unpublish(r, "m", Version(1), 0).ok());
  ASSERT_TRUE(hub_.Unpublish(t, "m", Version(1), 0).ok());
  EXPECT_EQ(State(), VersionState::kCommitted);
  start = hub_.BeginFetch(Begin(r, /*max_sources=*/1), 0);
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  EXPECT_EQ(start->filling.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(start->filling.message().find("holders of slices"),
            std::string::npos)
      << start->filling.ToString();
  std::vector<WorkerId> got = Ids(start->sources);
  std::sort(got.begin(), got.end());
  std::vector<WorkerId> both = {h0, h1};
  std::sort(both.begin(), both.end());
  EXPECT_EQ(got, both);
  const HubSnapshot snap = hub_.Snapshot({}, 0);
  EXPECT_EQ(snap.models[0].versions[0].holders_filling, 0u);
  // Re-registered under its id by a new process, a holder's boxes are not
  // the new process's: the version is lost.
  WorkerRegistration again;
  again.requested_id = h1;
  again.name = "h1";
  again.data_address = "h1:9001";
  ASSERT_TRUE(hub_.RegisterWorker(again, 0).ok());
  EXPECT_EQ(State(), VersionState::kUnavailable);
}

// Boxes count where a reader can read from them (geometry.h,
// MatrixOrigin): a 3-dimensional tensor cut along its first dimension is
// kept by a holder of all of it; cut along a middle dimension, by none.
TEST_F(HubReshardTest, HoldersOfSlicesCountWhereAReaderCanReadFromThem) {
  for (const bool middle : {false, true}) {
    SCOPED_TRACE(middle ? "pieces cut along the middle dimension"
                        : "pieces cut along the first dimension");
    HubState hub{HubConfig{}};
    const WorkerId a = Join(hub, "a"), b = Join(hub, "b");
    const WorkerId whole = Join(hub, "whole");
    const std::vector<uint64_t> shape = {4, 6, 8};
    for (uint32_t r = 0; r < 2; ++r) {
      const Box box = middle ? Box{{0, 3 * r, 0}, {4, 3, 8}}
                             : Box{{2 * r, 0, 0}, {2, 6, 8}};
      PartLayout part = Boxes({{"e", shape, box}});
      part.rank = r;
      PublishArgs args;
      args.worker = r == 0 ? a : b;
      args.model = "m";
      args.version = Version(1);
      args.rank = r;
      args.group_size = 2;
      args.chunk_bytes = kMinChunkBytes;
      args.part = part;
      ASSERT_TRUE(hub.Publish(args, 0).ok());
    }
    ASSERT_TRUE(hub.AddSliceHolder(whole, "m", Version(1), 3,
                                   Boxes({{"e", shape, Box::Whole(shape)}}), 0)
                    .ok());
    ASSERT_TRUE(hub.Unpublish(a, "m", Version(1), 0).ok());
    ASSERT_TRUE(hub.Unpublish(b, "m", Version(1), 0).ok());
    EXPECT_EQ(hub.StateOf("m", Version(1)),
              middle ? VersionState::kUnavailable : VersionState::kCommitted);
  }
}

// A keeper is never asked to copy a version of pieces: its copy would be a
// holder of slices, which retention does not count (unchanged: retention
// of such a version rests on its trainer ranks).
TEST_F(HubReshardTest, AKeeperIsNotAskedToCopyAVersionOfPieces) {
  const WorkerId a = Register("a"), b = Register("b");
  const WorkerId keeper = Register("keeper");
  ASSERT_TRUE(Pub(a, 0, 2, Rows(0, 10, 0, 5)).ok());
  ASSERT_EQ(*Pub(b, 1, 2, Rows(1, 10, 5, 10)), VersionState::kCommitted);
  ASSERT_TRUE(hub_.Retain("m", Version(1), true).ok());
  hub_.SetDeparting(a, "m", Version(1), true);
  EXPECT_FALSE(hub_.CheckDeparture(a, "m", Version(1)).ok());
  EXPECT_TRUE(hub_.KeeperTasks(keeper).fetch.empty());
  // Nor does a holder of slices of all of it change that.
  ASSERT_TRUE(hub_.AddSliceHolder(Register("whole"), "m", Version(1), 3,
                                  Boxes({{"w", {10, 8}, Box{{0, 0}, {10, 8}}},
                                         {"n", {8}, Box{{0}, {8}}}}),
                                  0)
                  .ok());
  EXPECT_FALSE(hub_.CheckDeparture(a, "m", Version(1)).ok());
  EXPECT_TRUE(hub_.KeeperTasks(keeper).fetch.empty());
}

// A version only holders of slices hold is not forgotten with the dead
// versions (Prune), however many of those there are.
TEST_F(HubReshardTest, AVersionHeldOnlyAsSlicesIsNotForgotten) {
  HubConfig c;
  c.max_dead_versions_per_model = 1;
  HubState hub(c);
  const WorkerId t = Join(hub, "t"), h = Join(hub, "h");
  for (uint64_t version = 1; version <= 3; ++version) {
    PublishArgs args;
    args.worker = t;
    args.model = "m";
    args.version = Version(version);
    args.chunk_bytes = kMinChunkBytes;
    args.part = Plain(10);
    ASSERT_TRUE(hub.Publish(args, 0).ok());
    if (version == 1) {
      ASSERT_TRUE(
          hub.AddSliceHolder(h, "m", Version(1), 3,
                             Boxes({{"w", {10, 8}, Box{{0, 0}, {10, 8}}},
                                    {"n", {8}, Box{{0}, {8}}}}),
                             0)
              .ok());
    }
    ASSERT_TRUE(hub.Unpublish(t, "m", Version(version), 0).ok());
  }
  EXPECT_EQ(hub.StateOf("m", Version(1)), VersionState::kCommitted);
  EXPECT_EQ(hub.StateOf("m", Version(2)), std::nullopt);  // forgotten
  EXPECT_EQ(hub.StateOf("m", Version(3)), VersionState::kUnavailable);
}

}  // namespace
}  // namespace tensorhub::hub
