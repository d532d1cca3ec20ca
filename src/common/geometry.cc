#include "common/geometry.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "common/checksum.h"
#include "tensorhub/check.h"

namespace tensorhub {
namespace {

// a * b, or nullopt on overflow.
std::optional<uint64_t> MulChecked(uint64_t a, uint64_t b) {
  uint64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

uint64_t CeilDiv(uint64_t a, uint64_t b) {
  return a == 0 ? 0 : (a - 1) / b + 1;
}

// Row-major strides (in elements) of a layout of `extent`.
std::vector<uint64_t> Strides(const std::vector<uint64_t>& extent) {
  std::vector<uint64_t> s(extent.size(), 1);
  for (size_t i = extent.size(); i-- > 1;) s[i - 1] = s[i] * extent[i];
  return s;
}

std::string ShapeString(std::span<const uint64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return out + "]";
}

std::string PieceName(const TilePiece& p) {
  return "part " + std::to_string(p.part) + " " + BoxToString(p.box);
}

// The first cell of the pieces' coordinate grid that no piece covers, if
// the grid is small enough to search.
std::optional<Box> FindGap(std::span<const uint64_t> shape,
                           std::span<const TilePiece> pieces) {
  const size_t n = shape.size();
  std::vector<std::vector<uint64_t>> cuts(n);
  uint64_t cells = 1;
  for (size_t d = 0; d < n; ++d) {
    cuts[d] = {0, shape[d]};
    for (const TilePiece& p : pieces) {
      cuts[d].push_back(p.box.offset[d]);
      cuts[d].push_back(p.box.offset[d] + p.box.extent[d]);
    }
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
    std::optional<uint64_t> c = MulChecked(cells, cuts[d].size() - 1);
    if (!c.has_value()) return std::nullopt;
    cells = *c;
  }
  if (cells == 0 || cells * std::max<size_t>(1, pieces.size()) > (1u << 24)) {
    return std::nullopt;
  }
  std::vector<size_t> idx(n, 0);
  for (uint64_t cell = 0; cell < cells; ++cell) {
    Box b;
    for (size_t d = 0; d < n; ++d) {
      b.offset.push_back(cuts[d][idx[d]]);
      b.extent.push_back(cuts[d][idx[d] + 1] - cuts[d][idx[d]]);
    }
    bool covered = false;
    for (const TilePiece& p : pieces) {
      if (Contains(p.box, b)) {
        covered = true;
        break;
      }
    }
    if (!covered) return b;
    for (size_t d = n; d-- > 0;) {
      if (++idx[d] + 1 < cuts[d].size()) break;
      idx[d] = 0;
    }
  }
  return std::nullopt;
}

}  // namespace

Status CheckBoxInShape(const Box& box, std::span<const uint64_t> shape,
                       std::string_view what) {
  if (box.offset.size() != box.extent.size() ||
      box.extent.size() != shape.size()) {
    return InvalidArgument(
        std::string(what) + ": box " + BoxToString(box) +
        " does not have the " + std::to_string(shape.size()) +
        " dimensions of the tensor's shape " + ShapeString(shape));
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (box.offset[d] > shape[d] || box.extent[d] > shape[d] - box.offset[d]) {
      return InvalidArgument(std::string(what) + ": box " + BoxToString(box) +
                             " is outside the tensor's shape " +
                             ShapeString(shape) + " in dimension " +
                             std::to_string(d));
    }
  }
  return Status::Ok();
}

std::optional<Box> Intersect(const Box& a, const Box& b) {
  if (a.rank() != b.rank() || a.offset.size() != a.rank() ||
      b.offset.size() != b.rank()) {
    return std::nullopt;
  }
  Box out;
  for (size_t d = 0; d < a.rank(); ++d) {
    const uint64_t lo = std::max(a.offset[d], b.offset[d]);
    const uint64_t hi =
        std::min(a.offset[d] + a.extent[d], b.offset[d] + b.extent[d]);
    if (lo >= hi) return std::nullopt;
    out.offset.push_back(lo);
    out.extent.push_back(hi - lo);
  }
  return out;
}

bool Contains(const Box& outer, const Box& inner) {
  if (outer.rank() != inner.rank()) return false;
  for (size_t d = 0; d < outer.rank(); ++d) {
    if (inner.offset[d] < outer.offset[d] ||
        inner.offset[d] + inner.extent[d] > outer.offset[d] + outer.extent[d]) {
      return false;
    }
  }
  return true;
}

std::optional<std::pair<uint64_t, uint64_t>> MatrixOrigin(
    const Box& box, std::span<const uint64_t> shape) {
  const size_t n = shape.size();
  if (box.rank() != n || box.offset.size() != n) return std::nullopt;
  if (n == 0) return std::make_pair(uint64_t{0}, uint64_t{0});
  if (n == 1) return std::make_pair(uint64_t{0}, box.offset[0]);
  // Rows of the box's view are consecutive rows of the tensor's only if
  // every middle dimension is whole; then row r of the box is row
  // offset[0] * (product of the middle dimensions) + r of the tensor.
  uint64_t middle = 1;
  for (size_t k = 1; k + 1 < n; ++k) {
    if (box.offset[k] != 0 || box.extent[k] != shape[k]) return std::nullopt;
    middle *= shape[k];
  }
  return std::make_pair(box.offset[0] * middle, box.offset[n - 1]);
}

std::vector<Box> CutAlong(const Box& box, std::span<const Box> boxes) {
  const size_t n = box.rank();
  if (n == 0 || boxes.empty()) return {box};
  std::vector<std::vector<uint64_t>> cuts(n);
  uint64_t pieces = 1;
  for (size_t k = 0; k < n; ++k) {
    const uint64_t lo = box.offset[k], hi = lo + box.extent[k];
    std::set<uint64_t> c{lo, hi};
    for (const Box& b : boxes) {
      if (b.rank() != n) continue;
      for (uint64_t x : {b.offset[k], b.offset[k] + b.extent[k]}) {
        if (x > lo && x < hi) c.insert(x);
      }
    }
    cuts[k].assign(c.begin(), c.end());
    pieces *= cuts[k].size() - 1;
    if (pieces > kMaxSliceCuts) return {box};
  }
  std::vector<Box> out;
  std::vector<size_t> idx(n, 0);
  for (;;) {
    Box b;
    for (size_t k = 0; k < n; ++k) {
      b.offset.push_back(cuts[k][idx[k]]);
      b.extent.push_back(cuts[k][idx[k] + 1] - cuts[k][idx[k]]);
    }
    out.push_back(std::move(b));
    size_t k = n;
    while (k > 0 && ++idx[k - 1] + 1 == cuts[k - 1].size()) idx[--k] = 0;
    if (k == 0) return out;
  }
}

bool SliceHoldersCover(const Box& piece, const Box& region,
                       std::span<const Box> boxes,
                       std::span<const uint64_t> shape) {
  if (region.Elements() == 0) return true;
  if (!MatrixOrigin(piece, shape).has_value()) return false;
  std::vector<Box> meeting;
  for (const Box& b : boxes) {
    if (Intersect(region, b).has_value() && MatrixOrigin(b, shape)) {
      meeting.push_back(b);
    }
  }
  for (const Box& cut : CutAlong(region, meeting)) {
    const bool inside =
        std::any_of(meeting.begin(), meeting.end(),
                    [&](const Box& b) { return Contains(b, cut); });
    if (!inside) return false;
  }
  return true;
}

Status CheckNoOverlap(std::string_view name,
                      std::span<const TilePiece> pieces) {
  std::vector<size_t> order;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].box.Elements() > 0) order.push_back(i);
  }
  if (order.size() < 2) return Status::Ok();
  const size_t n = pieces[order[0]].box.rank();
  auto overlap = [&](size_t i, size_t j) {
    return InvalidArgument("tensor '" + std::string(name) +
                           "': " + PieceName(pieces[i]) + " and " +
                           PieceName(pieces[j]) + " overlap");
  };
  if (n == 0) return overlap(order[0], order[1]);
  // Sweep along the dimension with the most distinct offsets: pieces whose
  // ranges along it do not meet cannot overlap.
  size_t dim = 0, best = 0;
  for (size_t d = 0; d < n; ++d) {
    std::vector<uint64_t> offs;
    for (size_t i : order) offs.push_back(pieces[i].box.offset[d]);
    std::sort(offs.begin(), offs.end());
    const size_t distinct =
        std::unique(offs.begin(), offs.end()) - offs.begin();
    if (distinct > best) best = distinct, dim = d;
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return pieces[a].box.offset[dim] < pieces[b].box.offset[dim];
  });
  std::vector<size_t> active;
  for (size_t i : order) {
    const uint64_t begin = pieces[i].box.offset[dim];
    std::erase_if(active, [&](size_t j) {
      return pieces[j].box.offset[dim] + pieces[j].box.extent[dim] <= begin;
    });
    for (size_t j : active) {
      if (Intersect(pieces[i].box, pieces[j].box).has_value()) {
        return overlap(std::min(i, j), std::max(i, j));
      }
    }
    active.push_back(i);
  }
  return Status::Ok();
}

Status CheckTiling(std::string_view name, std::span<const uint64_t> shape,
                   std::span<const TilePiece> pieces) {
  const std::string what = "tensor '" + std::string(name) + "'";
  for (const TilePiece& p : pieces) {
    TH_RETURN_IF_ERROR(CheckBoxInShape(
        p.box, shape, what + " part " + std::to_string(p.part)));
  }
  TH_RETURN_IF_ERROR(CheckNoOverlap(name, pieces));
  const uint64_t total = Box::Whole(shape).Elements();
  uint64_t covered = 0;
  for (const TilePiece& p : pieces) covered += p.box.Elements();  // disjoint
  if (covered == total) return Status::Ok();
  std::string msg = what + " of shape " + ShapeString(shape) +
                    ": its parts cover " + std::to_string(covered) + " of " +
                    std::to_string(total) + " elements";
  if (std::optional<Box> gap = FindGap(shape, pieces)) {
    msg += "; no part covers " + BoxToString(*gap);
  }
  msg += " (parts:";
  for (size_t i = 0; i < pieces.size() && i < 8; ++i) {
    msg += " " + PieceName(pieces[i]);
  }
  if (pieces.size() > 8) msg += " ...";
  return InvalidArgument(msg + ")");
}

std::vector<StridedRun> PlanCopy(const Box& region, const Box& src_box,
                                 const Box& dst_box, uint64_t elem_bytes) {
  TH_CHECK(Contains(src_box, region));
  TH_CHECK(Contains(dst_box, region));
  const size_t n = region.rank();
  if (n == 0) {
    return {{0, 0, elem_bytes, 1, elem_bytes, elem_bytes}};
  }
  if (region.Elements() == 0) return {};
  const std::vector<uint64_t>& e = region.extent;
  const std::vector<uint64_t>& s = src_box.extent;
  const std::vector<uint64_t>& t = dst_box.extent;
  std::vector<uint64_t> rs(n), rd(n);
  for (size_t d = 0; d < n; ++d) {
    rs[d] = region.offset[d] - src_box.offset[d];
    rd[d] = region.offset[d] - dst_box.offset[d];
  }
  const std::vector<uint64_t> ss = Strides(s), ts = Strides(t);
  auto full = [&](size_t d) { return e[d] == s[d] && e[d] == t[d]; };
  // The run: the last dimension, and outer ones while the inner are whole.
  size_t k = n - 1;
  uint64_t run = e[k];
  while (k > 0 && full(k)) {
    --k;
    run *= e[k];
  }
  uint64_t src0 = 0, dst0 = 0;  // the region's first element, dims >= k
  for (size_t d = k; d < n; ++d) {
    src0 += rs[d] * ss[d];
    dst0 += rd[d] * ts[d];
  }
  if (k == 0) {
    return {{src0 * elem_bytes, dst0 * elem_bytes, run * elem_bytes, 1,
             run * elem_bytes, run * elem_bytes}};
  }
  // The batch: dimension k-1, extended outward while it is whole.
  size_t b = k - 1;
  uint64_t count = e[b];
  const uint64_t sstride = ss[b] * elem_bytes, dstride = ts[b] * elem_bytes;
  src0 += rs[b] * ss[b];
  dst0 += rd[b] * ts[b];
  while (b > 0 && full(b)) {
    --b;
    count *= e[b];
    src0 += rs[b] * ss[b];
    dst0 += rd[b] * ts[b];
  }
  std::vector<StridedRun> out;
  std::vector<uint64_t> idx(b, 0);
  for (;;) {
    uint64_t so = src0, dof = dst0;
    for (size_t d = 0; d < b; ++d) {
      so += (rs[d] + idx[d]) * ss[d];
      dof += (rd[d] + idx[d]) * ts[d];
    }
    StridedRun r{so * elem_bytes, dof * elem_bytes, run * elem_bytes,
                 count,           sstride,          dstride};
    if (count == 1) r.src_stride = r.dst_stride = r.run_bytes;
    out.push_back(r);
    size_t d = b;
    while (d > 0) {
      --d;
      if (++idx[d] < e[d]) break;
      idx[d] = 0;
      if (d == 0) return out;
    }
    if (b == 0) return out;
  }
}

// ------------------------------------------------------------ Segments

MatrixView MatrixOf(std::span<const uint64_t> shape) {
  MatrixView m;
  if (shape.empty()) return m;
  m.cols = shape.back();
  for (size_t d = 0; d + 1 < shape.size(); ++d) m.rows *= shape[d];
  return m;
}

SegmentShape ChooseSegmentShape(std::span<const uint64_t> shape,
                                uint64_t elem_bytes, uint64_t segment_bytes,
                                bool split_cols) {
  const MatrixView m = MatrixOf(shape);
  if (m.rows == 0 || m.cols == 0 || elem_bytes == 0) return {};
  const uint64_t max_cols = std::max<uint64_t>(1, segment_bytes / elem_bytes);
  uint64_t cols = std::min(m.cols, max_cols);
  if (split_cols) {
    cols = std::min(
        cols, std::max<uint64_t>(1, CeilDiv(m.cols, kSegmentColumnBlocks)));
  }
  const uint64_t rows =
      std::clamp<uint64_t>(segment_bytes / (cols * elem_bytes), 1, m.rows);
  return {rows, cols};
}

Status CheckSegmentShape(std::span<const uint64_t> shape, uint64_t elem_bytes,
                         const SegmentShape& seg, std::string_view what) {
  if (seg.rows == 0 && seg.cols == 0) return Status::Ok();
  const MatrixView m = MatrixOf(shape);
  if (seg.rows == 0 || seg.cols == 0 ||
      seg.rows > std::max<uint64_t>(1, m.rows) ||
      seg.cols > std::max<uint64_t>(1, m.cols)) {
    return InvalidArgument(
        std::string(what) + ": segment shape " + std::to_string(seg.rows) +
        "x" + std::to_string(seg.cols) + " does not fit its " +
        std::to_string(m.rows) + "x" + std::to_string(m.cols) + " matrix");
  }
  std::optional<uint64_t> bytes = MulChecked(seg.rows, seg.cols);
  if (bytes.has_value()) bytes = MulChecked(*bytes, elem_bytes);
  if (!bytes.has_value() || *bytes > kMaxSegmentBytes) {
    return InvalidArgument(std::string(what) + ": segments larger than " +
                           std::to_string(kMaxSegmentBytes) + " bytes");
  }
  return Status::Ok();
}

uint64_t NumSegments(std::span<const uint64_t> shape, const SegmentShape& seg) {
  if (seg.rows == 0 || seg.cols == 0) return 0;
  const MatrixView m = MatrixOf(shape);
  return CeilDiv(m.rows, seg.rows) * CeilDiv(m.cols, seg.cols);
}

std::vector<uint64_t> SegmentChecksums(const uint8_t* data,
                                       std::span<const uint64_t> shape,
                                       uint64_t elem_bytes,
                                       const SegmentShape& seg) {
  std::vector<uint64_t> out;
  if (seg.rows == 0) return out;
  const MatrixView m = MatrixOf(shape);
  out.reserve(NumSegments(shape, seg));
  const uint64_t row_bytes = m.cols * elem_bytes;
  for (uint64_t r0 = 0; r0 < m.rows; r0 += seg.rows) {
    const uint64_t r1 = std::min(m.rows, r0 + seg.rows);
    for (uint64_t c0 = 0; c0 < m.cols; c0 += seg.cols) {
      const uint64_t c1 = std::min(m.cols, c0 + seg.cols);
      const uint8_t* first = data + r0 * row_bytes + c0 * elem_bytes;
      if (c0 == 0 && c1 == m.cols) {  // whole rows: contiguous
        out.push_back(Xxh3(first, (r1 - r0) * row_bytes));
        continue;
      }
      Xxh3Stream h;
      for (uint64_t r = r0; r < r1; ++r) {
        h.Update(first + (r - r0) * row_bytes, (c1 - c0) * elem_bytes);
      }
      out.push_back(h.Digest());
    }
  }
  return out;
}

std::vector<MatrixRect> RectsOfBox(std::span<const uint64_t> piece_shape,
                                   const Box& local_box) {
  const size_t n = piece_shape.size();
  TH_CHECK_EQ(local_box.rank(), n);
  if (local_box.Elements() == 0) return {};
  if (n == 0) return {{0, 1, 0, 1}};
  const uint64_t c0 = local_box.offset[n - 1];
  const uint64_t c1 = c0 + local_box.extent[n - 1];
  if (n == 1) return {{0, 1, c0, c1}};
  // The rows: the box over the leading dimensions, as runs of consecutive
  // row numbers (PlanCopy with one-byte elements numbers them).
  Box lead;
  lead.offset.assign(local_box.offset.begin(), local_box.offset.end() - 1);
  lead.extent.assign(local_box.extent.begin(), local_box.extent.end() - 1);
  const Box whole = Box::Whole(piece_shape.first(n - 1));
  std::vector<MatrixRect> out;
  for (const StridedRun& r : PlanCopy(lead, whole, lead, 1)) {
    for (uint64_t i = 0; i < r.count; ++i) {
      const uint64_t begin = r.src_offset + i * r.src_stride;
      if (!out.empty() && out.back().row_end == begin) {
        out.back().row_end += r.run_bytes;
      } else {
        out.push_back({begin, begin + r.run_bytes, c0, c1});
      }
    }
  }
  return out;
}

std::vector<MatrixRect> CoveringSegments(std::span<const MatrixRect> rects,
                                         MatrixView matrix,
                                         const SegmentShape& seg) {
  std::vector<MatrixRect> grown(rects.begin(), rects.end());
  if (seg.rows == 0) return grown;
  for (MatrixRect& r : grown) {
    r.row_begin = r.row_begin / seg.rows * seg.rows;
    r.row_end = std::min(matrix.rows, CeilDiv(r.row_end, seg.rows) * seg.rows);
    r.col_begin = r.col_begin / seg.cols * seg.cols;
    r.col_end = std::min(matrix.cols, CeilDiv(r.col_end, seg.cols) * seg.cols);
  }
  std::sort(grown.begin(), grown.end(),
            [](const MatrixRect& a, const MatrixRect& b) {
              return std::tie(a.col_begin, a.col_end, a.row_begin) <
                     std::tie(b.col_begin, b.col_end, b.row_begin);
            });
  std::vector<MatrixRect> out;
  for (const MatrixRect& r : grown) {
    if (!out.empty() && out.back().col_begin == r.col_begin &&
        out.back().col_end == r.col_end && r.row_begin <= out.back().row_end) {
      out.back().row_end = std::max(out.back().row_end, r.row_end);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

std::vector<uint64_t> SegmentIdsOf(const MatrixRect& aligned, MatrixView matrix,
                                   const SegmentShape& seg) {
  std::vector<uint64_t> out;
  if (seg.rows == 0) return out;
  const uint64_t col_blocks = CeilDiv(matrix.cols, seg.cols);
  for (uint64_t b = aligned.row_begin / seg.rows;
       b < CeilDiv(aligned.row_end, seg.rows); ++b) {
    for (uint64_t c = aligned.col_begin / seg.cols;
         c < CeilDiv(aligned.col_end, seg.cols); ++c) {
      out.push_back(b * col_blocks + c);
    }
  }
  return out;
}

}  // namespace tensorhub
