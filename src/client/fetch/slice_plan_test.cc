// PlanSlices, the pure planner of a fetch of slices: seeded random boxes x
// layouts (pieces cut along any dimension, grids, segment shapes) x holders
// of slices, each plan checked by walking it element by element: every
// wanted element read exactly once, every read segment-aligned and within
// the bounds of a strided request, the chunks each read spans right, and
// an alternative read from every holder of slices whose box holds an
// item's wanted bytes where the piece and the box map onto the tensor by a
// shift (MatrixOrigin: any box of at most 2 dimensions, boxes spanning the
// middle dimensions of more), reading exactly the same elements, and none
// where they do not. Plus the planner's refusals, by code.
#include "client/fetch/slice_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/geometry.h"
#include "wire/frame.h"

namespace tensorhub::client {
namespace {

using Coord = std::vector<uint64_t>;

uint64_t RandIn(std::mt19937& rng, uint64_t lo, uint64_t hi) {  // [lo, hi]
  return lo + rng() % (hi - lo + 1);
}

// A random box inside `shape` with every extent >= 1.
Box RandomBox(std::mt19937& rng, const std::vector<uint64_t>& shape) {
  Box b;
  for (uint64_t d : shape) {
    const uint64_t lo = RandIn(rng, 0, d - 1);
    const uint64_t hi = RandIn(rng, lo + 1, d);
    b.offset.push_back(lo);
    b.extent.push_back(hi - lo);
  }
  return b;
}

// `cuts` sorted distinct interior points of [0, d).
std::vector<uint64_t> Cuts(std::mt19937& rng, uint64_t d, uint32_t pieces) {
  std::set<uint64_t> c{0, d};
  while (c.size() < pieces + 1) c.insert(RandIn(rng, 1, d - 1));
  return {c.begin(), c.end()};
}

// The boxes a tensor of `shape` is published as, one per part: cut along
// one dimension, or (4 parts, 2+ dimensions) a 2 x 2 grid.
std::vector<Box> RandomTiling(std::mt19937& rng,
                              const std::vector<uint64_t>& shape,
                              uint32_t parts) {
  std::vector<Box> out;
  const size_t n = shape.size();
  if (parts == 4 && n >= 2 && shape[0] >= 2 && shape[n - 1] >= 2 &&
      rng() % 2 == 0) {
    const std::vector<uint64_t> r = Cuts(rng, shape[0], 2);
    const std::vector<uint64_t> c = Cuts(rng, shape[n - 1], 2);
    for (size_t i = 0; i < 2; ++i) {
      for (size_t j = 0; j < 2; ++j) {
        Box b = Box::Whole(shape);
        b.offset[0] = r[i];
        b.extent[0] = r[i + 1] - r[i];
        b.offset[n - 1] = c[j];
        b.extent[n - 1] = c[j + 1] - c[j];
        out.push_back(b);
      }
    }
    return out;
  }
  std::vector<size_t> dims;
  for (size_t k = 0; k < n; ++k) {
    if (shape[k] >= parts) dims.push_back(k);
  }
  const size_t dim = dims[rng() % dims.size()];
  const std::vector<uint64_t> cut = Cuts(rng, shape[dim], parts);
  for (uint32_t p = 0; p < parts; ++p) {
    Box b = Box::Whole(shape);
    b.offset[dim] = cut[p];
    b.extent[dim] = cut[p + 1] - cut[p];
    out.push_back(b);
  }
  return out;
}

TensorRef RefOf(const std::string& name, DType dtype,
                const std::vector<uint64_t>& shape, std::vector<uint8_t>& mem) {
  TensorRef r;
  r.spec = {name, dtype, shape};
  r.bytes = DTypeBytes(dtype);
  for (uint64_t d : shape) r.bytes *= d;
  mem.assign(r.bytes, 0x5a);
  r.data = mem.data();
  return r;
}

Result<PartLayout> Layout(uint32_t rank, const std::vector<TensorRef>& refs,
                          uint64_t chunk_bytes, const PieceOptions& po) {
  ChunkHasher hash = [](std::span<const iovec> pieces) -> Result<uint64_t> {
    return ChunkSum(ChunkChecksum::kXxh3, pieces);
  };
  return BuildPartLayout(rank, refs, chunk_bytes, ChunkChecksum::kXxh3, hash,
                         po);
}

// The global coordinates of (row r, column c) of the matrix view of a
// piece `t` (its leading dimensions unravelled from r).
Coord GlobalOf(const TensorLayout& t, uint64_t r, uint64_t c) {
  const Box piece = t.PieceBox();
  const size_t n = piece.rank();
  Coord g(n, 0);
  if (n == 0) return g;
  g[n - 1] = c;
  for (size_t k = n - 1; k-- > 0;) {
    g[k] = r % piece.extent[k];
    r /= piece.extent[k];
  }
  for (size_t k = 0; k < n; ++k) g[k] += piece.offset[k];
  return g;
}

// The global elements an item (or an alternative) delivers.
std::set<Coord> Wanted(const SliceItem& it, const TensorLayout& t) {
  std::set<Coord> out;
  for (const auto& [b, e] : it.rows) {
    for (uint64_t r = b; r < e; ++r) {
      for (uint64_t c = it.col_begin; c < it.col_end; ++c) {
        out.insert(GlobalOf(t, r, c));
      }
    }
  }
  return out;
}

// The checks every read of a plan must pass, against the layout it reads.
void CheckRead(const SliceItem& it, const TensorLayout& t,
               const std::string& what) {
  SCOPED_TRACE(what);
  const MatrixView m = MatrixOf(t.spec.shape);
  const MatrixRect& rd = it.read;
  ASSERT_LT(rd.row_begin, rd.row_end);
  ASSERT_LE(rd.row_end, m.rows);
  ASSERT_LT(rd.col_begin, rd.col_end);
  ASSERT_LE(rd.col_end, m.cols);
  // Whole segments, so that each one read can be verified.
  ASSERT_GT(t.seg.rows, 0u);
  EXPECT_EQ(rd.row_begin % t.seg.rows, 0u);
  EXPECT_TRUE(rd.row_end % t.seg.rows == 0 || rd.row_end == m.rows);
  EXPECT_EQ(rd.col_begin % t.seg.cols, 0u);
  EXPECT_TRUE(rd.col_end % t.seg.cols == 0 || rd.col_end == m.cols);
  // One strided request.
  EXPECT_LE(rd.row_end - rd.row_begin,
            std::max<uint64_t>(t.seg.rows, wire::kMaxStridedRuns));
  EXPECT_EQ(it.bytes, (rd.row_end - rd.row_begin) *
                          (rd.col_end - rd.col_begin) *
                          DTypeBytes(t.spec.dtype));
  // What is wanted lies in what is read: sorted disjoint row intervals.
  ASSERT_FALSE(it.rows.empty());
  uint64_t last = rd.row_begin;
  for (const auto& [b, e] : it.rows) {
    EXPECT_LE(last, b);
    EXPECT_LT(b, e);
    last = e;
  }
  EXPECT_LE(last, rd.row_end);
  EXPECT_LE(rd.col_begin, it.col_begin);
  EXPECT_LT(it.col_begin, it.col_end);
  EXPECT_LE(it.col_end, rd.col_end);
}

struct Scenario {
  Manifest manifest;
  std::vector<SliceDest> dests;
  std::vector<FetchSource> sources;
  std::vector<std::vector<uint8_t>> memory;  // backs every TensorRef
};

// A version of 2 or 3 logical tensors over 1-4 parts, a few boxes of them
// wanted, 0-2 holders of slices with a box of some tensors each.
Scenario MakeScenario(std::mt19937& rng) {
  Scenario s;
  s.memory.reserve(64);
  const uint32_t parts = static_cast<uint32_t>(RandIn(rng, 1, 4));
  const uint64_t chunk_bytes = kMinChunkBytes << RandIn(rng, 0, 1);
  const uint64_t seg_bytes = uint64_t{256} << RandIn(rng, 0, 4);
  const DType dtype = rng() % 2 ? DType::kF32 : DType::kBF16;
  struct Logical {
    std::string name;
    std::vector<uint64_t> shape;
    std::vector<Box> pieces;
  };
  std::vector<Logical> logical;
  // A row-parallel weight (segments cut into column blocks), a 1-D and a
  // 3-D tensor, in random sizes.
  logical.push_back({"model.layers.0.mlp.down_proj.weight",
                     {RandIn(rng, 4, 40), RandIn(rng, 4, 40)},
                     {}});
  logical.push_back({"bias", {RandIn(rng, 4, 300)}, {}});
  if (rng() % 2) {
    logical.push_back(
        {"cube",
         {RandIn(rng, 4, 9), RandIn(rng, 1, 6), RandIn(rng, 4, 12)},
         {}});
  }
  for (Logical& l : logical) l.pieces = RandomTiling(rng, l.shape, parts);
  std::vector<PartLayout> layouts;
  for (uint32_t p = 0; p < parts; ++p) {
    std::vector<TensorRef> refs;
    PieceOptions po;
    po.segment_bytes = seg_bytes;
    for (const Logical& l : logical) {
      s.memory.emplace_back();
      refs.push_back(RefOf(l.name, dtype, l.pieces[p].extent, s.memory.back()));
      po.pieces[l.name] = TensorPiece{l.shape, l.pieces[p].offset};
    }
    Result<PartLayout> part = Layout(p, refs, chunk_bytes, po);
    EXPECT_TRUE(part.ok()) << part.status().ToString();
    layouts.push_back(*part);
  }
  s.manifest = Manifest(parts, chunk_bytes, layouts);
  EXPECT_TRUE(s.manifest.Validate().ok());
  for (size_t i = 0; i < logical.size(); ++i) {
    if (i > 0 && rng() % 3 == 0) continue;
    const Box box = rng() % 5 == 0 ? Box::Whole(logical[i].shape)
                                   : RandomBox(rng, logical[i].shape);
    s.memory.emplace_back(box.Elements() * DTypeBytes(dtype));
    s.dests.push_back(
        {logical[i].name, box, dtype, s.memory.back().data(), {}});
  }
  s.sources.push_back(
      {"trainer", "trainer:1", 1, {{0, s.manifest.num_chunks()}}});
  const uint32_t holders = static_cast<uint32_t>(RandIn(rng, 0, 2));
  for (uint32_t h = 0; h < holders; ++h) {
    std::vector<TensorRef> refs;
    PieceOptions po;
    po.segment_bytes = uint64_t{256} << RandIn(rng, 0, 4);
    for (const Logical& l : logical) {
      if (rng() % 3 == 0) continue;
      const Box box = RandomBox(rng, l.shape);
      s.memory.emplace_back();
      refs.push_back(RefOf(l.name, dtype, box.extent, s.memory.back()));
      po.pieces[l.name] = TensorPiece{l.shape, box.offset};
    }
    if (refs.empty()) continue;
    Result<PartLayout> layout =
        Layout(wire::kSliceHolderPart, refs, chunk_bytes, po);
    EXPECT_TRUE(layout.ok()) << layout.status().ToString();
    FetchSource src;
    src.worker = "holder" + std::to_string(h);
    src.address = src.worker + ":1";
    src.epoch = 7 + h;
    src.slices = std::make_shared<const PartLayout>(*layout);
    s.sources.push_back(std::move(src));
  }
  return s;
}

// Checks `plan` for `s` element by element (see the file comment).
void CheckPlan(const Scenario& s, const SlicePlan& plan) {
  const uint64_t elem =
      DTypeBytes(s.dests.empty() ? DType::kF32 : s.dests[0].dtype);
  std::vector<std::map<Coord, int>> got(s.dests.size());
  uint64_t read_bytes = 0;
  for (size_t i = 0; i < plan.items.size(); ++i) {
    const SliceItem& it = plan.items[i];
    SCOPED_TRACE("item " + std::to_string(i));
    ASSERT_LT(it.part, s.manifest.parts().size());
    ASSERT_LT(it.dest, s.dests.size());
    const TensorLayout& t = s.manifest.parts()[it.part].tensors.at(it.tensor);
    const SliceDest& d = s.dests[it.dest];
    ASSERT_EQ(t.spec.name, d.name);
    CheckRead(it, t, "from the trainer part");
    if (i > 0) {
      const SliceItem& prev = plan.items[i - 1];
      EXPECT_LE(std::tie(prev.part, prev.chunk_first),
                std::tie(it.part, it.chunk_first));
    }
    // The chunks the read's byte range spans.
    const MatrixView m = MatrixOf(t.spec.shape);
    const uint64_t begin =
        t.offset + (it.read.row_begin * m.cols + it.read.col_begin) * elem;
    const uint64_t end =
        t.offset + ((it.read.row_end - 1) * m.cols + it.read.col_end) * elem;
    const uint64_t base = s.manifest.chunk_base(it.part);
    EXPECT_EQ(it.chunk_first, base + begin / s.manifest.chunk_bytes());
    EXPECT_EQ(it.chunk_last, base + (end - 1) / s.manifest.chunk_bytes());
    read_bytes += it.bytes;
    EXPECT_LE(it.bytes, plan.max_item_bytes);
    const std::set<Coord> wanted = Wanted(it, t);
    for (const Coord& g : wanted) {
      Coord local = g;
      bool inside = true;
      for (size_t k = 0; k < g.size(); ++k) {
        inside = inside && g[k] >= d.box.offset[k] &&
                 g[k] < d.box.offset[k] + d.box.extent[k];
      }
      ASSERT_TRUE(inside) << "an item delivers an element outside its box";
      ++got[it.dest][local];
    }
    // Alternatives: one per holder at most, the same elements exactly.
    std::set<uint32_t> holders;
    for (const SliceItem& a : it.alts) {
      ASSERT_LT(a.part, plan.holders.size());
      EXPECT_TRUE(holders.insert(a.part).second);
      EXPECT_TRUE(a.alts.empty());
      const TensorLayout& ht =
          plan.holders[a.part].layout->tensors.at(a.tensor);
      EXPECT_EQ(ht.spec.name, d.name);
      CheckRead(a, ht, "from holder of slices " + plan.holders[a.part].worker);
      EXPECT_LE(a.bytes, plan.max_item_bytes);
      EXPECT_EQ(Wanted(a, ht), wanted);
    }
    // Every holder whose box holds the wanted elements has one, where the
    // piece and its box map onto the tensor by a shift; none where not.
    const std::vector<uint64_t> global = t.GlobalShape();
    const bool piece_maps = MatrixOrigin(t.PieceBox(), global).has_value();
    for (uint32_t h = 0; h < plan.holders.size(); ++h) {
      for (const TensorLayout& ht : plan.holders[h].layout->tensors) {
        if (ht.spec.name != d.name) continue;
        const Box hb = ht.PieceBox();
        const bool holds =
            std::all_of(wanted.begin(), wanted.end(), [&](const Coord& g) {
              for (size_t k = 0; k < g.size(); ++k) {
                if (g[k] < hb.offset[k] || g[k] >= hb.offset[k] + hb.extent[k])
                  return false;
              }
              return true;
            });
        const bool maps = piece_maps && MatrixOrigin(hb, global).has_value();
        if (!maps) {
          EXPECT_EQ(holders.count(h), 0u);
        } else if (holds) {
          EXPECT_EQ(holders.count(h), 1u)
              << "no alternative read from " << plan.holders[h].worker;
        }
      }
    }
  }
  EXPECT_EQ(plan.read_bytes, read_bytes);
  uint64_t wanted_bytes = 0;
  for (size_t di = 0; di < s.dests.size(); ++di) {
    const SliceDest& d = s.dests[di];
    wanted_bytes += d.box.Elements() * elem;
    EXPECT_EQ(got[di].size(), d.box.Elements())
        << d.name << ": elements missed";
    for (const auto& [g, n] : got[di]) {
      ASSERT_EQ(n, 1) << d.name << ": an element read " << n << " times";
    }
  }
  EXPECT_EQ(plan.wanted_bytes, wanted_bytes);
}

// Sources as the run sees them: the trainer part's holder gets every item,
// a holder of slices the items with an alternative read from it.
void CheckSourcesForItems(const Scenario& s, const SlicePlan& plan) {
  const std::vector<FetchSource> mapped = SourcesForItems(plan, s.sources);
  ASSERT_EQ(mapped.size(), s.sources.size());
  for (const FetchSource& src : mapped) {
    std::set<uint64_t> items;
    for (const auto& [b, e] : src.chunks) {
      for (uint64_t i = b; i < e; ++i) EXPECT_TRUE(items.insert(i).second);
    }
    for (uint64_t i = 0; i < plan.items.size(); ++i) {
      bool expect = !src.slices;
      for (const SliceItem& a : plan.items[i].alts) {
        expect = expect || plan.holders[a.part].worker == src.worker;
      }
      EXPECT_EQ(items.count(i), expect ? 1u : 0u)
          << src.worker << " item " << i;
    }
  }
}

TEST(SlicePlanTest, RandomBoxesLayoutsAndHoldersOfSlices) {
  int with_alts = 0, cube_alts = 0;
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const Scenario s = MakeScenario(rng);
    const uint64_t item_bytes = uint64_t{512} << RandIn(rng, 0, 4);
    Result<SlicePlan> plan =
        PlanSlices(s.manifest, s.dests, item_bytes, s.sources);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ASSERT_EQ(plan->holders.size(), s.sources.size() - 1);
    CheckPlan(s, *plan);
    CheckSourcesForItems(s, *plan);
    if (HasFatalFailure()) return;
    for (const SliceItem& it : plan->items) {
      with_alts += !it.alts.empty();
      cube_alts +=
          !it.alts.empty() &&
          s.manifest.parts()[it.part].tensors[it.tensor].spec.name == "cube";
    }
  }
  // The scenarios reach the holders of slices, not only the trainer parts,
  // for 3-dimensional tensors too.
  EXPECT_GT(with_alts, 100);
  EXPECT_GT(cube_alts, 10);
}

// Segments of whole rows: a column slice reads whole rows, in items of
// about item_bytes.
TEST(SlicePlanTest, AColumnSliceReadsWholeSegmentRowsInBlocks) {
  std::vector<uint8_t> mem, out;
  TensorRef t = RefOf("w", DType::kF32, {64, 256}, mem);
  PieceOptions po;
  po.segment_bytes = 1024;  // 256 columns x 4 bytes: whole rows
  Result<PartLayout> part = Layout(0, {t}, kMinChunkBytes, po);
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  const Manifest m(1, kMinChunkBytes, {*part});
  out.resize(64 * 16 * 4);
  const std::vector<SliceDest> dests{
      {"w", Box{{0, 32}, {64, 16}}, DType::kF32, out.data(), {}}};
  Result<SlicePlan> plan = PlanSlices(m, dests, 16 << 10);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  // Segments are whole rows: each item reads whole rows (1 KiB each) and
  // wants 16 columns of them; 16 KiB items hold 16 rows.
  ASSERT_EQ(plan->items.size(), 4u);
  for (const SliceItem& it : plan->items) {
    EXPECT_EQ(it.read.row_end - it.read.row_begin, 16u);
    EXPECT_EQ(it.col_begin, 32u);
    EXPECT_EQ(it.col_end, 48u);
  }
  EXPECT_EQ(plan->wanted_bytes, 64u * 16 * 4);
  EXPECT_EQ(plan->read_bytes, 64u * 256 * 4);
}

TEST(SlicePlanTest, RefusesWhatItCannotPlan) {
  std::vector<uint8_t> mem, out(64);
  TensorRef t = RefOf("w", DType::kF32, {8, 8}, mem);
  PieceOptions none;
  none.segment_bytes = 0;
  Result<PartLayout> bare = Layout(0, {t}, kMinChunkBytes, none);
  ASSERT_TRUE(bare.ok());
  const Manifest unsegmented(1, kMinChunkBytes, {*bare});
  const SliceDest ok{"w", Box{{0, 0}, {4, 4}}, DType::kF32, out.data(), {}};
  Result<SlicePlan> r = PlanSlices(unsegmented, {ok}, kMinChunkBytes);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition)
      << r.status().ToString();

  PieceOptions seg;
  seg.segment_bytes = 256;
  Result<PartLayout> part = Layout(0, {t}, kMinChunkBytes, seg);
  ASSERT_TRUE(part.ok());
  const Manifest m(1, kMinChunkBytes, {*part});
  SliceDest unknown = ok;
  unknown.name = "v";
  SliceDest outside = ok;
  outside.box = Box{{6, 0}, {4, 4}};
  SliceDest no_memory = ok;
  no_memory.data = nullptr;
  SliceDest no_scales = ok;
  no_scales.dtype = DType::kF8E4M3;
  for (const SliceDest& d : {unknown, outside, no_memory, no_scales}) {
    Result<SlicePlan> bad = PlanSlices(m, {d}, kMinChunkBytes);
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument)
        << bad.status().ToString();
  }
  EXPECT_TRUE(PlanSlices(m, {ok}, kMinChunkBytes).ok());
}

}  // namespace
}  // namespace tensorhub::client
