// Geometry of logical tensors held as pieces (boxes) by several parts: the
// tiling check the hub runs at commit, box intersection, the byte ranges a
// region occupies in a row-major layout (coalesced, strided rows batched),
// and segment checksums, which let a reader verify a partial read.
//
// Pure functions, no I/O. Every function that takes boxes from the network
// checks them first (CheckBoxInShape) or says that it expects checked ones.
#ifndef TENSORHUB_COMMON_GEOMETRY_H_
#define TENSORHUB_COMMON_GEOMETRY_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensorhub/reshard.h"
#include "tensorhub/status.h"

namespace tensorhub {

// Same rank as `shape`, every range inside it, product of the extents
// representable. The error names `what` (e.g. "tensor 'w' part 3").
Status CheckBoxInShape(const Box& box, std::span<const uint64_t> shape,
                       std::string_view what);

// One piece of a logical tensor: who holds it (a part's rank) and its box.
struct TilePiece {
  uint32_t part = 0;
  Box box;
};

// The pieces tile `shape` exactly: every box in bounds, no two overlap,
// and together they cover every element. The error names the tensor and
// the offending boxes (two overlapping ones, or a box no piece covers).
// Cost: O(n log n + p) for n pieces and p pairs of pieces whose ranges
// overlap along the dimension with the most distinct offsets (for grid
// tilings p is about n times the number of cuts along another dimension);
// locating a gap costs at most 2^20 cells of the pieces' coordinate grid,
// beyond which the error gives the counts only.
Status CheckTiling(std::string_view name, std::span<const uint64_t> shape,
                   std::span<const TilePiece> pieces);

// Whether the pieces overlap one another (no coverage check): what the hub
// can check before the last rank of a group has published.
Status CheckNoOverlap(std::string_view name, std::span<const TilePiece> pieces);

std::optional<Box> Intersect(const Box& a, const Box& b);
bool Contains(const Box& outer, const Box& inner);

// ------------------------------------------------------ Holders of slices
//
// A reader reads bytes of a trainer's piece from a holder of slices (a
// reader that registered boxes of its own, in its own layout) where the
// bytes lie inside one of the holder's boxes and the piece and that box
// both map onto the tensor's matrix view by a shift (MatrixOrigin). The
// reader's plan (client/fetch/slice_plan.h) and the hub's availability rule
// (hub/hub_state.h) both go by these functions, so that the hub counts a
// holder's boxes exactly where a reader can read from them.

// Where the matrix view (MatrixOf) of `box`, a box of a tensor of `shape`,
// starts in the tensor's matrix view, as (row, column), when each row of the
// box's view lies in one row of the tensor's and consecutive rows stay
// consecutive (the view is the tensor's, shifted): always for at most 2
// dimensions; for more, when the box spans the middle dimensions (all but
// the first and the last). nullopt otherwise. Expects a checked box.
std::optional<std::pair<uint64_t, uint64_t>> MatrixOrigin(
    const Box& box, std::span<const uint64_t> shape);

// The most pieces CutAlong cuts one box into.
inline constexpr uint64_t kMaxSliceCuts = 64;

// `box` cut along every boundary of `boxes` inside it, so that each piece
// lies wholly inside or wholly outside each of them; `box` alone if that
// makes more than kMaxSliceCuts pieces. Boxes of another rank are ignored.
std::vector<Box> CutAlong(const Box& box, std::span<const Box> boxes);

// Whether a reader can read every element of `region` (inside the trainer's
// piece `piece` of a tensor of `shape`) from holders of slices with `boxes`:
// the piece maps by a shift, and each piece of `region` cut along the boxes
// that meet it (CutAlong) lies inside one of them that maps by a shift. An
// empty region needs nothing. O(boxes x rank x log) plus kMaxSliceCuts
// containment tests per box.
bool SliceHoldersCover(const Box& piece, const Box& region,
                       std::span<const Box> boxes,
                       std::span<const uint64_t> shape);

// `count` runs of `run_bytes`, run i at src_offset + i * src_stride in the
// source layout and dst_offset + i * dst_stride in the destination layout.
struct StridedRun {
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t run_bytes = 0;
  uint64_t count = 1;
  uint64_t src_stride = 0;
  uint64_t dst_stride = 0;
  uint64_t bytes() const { return run_bytes * count; }
  bool operator==(const StridedRun&) const = default;
};

// Where the elements of `region` lie in a row-major layout of `src_box` and
// in one of `dst_box` (global coordinates; `region` must lie inside both,
// checked). Offsets are bytes from the start of each box's layout.
// Trailing dimensions that are whole in region, source and destination are
// merged into one run; the next dimension becomes the batch (`count` rows
// at a fixed stride), extended over outer dimensions while the batch
// dimension is whole in both layouts; the remaining outer dimensions give
// one StridedRun each. A column slice of a row-major matrix is thus one
// StridedRun of `rows` runs, a row slice one contiguous run.
std::vector<StridedRun> PlanCopy(const Box& region, const Box& src_box,
                                 const Box& dst_box, uint64_t elem_bytes);

// ------------------------------------------------------------ Segments
//
// A stored piece of shape (d0, ..., dn-1) is viewed as a matrix of
// rows = d0 * ... * dn-2 (1 for n <= 1) and cols = dn-1 (1 for n = 0).
// Its segments are tiles of `rows` x `cols` elements of that matrix (the
// last ones in each direction shorter), numbered row-block major; each has
// an XXH3-64 checksum of its bytes taken row by row. With cols equal to the
// matrix's, a segment is a contiguous range of whole rows: a row slice
// (dim 0) reads at most one extra segment at each end. Tensors a reader
// cuts along the last dimension (row-parallel weights) get narrower tiles
// (a column block of 1/8 of the width), so a column slice reads only the
// column blocks it touches.
struct SegmentShape {
  uint64_t rows = 0;  // 0: the piece has no segment checksums
  uint64_t cols = 0;
  bool operator==(const SegmentShape&) const = default;
};

// Target bytes of one segment by default, and bounds on what a manifest
// may claim (a hub checks them).
inline constexpr uint64_t kDefaultSegmentBytes = 64 << 10;
inline constexpr uint64_t kMinSegmentBytes = 256;
inline constexpr uint64_t kMaxSegmentBytes = 64ull << 20;
// Column blocks of a tensor cut along its last dimension.
inline constexpr uint64_t kSegmentColumnBlocks = 8;

struct MatrixView {
  uint64_t rows = 1;
  uint64_t cols = 1;
};
MatrixView MatrixOf(std::span<const uint64_t> shape);

// The tile shape for a piece of `shape`: about `segment_bytes` per tile,
// whole rows unless `split_cols`, then a column block of ceil(cols / 8)
// (at least one element; never wider than segment_bytes).
SegmentShape ChooseSegmentShape(std::span<const uint64_t> shape,
                                uint64_t elem_bytes, uint64_t segment_bytes,
                                bool split_cols);
// Checks a claimed tile shape (from the network): both nonzero or both
// zero, tiles of at most kMaxSegmentBytes and at least one element, and
// not so many tiles that the count overflows.
Status CheckSegmentShape(std::span<const uint64_t> shape, uint64_t elem_bytes,
                         const SegmentShape& seg, std::string_view what);
uint64_t NumSegments(std::span<const uint64_t> shape, const SegmentShape& seg);

// The checksum of every segment of a piece whose bytes start at `data`.
std::vector<uint64_t> SegmentChecksums(const uint8_t* data,
                                       std::span<const uint64_t> shape,
                                       uint64_t elem_bytes,
                                       const SegmentShape& seg);

// A rectangle of the matrix view: rows [row_begin, row_end) x columns
// [col_begin, col_end).
struct MatrixRect {
  uint64_t row_begin = 0, row_end = 0;
  uint64_t col_begin = 0, col_end = 0;
  bool operator==(const MatrixRect&) const = default;
};

// The rectangles of the matrix view of a piece of shape `piece_shape` that a
// box (in the piece's own coordinates) covers: consecutive rows merged.
std::vector<MatrixRect> RectsOfBox(std::span<const uint64_t> piece_shape,
                                   const Box& local_box);

// What to read to verify `rects`: each rectangle grown to whole segments,
// overlapping or touching grown rectangles with the same columns merged.
// With seg.rows == 0 (no checksums) the rectangles come back unchanged.
std::vector<MatrixRect> CoveringSegments(std::span<const MatrixRect> rects,
                                         MatrixView matrix,
                                         const SegmentShape& seg);

// The segment ids a segment-aligned rectangle consists of, row-block
// major: (row block b, column block c) has id b * column_blocks + c.
std::vector<uint64_t> SegmentIdsOf(const MatrixRect& aligned, MatrixView matrix,
                                   const SegmentShape& seg);

}  // namespace tensorhub

#endif  // TENSORHUB_COMMON_GEOMETRY_H_
