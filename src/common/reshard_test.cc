// Unit tests for resharding's pure parts: tiling, box intersection, copy
// plans, segment checksums, the Hugging Face layout helpers and the dtype
// conversions.
#include "tensorhub/reshard.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "common/checksum.h"
#include "common/convert.h"
#include "common/geometry.h"
#include "common/manifest.h"

namespace tensorhub {
namespace {

using Shape = std::vector<uint64_t>;

Box B(Shape offset, Shape extent) { return Box{offset, extent}; }

std::vector<TilePiece> Pieces(const std::vector<Box>& boxes) {
  std::vector<TilePiece> out;
  for (uint32_t i = 0; i < boxes.size(); ++i) out.push_back({i, boxes[i]});
  return out;
}

// ---------------------------------------------------------------- boxes

TEST(BoxTest, WholeElementsAndString) {
  Box b = Box::Whole(Shape{3, 4});
  EXPECT_EQ(b.offset, (Shape{0, 0}));
  EXPECT_EQ(b.Elements(), 12u);
  EXPECT_EQ(BoxToString(B({1, 2}, {3, 4})), "[1:4, 2:6]");
  EXPECT_EQ(Box{}.Elements(), 1u);  // a scalar
  EXPECT_EQ(B({0}, {0}).Elements(), 0u);
  EXPECT_EQ(B({0, 0}, {UINT64_MAX, 2}).Elements(), UINT64_MAX);  // saturates
}

TEST(BoxTest, IntersectAndContains) {
  EXPECT_EQ(*Intersect(B({0, 0}, {4, 4}), B({2, 1}, {4, 2})),
            B({2, 1}, {2, 2}));
  EXPECT_FALSE(Intersect(B({0, 0}, {4, 4}), B({4, 0}, {2, 4})).has_value());
  EXPECT_FALSE(Intersect(B({0}, {4}), B({0, 0}, {4, 4})).has_value());
  EXPECT_TRUE(Intersect(Box{}, Box{}).has_value());
  EXPECT_TRUE(Contains(B({0, 0}, {4, 4}), B({1, 1}, {3, 3})));
  EXPECT_FALSE(Contains(B({0, 0}, {4, 4}), B({1, 1}, {4, 3})));
}

// -------------------------------------------------- holders of slices

TEST(HolderBoxTest, MatrixOriginIsAShiftOnlyWithWholeMiddleDimensions) {
  using Origin = std::pair<uint64_t, uint64_t>;
  EXPECT_EQ(MatrixOrigin(Box{}, Shape{}), Origin(0, 0));
  EXPECT_EQ(MatrixOrigin(B({5}, {3}), Shape{10}), Origin(0, 5));
  EXPECT_EQ(MatrixOrigin(B({2, 3}, {4, 5}), Shape{8, 9}), Origin(2, 3));
  // [E=4, I=6, H=8]: experts 1..2 whole, columns 2..5: rows from 1 * 6.
  EXPECT_EQ(MatrixOrigin(B({1, 0, 2}, {2, 6, 4}), Shape{4, 6, 8}),
            Origin(6, 2));
  // Half of the middle dimension: rows of the box are not consecutive ones.
  EXPECT_FALSE(MatrixOrigin(B({0, 3, 0}, {4, 3, 8}), Shape{4, 6, 8}));
  EXPECT_FALSE(MatrixOrigin(B({0, 0}, {2, 2}), Shape{4, 4, 4}));  // rank
}

TEST(HolderBoxTest, CutAlongCutsAtEveryInnerBoundaryUpToTheBound) {
  const std::vector<Box> rows = {B({0, 0}, {5, 8}), B({5, 0}, {5, 8})};
  EXPECT_EQ(CutAlong(B({2, 0}, {6, 8}), rows),
            (std::vector<Box>{B({2, 0}, {3, 8}), B({5, 0}, {3, 8})}));
  EXPECT_EQ(CutAlong(B({0, 0}, {5, 8}), rows),
            std::vector<Box>{B({0, 0}, {5, 8})});
  // 9 x 9 pieces is more than kMaxSliceCuts: the box alone.
  std::vector<Box> grid;
  for (uint64_t i = 1; i < 9; ++i) grid.push_back(B({i, i}, {1, 1}));
  EXPECT_EQ(CutAlong(B({0, 0}, {10, 10}), grid),
            std::vector<Box>{B({0, 0}, {10, 10})});
}

// SliceHoldersCover against element-by-element coverage, on random boxes of
// 2- and 3-dimensional tensors: a region is served when every element lies
// in a box that maps by a shift and (the reader's plan cuts along at most
// kMaxSliceCuts pieces) those boxes cut it into at most that many pieces,
// or one of them holds all of it. Seeded: a failure names its seed.
TEST(HolderBoxTest, SliceHoldersCoverMatchesElementCoverage) {
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    auto below = [&](uint64_t n) { return n == 0 ? 0 : rng() % n; };
    const size_t rank = 2 + seed % 2;
    Shape shape;
    for (size_t k = 0; k < rank; ++k) shape.push_back(1 + below(7));
    auto random_box = [&](bool whole_middle) {
      Box b;
      for (size_t k = 0; k < rank; ++k) {
        const bool middle = k > 0 && k + 1 < rank;
        const uint64_t o = middle && whole_middle ? 0 : below(shape[k]);
        const uint64_t e =
            middle && whole_middle ? shape[k] : 1 + below(shape[k] - o);
        b.offset.push_back(o);
        b.extent.push_back(e);
      }
      return b;
    };
    const Box piece = random_box(seed % 5 != 0);
    Box region = piece;
    if (seed % 3 == 0) {
      if (std::optional<Box> r = Intersect(piece, random_box(false))) {
        region = *r;
      }
    }
    std::vector<Box> boxes;
    for (uint64_t n = below(6); n > 0; --n) {
      boxes.push_back(random_box(below(4) != 0));
    }
    // The reference, element by element.
    std::vector<Box> usable;
    for (const Box& b : boxes) {
      if (MatrixOrigin(b, shape) && Intersect(region, b)) usable.push_back(b);
    }
    bool every = true;
    std::vector<uint64_t> idx(rank, 0);
    for (uint64_t i = 0; i < region.Elements(); ++i) {
      Box cell;
      for (size_t k = 0; k < rank; ++k) {
        cell.offset.push_back(region.offset[k] + idx[k]);
        cell.extent.push_back(1);
      }
      every &= std::any_of(usable.begin(), usable.end(),
                           [&](const Box& b) { return Contains(b, cell); });
      for (size_t k = rank; k-- > 0;) {
        if (++idx[k] < region.extent[k]) break;
        idx[k] = 0;
      }
    }
    uint64_t cuts = 1;
    for (size_t k = 0; k < rank; ++k) {
      std::set<uint64_t> c;
      for (const Box& b : usable) {
        for (uint64_t x : {b.offset[k], b.offset[k] + b.extent[k]}) {
          if (x > region.offset[k] && x < region.offset[k] + region.extent[k])
            c.insert(x);
        }
      }
      cuts *= c.size() + 1;
    }
    const bool one =
        std::any_of(usable.begin(), usable.end(),
                    [&](const Box& b) { return Contains(b, region); });
    const bool want = MatrixOrigin(piece, shape).has_value() &&
                      (cuts <= kMaxSliceCuts ? every : one);
    EXPECT_EQ(SliceHoldersCover(piece, region, boxes, shape), want);
  }
  // An empty region needs nothing; a piece that does not map, everything.
  EXPECT_TRUE(
      SliceHoldersCover(B({0, 0}, {0, 4}), B({0, 0}, {0, 4}), {}, Shape{4, 4}));
  const std::vector<Box> whole = {B({0, 0, 0}, {2, 2, 2})};
  EXPECT_FALSE(SliceHoldersCover(
      B({0, 1, 0}, {2, 1, 2}), B({0, 1, 0}, {2, 1, 2}), whole, Shape{2, 2, 2}));
}

// --------------------------------------------------------------- tiling

TEST(TilingTest, FsdpAndTpTilingsPass) {
  for (uint32_t k : {1u, 2u, 3u, 4u, 8u}) {
    const Shape shape{7, 5};
    EXPECT_TRUE(CheckTiling("w", shape, Pieces(FsdpShards(shape, k))).ok())
        << k;
    for (uint32_t dim : {0u, 1u}) {
      EXPECT_TRUE(
          CheckTiling("w", shape, Pieces(*TpShards(shape, dim, k))).ok())
          << k << " " << dim;
    }
  }
  // A publisher skips empty pieces (a scalar goes to rank 0 alone).
  std::vector<Box> scalar;
  for (const Box& b : FsdpShards(Shape{}, 4)) {
    if (b.Elements() > 0) scalar.push_back(b);
  }
  ASSERT_EQ(scalar.size(), 1u);
  EXPECT_TRUE(CheckTiling("s", Shape{}, Pieces(scalar)).ok());
}

TEST(TilingTest, OverlapNamesBothBoxes) {
  Status s = CheckTiling("layer.w", Shape{8, 8},
                         Pieces({B({0, 0}, {5, 8}), B({4, 0}, {4, 8})}));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tensor 'layer.w'"), std::string::npos);
  EXPECT_NE(s.message().find("part 0 [0:5, 0:8]"), std::string::npos);
  EXPECT_NE(s.message().find("part 1 [4:8, 0:8]"), std::string::npos);
  EXPECT_NE(s.message().find("overlap"), std::string::npos);
}

TEST(TilingTest, GapNamesTheMissingBox) {
  Status s = CheckTiling("w", Shape{8, 8},
                         Pieces({B({0, 0}, {4, 8}), B({4, 0}, {4, 6})}));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cover 56 of 64"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("no part covers [4:8, 6:8]"), std::string::npos)
      << s.message();
}

TEST(TilingTest, OutOfBoundsAndWrongRank) {
  Status s = CheckTiling("w", Shape{8}, Pieces({B({0}, {4}), B({4}, {5})}));
  EXPECT_NE(s.message().find("outside"), std::string::npos) << s.message();
  s = CheckTiling("w", Shape{8}, Pieces({B({0, 0}, {8, 1})}));
  EXPECT_NE(s.message().find("dimensions"), std::string::npos) << s.message();
  // Offsets near 2^64 must not wrap around.
  s = CheckTiling("w", Shape{8}, Pieces({B({UINT64_MAX}, {9})}));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  // Two copies of a scalar overlap.
  s = CheckTiling("s", Shape{}, Pieces({Box{}, Box{}}));
  EXPECT_NE(s.message().find("overlap"), std::string::npos);
}

// Random grid tilings of up to 3 dimensions, shuffled; then one box moved
// by one index must be refused.
TEST(TilingTest, RandomGridsAndPerturbations) {
  std::mt19937_64 rng(17);
  for (int iter = 0; iter < 300; ++iter) {
    const size_t n = 1 + rng() % 3;
    Shape shape(n);
    std::vector<Shape> cuts(n);
    for (size_t d = 0; d < n; ++d) {
      shape[d] = 1 + rng() % 9;
      cuts[d] = {0, shape[d]};
      for (int c = rng() % 3; c > 0; --c) cuts[d].push_back(rng() % shape[d]);
      std::sort(cuts[d].begin(), cuts[d].end());
      cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
    }
    std::vector<Box> boxes;
    std::vector<size_t> idx(n, 0);
    for (bool more = true; more;) {
      Box b;
      for (size_t d = 0; d < n; ++d) {
        b.offset.push_back(cuts[d][idx[d]]);
        b.extent.push_back(cuts[d][idx[d] + 1] - cuts[d][idx[d]]);
      }
      boxes.push_back(b);
      more = false;
      for (size_t d = n; d-- > 0;) {
        if (++idx[d] + 1 < cuts[d].size()) {
          more = true;
          break;
        }
        idx[d] = 0;
      }
    }
    std::shuffle(boxes.begin(), boxes.end(), rng);
    ASSERT_TRUE(CheckTiling("w", shape, Pieces(boxes)).ok()) << iter;
    // Shrink one box: a gap. Grow one (when there is room): out of bounds
    // or an overlap.
    Box& victim = boxes[rng() % boxes.size()];
    const size_t d = rng() % n;
    if (victim.extent[d] > 0) {
      --victim.extent[d];
      EXPECT_FALSE(CheckTiling("w", shape, Pieces(boxes)).ok()) << iter;
      ++victim.extent[d];
    }
    ++victim.extent[d];
    EXPECT_FALSE(CheckTiling("w", shape, Pieces(boxes)).ok()) << iter;
  }
}

// ------------------------------------------------------------- PlanCopy

// Fills a layout of `box` (global shape `shape`) with each element's global
// linear index, as uint32.
std::vector<uint32_t> Fill(const Shape& shape, const Box& box) {
  std::vector<uint32_t> out;
  const size_t n = shape.size();
  std::vector<uint64_t> idx(n, 0);
  for (uint64_t i = 0; i < box.Elements(); ++i) {
    uint64_t lin = 0;
    for (size_t d = 0; d < n; ++d)
      lin = lin * shape[d] + box.offset[d] + idx[d];
    out.push_back(static_cast<uint32_t>(lin));
    for (size_t d = n; d-- > 0;) {
      if (++idx[d] < box.extent[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

Box RandomBox(std::mt19937_64& rng, const Box& within) {
  Box b;
  for (size_t d = 0; d < within.rank(); ++d) {
    const uint64_t a = rng() % within.extent[d], c = rng() % within.extent[d];
    b.offset.push_back(within.offset[d] + std::min(a, c));
    b.extent.push_back(std::max(a, c) - std::min(a, c) + 1);
  }
  return b;
}

TEST(PlanCopyTest, RandomBoxesCopyExactlyTheRegion) {
  std::mt19937_64 rng(3);
  for (int iter = 0; iter < 2000; ++iter) {
    const size_t n = 1 + rng() % 4;
    Shape shape(n);
    for (auto& s : shape) s = 1 + rng() % 6;
    const Box whole = Box::Whole(shape);
    const Box src = RandomBox(rng, whole), dst = RandomBox(rng, whole);
    std::optional<Box> both = Intersect(src, dst);
    if (!both) continue;
    const Box region = RandomBox(rng, *both);
    std::vector<uint32_t> s = Fill(shape, src);
    std::vector<uint32_t> d(dst.Elements(), 0xFFFFFFFF);
    uint64_t moved = 0;
    for (const StridedRun& r : PlanCopy(region, src, dst, 4)) {
      for (uint64_t i = 0; i < r.count; ++i) {
        std::memcpy(reinterpret_cast<uint8_t*>(d.data()) + r.dst_offset +
                        i * r.dst_stride,
                    reinterpret_cast<const uint8_t*>(s.data()) + r.src_offset +
                        i * r.src_stride,
                    r.run_bytes);
      }
      moved += r.bytes();
    }
    EXPECT_EQ(moved, region.Elements() * 4);
    // Every element of the region landed where the destination's layout
    // puts it, and nothing else was written.
    const std::vector<uint32_t> want_region = Fill(shape, region);
    const std::set<uint32_t> in_region(want_region.begin(), want_region.end());
    const std::vector<uint32_t> dst_ids = Fill(shape, dst);
    for (size_t i = 0; i < d.size(); ++i) {
      if (in_region.count(dst_ids[i])) {
        ASSERT_EQ(d[i], dst_ids[i]) << iter;
      } else {
        ASSERT_EQ(d[i], 0xFFFFFFFFu) << iter;
      }
    }
  }
}

TEST(PlanCopyTest, ColumnSliceIsOneBatchedRead) {
  const Box whole = Box::Whole(Shape{100, 64});
  const Box cols = B({0, 16}, {100, 16});
  std::vector<StridedRun> runs = PlanCopy(cols, whole, cols, 2);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0], (StridedRun{32, 0, 32, 100, 128, 32}));
  // A row slice is one contiguous run.
  const Box rows = B({10, 0}, {20, 64});
  runs = PlanCopy(rows, whole, rows, 2);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0],
            (StridedRun{10 * 128, 0, 20 * 128, 1, 20 * 128, 20 * 128}));
  // 3-D, cut along the middle dimension: rows 2..3 of each slab are one
  // run, the slabs the batch.
  const Box w3 = Box::Whole(Shape{4, 6, 8});
  const Box mid = B({0, 2, 0}, {4, 2, 8});
  runs = PlanCopy(mid, w3, mid, 1);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0], (StridedRun{16, 0, 16, 4, 48, 16}));
  // Cut along all three: the outer dimension enumerates batches.
  const Box all3 = B({0, 2, 2}, {4, 2, 3});
  runs = PlanCopy(all3, w3, all3, 1);
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[1], (StridedRun{48 + 16 + 2, 6, 3, 2, 8, 3}));
  // Cut along the last dimension of a 3-D box: whole outer dims fold into
  // the batch.
  const Box last = B({0, 0, 2}, {4, 6, 3});
  runs = PlanCopy(last, w3, last, 1);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].count, 24u);
}

// ------------------------------------------------------------- segments

TEST(SegmentTest, ShapeChoice) {
  // Whole rows, about 64 KiB.
  EXPECT_EQ(ChooseSegmentShape(Shape{4096, 4096}, 2, 64 << 10, false),
            (SegmentShape{8, 4096}));
  // Cut along the last dimension: a column block of 1/8.
  EXPECT_EQ(ChooseSegmentShape(Shape{4096, 4096}, 2, 64 << 10, true),
            (SegmentShape{64, 512}));
  // Rows longer than a segment.
  EXPECT_EQ(ChooseSegmentShape(Shape{2, 100000}, 4, 64 << 10, false),
            (SegmentShape{1, 16384}));
  EXPECT_EQ(ChooseSegmentShape(Shape{}, 4, 64 << 10, false),
            (SegmentShape{1, 1}));
  EXPECT_EQ(ChooseSegmentShape(Shape{0, 5}, 4, 64 << 10, false),
            (SegmentShape{}));
  EXPECT_EQ(NumSegments(Shape{4096, 4096}, {64, 512}), 64u * 8u);
  EXPECT_TRUE(CheckSegmentShape(Shape{10, 10}, 2, {3, 4}, "w").ok());
  EXPECT_FALSE(CheckSegmentShape(Shape{10, 10}, 2, {3, 0}, "w").ok());
  EXPECT_FALSE(CheckSegmentShape(Shape{10, 10}, 2, {11, 4}, "w").ok());
  EXPECT_FALSE(
      CheckSegmentShape(Shape{1u << 20, 1u << 20}, 2, {1u << 20, 1u << 20}, "w")
          .ok());
}

TEST(SegmentTest, ChecksumsAreOfTheTileBytesRowByRow) {
  const Shape shape{5, 7};
  std::vector<uint16_t> data(35);
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<uint16_t>(i * 31);
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  const SegmentShape seg{2, 3};
  std::vector<uint64_t> sums = SegmentChecksums(p, shape, 2, seg);
  ASSERT_EQ(sums.size(), NumSegments(shape, seg));
  ASSERT_EQ(sums.size(), 9u);
  // Tile (row block 1, column block 2): rows 2..3, column 6.
  std::vector<uint16_t> tile = {data[2 * 7 + 6], data[3 * 7 + 6]};
  EXPECT_EQ(sums[1 * 3 + 2], Xxh3(tile.data(), 4));
  // Whole-row tiles are contiguous ranges.
  sums = SegmentChecksums(p, shape, 2, {2, 7});
  ASSERT_EQ(sums.size(), 3u);
  EXPECT_EQ(sums[2], Xxh3(p + 4 * 14, 14));
}

TEST(SegmentTest, RectsAndCoveringSegments) {
  // 3-D piece [4, 6, 8], box cutting dims 1 and 2.
  const Shape shape{4, 6, 8};
  std::vector<MatrixRect> rects = RectsOfBox(shape, B({1, 2, 3}, {2, 2, 4}));
  ASSERT_EQ(rects.size(), 2u);
  EXPECT_EQ(rects[0], (MatrixRect{8, 10, 3, 7}));
  EXPECT_EQ(rects[1], (MatrixRect{14, 16, 3, 7}));
  // Whole middle dimension: one rectangle of consecutive rows.
  rects = RectsOfBox(shape, B({1, 0, 0}, {2, 6, 8}));
  ASSERT_EQ(rects.size(), 1u);
  EXPECT_EQ(rects[0], (MatrixRect{6, 18, 0, 8}));
  const MatrixView m = MatrixOf(shape);
  EXPECT_EQ(m.rows, 24u);
  // Grown to tiles of 4 rows x 4 columns, the two rects' row blocks touch
  // and merge.
  const std::vector<MatrixRect> in = {{8, 10, 3, 7}, {14, 16, 3, 7}};
  std::vector<MatrixRect> cover = CoveringSegments(in, m, {4, 4});
  ASSERT_EQ(cover.size(), 1u);
  EXPECT_EQ(cover[0], (MatrixRect{8, 16, 0, 8}));
  EXPECT_EQ(SegmentIdsOf(cover[0], m, {4, 4}),
            (std::vector<uint64_t>{4, 5, 6, 7}));
  // No checksums: nothing grows.
  EXPECT_EQ(CoveringSegments(in, m, {}), in);
}

// A row slice of a piece with whole-row segments reads at most one segment
// more at each end; a column slice of a piece with column blocks reads only
// the blocks it touches.
TEST(SegmentTest, OverheadIsAtMostOneSegmentAtEachEnd) {
  std::mt19937_64 rng(5);
  for (int iter = 0; iter < 500; ++iter) {
    const Shape shape{1 + rng() % 300, 1 + rng() % 300};
    const SegmentShape seg = ChooseSegmentShape(shape, 2, 1024, false);
    const uint64_t r0 = rng() % shape[0], r1 = r0 + 1 + rng() % (shape[0] - r0);
    const MatrixView m = MatrixOf(shape);
    std::vector<MatrixRect> cover = CoveringSegments(
        RectsOfBox(shape, B({r0, 0}, {r1 - r0, shape[1]})), m, seg);
    uint64_t read = 0;
    for (const MatrixRect& r : cover) {
      read += (r.row_end - r.row_begin) * (r.col_end - r.col_begin) * 2;
    }
    const uint64_t want = (r1 - r0) * shape[1] * 2;
    const uint64_t seg_bytes = seg.rows * seg.cols * 2;
    ASSERT_LE(read, want + 2 * seg_bytes) << iter;
    const SegmentShape split = ChooseSegmentShape(shape, 2, 1024, true);
    const uint64_t c0 = rng() % shape[1], c1 = c0 + 1 + rng() % (shape[1] - c0);
    cover = CoveringSegments(RectsOfBox(shape, B({0, c0}, {shape[0], c1 - c0})),
                             m, split);
    read = 0;
    for (const MatrixRect& r : cover) {
      read += (r.row_end - r.row_begin) * (r.col_end - r.col_begin);
    }
    ASSERT_LE(read, shape[0] * (c1 - c0 + 2 * split.cols)) << iter;
  }
}

// ------------------------------------------------------------- layouts

const ModelDims kLlamaDims{32, 8, 0, 0};

TEST(LayoutTest, ClassifiesHfNames) {
  EXPECT_EQ(ClassifyHfTensor("model.layers.0.self_attn.q_proj.weight"),
            ShardKind::kColumn);
  EXPECT_EQ(ClassifyHfTensor("model.layers.0.self_attn.k_proj.bias"),
            ShardKind::kColumn);
  EXPECT_EQ(ClassifyHfTensor("model.layers.0.self_attn.o_proj.weight"),
            ShardKind::kRow);
  EXPECT_EQ(ClassifyHfTensor("model.layers.0.self_attn.o_proj.bias"),
            ShardKind::kReplicated);
  EXPECT_EQ(ClassifyHfTensor("model.layers.3.mlp.down_proj.weight"),
            ShardKind::kRow);
  EXPECT_EQ(ClassifyHfTensor("model.layers.3.mlp.up_proj.weight"),
            ShardKind::kColumn);
  EXPECT_EQ(ClassifyHfTensor("model.embed_tokens.weight"), ShardKind::kVocab);
  EXPECT_EQ(ClassifyHfTensor("lm_head.weight"), ShardKind::kVocab);
  EXPECT_EQ(ClassifyHfTensor("model.norm.weight"), ShardKind::kReplicated);
  EXPECT_EQ(ClassifyHfTensor("model.layers.0.self_attn.q_norm.weight"),
            ShardKind::kReplicated);
  EXPECT_EQ(ClassifyHfTensor("model.layers.0.block_sparse_moe.gate.weight"),
            ShardKind::kReplicated);
  EXPECT_EQ(
      ClassifyHfTensor("model.layers.0.block_sparse_moe.experts.3.w1.weight"),
      ShardKind::kColumn);
  EXPECT_EQ(
      ClassifyHfTensor("model.layers.0.block_sparse_moe.experts.3.w2.weight"),
      ShardKind::kRow);
}

TEST(LayoutTest, TpBoxesTileColumnAndRowParallel) {
  for (uint32_t tp : {1u, 2u, 4u, 8u}) {
    for (const char* name : {"model.layers.0.mlp.gate_proj.weight",
                             "model.layers.0.mlp.down_proj.weight",
                             "model.layers.0.self_attn.q_proj.bias"}) {
      const Shape shape =
          std::string(name).ends_with("bias") ? Shape{91} : Shape{91, 37};
      std::vector<Box> boxes;
      for (uint32_t r = 0; r < tp; ++r) {
        boxes.push_back(*TpRankBox(name, shape, r, tp));
      }
      EXPECT_TRUE(CheckTiling(name, shape, Pieces(boxes)).ok()) << name << tp;
    }
  }
  Box o =
      *TpRankBox("model.layers.0.self_attn.o_proj.weight", Shape{64, 64}, 1, 4);
  EXPECT_EQ(o, B({0, 16}, {64, 16}));
  Box n = *TpRankBox("model.norm.weight", Shape{64}, 3, 4);
  EXPECT_EQ(n, B({0}, {64}));
}

TEST(LayoutTest, GqaHeadsSplitOrReplicate) {
  // 8 kv heads of 128 rows: TP 4 gives 2 heads per rank.
  EXPECT_EQ(*TpRankBox("l.self_attn.k_proj.weight", Shape{1024, 4096}, 1, 4,
                       kLlamaDims),
            B({256, 0}, {256, 4096}));
  // 2 kv heads, TP 8: each head on 4 ranks.
  const ModelDims two{16, 2, 0, 0};
  for (uint32_t r = 0; r < 8; ++r) {
    EXPECT_EQ(
        *TpRankBox("l.self_attn.v_proj.weight", Shape{256, 2048}, r, 8, two),
        B({r < 4 ? 0u : 128u, 0}, {128, 2048}))
        << r;
  }
  // Heads that do not divide are refused with the tensor's name.
  Result<Box> bad = TpRankBox("l.self_attn.k_proj.weight", Shape{384, 2048}, 0,
                              8, ModelDims{16, 3, 0, 0});
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("k_proj"), std::string::npos);
  bad = TpRankBox("l.self_attn.q_proj.weight", Shape{12 * 64, 64}, 0, 8,
                  ModelDims{12, 4, 0, 0});
  EXPECT_FALSE(bad.ok());
  EXPECT_FALSE(TpRankBox("x.weight", Shape{4}, 4, 4).ok());
}

TEST(LayoutTest, VocabIsPaddedTo64AsVllmDoes) {
  // 1000 rows pad to 1024; TP 4: 256 per rank; the last rank gets 232.
  EXPECT_EQ(*TpRankBox("model.embed_tokens.weight", Shape{1000, 8}, 3, 4),
            B({768, 0}, {232, 8}));
  // 100 rows pad to 128; TP 8: 16 per rank; ranks 7 gets [112, 100): none.
  Box last = *TpRankBox("lm_head.weight", Shape{100, 8}, 7, 8);
  EXPECT_EQ(last.Elements(), 0u);
  std::vector<Box> boxes;
  for (uint32_t r = 0; r < 8; ++r) {
    boxes.push_back(*TpRankBox("lm_head.weight", Shape{100, 8}, r, 8));
  }
  EXPECT_TRUE(CheckTiling("lm_head.weight", Shape{100, 8}, Pieces(boxes)).ok());
}

TEST(LayoutTest, ExpertsSplitAcrossEpRanks) {
  const ModelDims moe{8, 8, 0, 8};
  const std::string e5 = "model.layers.0.block_sparse_moe.experts.5.w1.weight";
  EXPECT_EQ(EpRankBox(e5, Shape{14, 8}, 2, 4, moe)->Elements(), 14u * 8u);
  EXPECT_EQ(EpRankBox(e5, Shape{14, 8}, 1, 4, moe)->Elements(), 0u);
  EXPECT_EQ(*EpRankBox("model.layers.0.mlp.experts.gate_up_proj",
                       Shape{8, 4, 6}, 3, 4, moe),
            B({6, 0, 0}, {2, 4, 6}));
  EXPECT_EQ(*EpRankBox("model.norm.weight", Shape{8}, 3, 4, moe), B({0}, {8}));
  EXPECT_FALSE(EpRankBox(e5, Shape{14, 8}, 0, 4, ModelDims{}).ok());
}

TEST(LayoutTest, SplitRangeIsNearEqual) {
  EXPECT_EQ(SplitRange(10, 4, 0), (std::pair<uint64_t, uint64_t>{0, 3}));
  EXPECT_EQ(SplitRange(10, 4, 1), (std::pair<uint64_t, uint64_t>{3, 6}));
  EXPECT_EQ(SplitRange(10, 4, 3), (std::pair<uint64_t, uint64_t>{8, 10}));
  EXPECT_EQ(SplitRange(2, 4, 3), (std::pair<uint64_t, uint64_t>{2, 2}));
  EXPECT_FALSE(TpShards(Shape{4}, 1, 2).ok());
}

// ----------------------------------------------------------- conversion

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// An independent reference: the nearest of all finite values of a format
// (given as a sorted table of (value, bits)), ties to the even encoding.
template <typename T>
T NearestOf(const std::vector<std::pair<double, T>>& table, double x) {
  auto it = std::lower_bound(
      table.begin(), table.end(), x,
      [](const std::pair<double, T>& e, double v) { return e.first < v; });
  if (it == table.begin()) return it->second;
  if (it == table.end()) return std::prev(it)->second;
  const auto lo = *std::prev(it), hi = *it;
  const double dl = x - lo.first, dh = hi.first - x;
  if (dl < dh) return lo.second;
  if (dh < dl) return hi.second;
  return (lo.second & 1) == 0 ? lo.second : hi.second;
}

TEST(ConvertTest, F8E4M3MatchesTheNearestValueRule) {
  // All finite e4m3fn values; 0x7F/0xFF are NaN.
  std::vector<std::pair<double, uint8_t>> table;
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F || b == 0x80) continue;  // NaN; -0 (keep +0)
    table.push_back(
        {F8E4M3ToF32(static_cast<uint8_t>(b)), static_cast<uint8_t>(b)});
  }
  std::sort(table.begin(), table.end());
  auto reference = [&](float f) -> int {
    if (std::isnan(f)) return -1;  // NaN
    // Past 464 (the tie between 448 and 480, which goes to even), inf
    // included: saturates to 448, as torch's cast does.
    uint8_t r =
        std::fabs(f) > 464.0f ? uint8_t{0x7E} : NearestOf(table, std::fabs(f));
    if (std::signbit(f)) r |= 0x80;
    return r;
  };
  auto check = [&](float f) {
    const uint8_t got = F32ToF8E4M3(f);
    const int want = reference(f);
    if (want < 0) {
      ASSERT_EQ(got & 0x7F, 0x7F) << f;
      ASSERT_EQ(got & 0x80, std::signbit(f) ? 0x80 : 0) << f;
    } else {
      ASSERT_EQ(got, want) << f << " bits " << std::hex << Bits(f);
    }
  };
  for (uint32_t b = 0; b < 65536; ++b)
    check(Bf16ToF32(static_cast<uint16_t>(b)));
  for (uint32_t b = 0; b < 65536; ++b)
    check(F16ToF32(static_cast<uint16_t>(b)));
  std::mt19937 rng(11);
  for (int i = 0; i < 1000000; ++i) check(FromBits(rng()));
  // The documented edges.
  EXPECT_EQ(F32ToF8E4M3(448.0f), 0x7E);
  EXPECT_EQ(F32ToF8E4M3(464.0f), 0x7E);  // tie: to even (448)
  EXPECT_EQ(F32ToF8E4M3(464.1f), 0x7E);  // rounds past 448: saturates
  EXPECT_EQ(F32ToF8E4M3(-1e9f), 0xFE);
  EXPECT_EQ(F32ToF8E4M3(-INFINITY), 0xFE);  // no inf in e4m3fn: saturates
  EXPECT_EQ(F32ToF8E4M3(NAN) & 0x7F, 0x7F);
  EXPECT_EQ(F32ToF8E4M3(0x1p-10f), 0x00);  // half the smallest subnormal: even
  EXPECT_EQ(F32ToF8E4M3(0x1.8p-10f), 0x01);
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) continue;
    EXPECT_EQ(F32ToF8E4M3(F8E4M3ToF32(static_cast<uint8_t>(b))), b);
  }
}

TEST(ConvertTest, HalfAndBfloatRoundToNearestEven) {
  // Every F16 and BF16 value survives the round trip through F32.
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    if (!std::isnan(F16ToF32(h))) {
      ASSERT_EQ(F32ToF16(F16ToF32(h)), h) << b;
    }
    if (!std::isnan(Bf16ToF32(h))) {
      ASSERT_EQ(F32ToBf16(Bf16ToF32(h)), h) << b;
    }
  }
  std::vector<std::pair<double, uint16_t>> f16, bf16;
  for (uint32_t b = 0; b < 0x8000; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    if (!std::isnan(F16ToF32(h))) f16.push_back({F16ToF32(h), h});
    if (!std::isnan(Bf16ToF32(h))) bf16.push_back({Bf16ToF32(h), h});
  }
  std::sort(f16.begin(), f16.end());
  std::sort(bf16.begin(), bf16.end());
  std::mt19937 rng(13);
  for (int i = 0; i < 1000000; ++i) {
    const float f = FromBits(rng());
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(f))));
      EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(f))));
      continue;
    }
    const double a = std::fabs(static_cast<double>(f));
    const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
    // F16: beyond 65520 (max + half an ulp) overflows to inf.
    const uint16_t want16 = a >= 65520.0 ? 0x7C00 : NearestOf(f16, a);
    ASSERT_EQ(F32ToF16(f), want16 | sign) << f;
    // BF16's finite range reaches F32's; only inf maps to inf, and values
    // past the largest BF16 by half an ulp or more round to inf.
    const double bmax = Bf16ToF32(0x7F7F), half_ulp = std::ldexp(1.0, 127 - 8);
    const uint16_t want_b = a >= bmax + half_ulp ? 0x7F80 : NearestOf(bf16, a);
    ASSERT_EQ(F32ToBf16(f), want_b | sign) << f;
  }
}

TEST(ConvertTest, ConvertElementsAndScales) {
  std::vector<uint16_t> bf = {F32ToBf16(1.5f), F32ToBf16(-300.0f),
                              F32ToBf16(0.0f)};
  const float amax =
      AbsMax(DType::kBF16, reinterpret_cast<uint8_t*>(bf.data()), 3);
  EXPECT_EQ(amax, 300.0f);
  const float scale = Fp8Scale(amax);
  std::vector<uint8_t> q(3);
  ConvertElements(DType::kBF16, DType::kF8E4M3,
                  reinterpret_cast<uint8_t*>(bf.data()), q.data(), 3, scale);
  EXPECT_EQ(q[1], F32ToF8E4M3(-300.0f / scale));
  EXPECT_EQ(q[1], 0xFE);  // -448
  EXPECT_EQ(q[2], 0x00);
  EXPECT_EQ(Fp8Scale(0.0f), 1e-12f / 448.0f);
  std::vector<float> f(3);
  ConvertElements(DType::kBF16, DType::kF32,
                  reinterpret_cast<uint8_t*>(bf.data()),
                  reinterpret_cast<uint8_t*>(f.data()), 3);
  EXPECT_EQ(f[0], 1.5f);
  EXPECT_TRUE(CheckConversion(DType::kBF16, DType::kF16, "w").ok());
  EXPECT_TRUE(CheckConversion(DType::kI32, DType::kI32, "w").ok());
  Status s = CheckConversion(DType::kI32, DType::kF32, "tensor 'w'");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("I32 to F32"), std::string::npos);
  EXPECT_FALSE(CheckConversion(DType::kF8E4M3, DType::kBF16, "w").ok());
}

// ------------------------------------------------- manifests with pieces

// Rank r's FSDP rows of "w" (shape [6, 4], F32) plus, on rank 0, "n".
struct Shards {
  std::vector<std::vector<float>> rows;
  std::vector<float> n = std::vector<float>(4, 1.0f);
};

Result<PartLayout> FsdpPart(Shards& s, uint32_t rank, uint32_t k,
                            Shape offset_override = {}) {
  const Shape global{6, 4};
  const Box box = FsdpShards(global, k)[rank];
  s.rows.resize(k);
  s.rows[rank].resize(box.Elements());
  for (size_t i = 0; i < s.rows[rank].size(); ++i) {
    s.rows[rank][i] = static_cast<float>(box.offset[0] * 4 + i);
  }
  std::vector<TensorRef> refs;
  refs.push_back({{"w", DType::kF32, box.extent},
                  s.rows[rank].data(),
                  box.Elements() * 4,
                  MemoryLocation::Host()});
  if (rank == 0)
    refs.push_back(
        {{"n", DType::kF32, {4}}, s.n.data(), 16, MemoryLocation::Host()});
  PieceOptions opts;
  opts.pieces["w"] = {global,
                      offset_override.empty() ? box.offset : offset_override};
  opts.segment_bytes = 32;
  return BuildPartLayout(
      rank, refs, kMinChunkBytes, ChunkChecksum::kXxh3,
      [](std::span<const iovec> p) -> Result<uint64_t> {
        return Xxh3Pieces(p);
      },
      opts);
}

TEST(ManifestGeometryTest, ShardsTileAndCarrySegments) {
  Shards s;
  std::vector<PartLayout> parts = {*FsdpPart(s, 0, 2), *FsdpPart(s, 1, 2)};
  const Manifest m(2, kMinChunkBytes, parts);
  ASSERT_TRUE(m.Validate().ok()) << m.Validate().ToString();
  const TensorLayout& w1 = m.parts()[1].tensors[0];
  EXPECT_EQ(w1.PieceBox(), B({3, 0}, {3, 4}));
  EXPECT_EQ(w1.GlobalShape(), (Shape{6, 4}));
  // 32-byte segments: two rows of 4 floats.
  EXPECT_EQ(w1.seg, (SegmentShape{2, 4}));
  ASSERT_EQ(w1.seg_xxh3.size(), 2u);
  EXPECT_EQ(w1.seg_xxh3[1], Xxh3(s.rows[1].data() + 8, 16));
  // The digest covers the geometry.
  std::vector<PartLayout> moved = parts;
  moved[1].tensors[0].box_offset = {2, 0};
  EXPECT_NE(Manifest(2, kMinChunkBytes, moved).Digest(), m.Digest());
}

TEST(ManifestGeometryTest, GapsOverlapsAndDisagreementsAreRefused) {
  Shards s;
  // Rank 1 claims rows 4..6 instead of 3..6 (its 3 rows then overflow).
  Result<PartLayout> bad = FsdpPart(s, 1, 2, {4, 0});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("outside"), std::string::npos);
  // Three ranks: rank 2's rows moved onto rank 1's.
  std::vector<PartLayout> parts = {*FsdpPart(s, 0, 3), *FsdpPart(s, 1, 3),
                                   *FsdpPart(s, 2, 3, {2, 0})};
  Status st = Manifest(3, kMinChunkBytes, parts).Validate();
  EXPECT_NE(st.message().find("overlap"), std::string::npos) << st.ToString();
  EXPECT_TRUE(CheckPiecesTile(parts, /*complete=*/false).code() ==
              StatusCode::kInvalidArgument);
  // Only two of three ranks: a gap.
  parts = {*FsdpPart(s, 0, 3), *FsdpPart(s, 1, 3)};
  parts[1].rank = 1;
  st = CheckPiecesTile(parts);
  EXPECT_NE(st.message().find("no part covers [4:6, 0:4]"), std::string::npos)
      << st.ToString();
  EXPECT_TRUE(CheckPiecesTile(parts, /*complete=*/false).ok());
  // Another global shape for the same name.
  parts = {*FsdpPart(s, 0, 2), *FsdpPart(s, 1, 2)};
  parts[1].tensors[0].global_shape = {7, 4};
  st = Manifest(2, kMinChunkBytes, parts).Validate();
  EXPECT_NE(st.message().find("global shape"), std::string::npos)
      << st.ToString();
  // Segment checksums that do not match the count.
  parts = {*FsdpPart(s, 0, 2), *FsdpPart(s, 1, 2)};
  parts[0].tensors[0].seg_xxh3.pop_back();
  EXPECT_FALSE(Manifest(2, kMinChunkBytes, parts).Validate().ok());
  // Two unsharded copies of a name in two parts overlap.
  parts = {*FsdpPart(s, 0, 2), *FsdpPart(s, 1, 2)};
  parts[1].tensors.push_back(parts[0].tensors[1]);
  parts[1].tensors.back().offset = parts[1].part_bytes;
  parts[1].part_bytes += 16;
  parts[1].chunk_xxh3 = {0};
  st = Manifest(2, kMinChunkBytes, parts).Validate();
  EXPECT_NE(st.message().find("tensor 'n'"), std::string::npos)
      << st.ToString();
  // A box for a tensor not published.
  std::vector<float> x(4);
  std::vector<TensorRef> refs = {
      {{"x", DType::kF32, {4}}, x.data(), 16, MemoryLocation::Host()}};
  PieceOptions opts;
  opts.pieces["y"] = {{8}, {0}};
  Result<PartLayout> r = BuildPartLayout(
      0, refs, kMinChunkBytes, ChunkChecksum::kXxh3,
      [](std::span<const iovec> p) -> Result<uint64_t> {
        return Xxh3Pieces(p);
      },
      opts);
  EXPECT_FALSE(r.ok());
}

}  // namespace
}  // namespace tensorhub
