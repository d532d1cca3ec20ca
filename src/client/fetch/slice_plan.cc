#include "client/fetch/slice_plan.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/convert.h"

namespace tensorhub::client {
namespace {

struct PieceRef {
  uint32_t part;
  uint32_t tensor;
};

// Intersects [begin, end) with sorted disjoint intervals.
std::vector<std::pair<uint64_t, uint64_t>> Clip(
    const std::vector<std::pair<uint64_t, uint64_t>>& rows, uint64_t begin,
    uint64_t end) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (const auto& [b, e] : rows) {
    const uint64_t lo = std::max(b, begin), hi = std::min(e, end);
    if (lo < hi) out.push_back({lo, hi});
  }
  return out;
}

Status CheckDest(const SliceDest& d, const TensorLayout& t) {
  const std::string what = "slice of tensor '" + d.name + "'";
  TH_RETURN_IF_ERROR(CheckBoxInShape(d.box, t.GlobalShape(), what));
  TH_RETURN_IF_ERROR(CheckConversion(t.spec.dtype, d.dtype, what));
  if (d.data == nullptr && d.box.Elements() > 0) {
    return InvalidArgument(what + " has no memory");
  }
  if (NeedsScale(d.dtype) && d.dtype != t.spec.dtype) {
    // Per output channel (a row of dim 0) for 2+ dimensions.
    const uint64_t rows = d.box.rank() < 2 ? 1 : d.box.extent[0];
    if (d.scales.size() != 1 && d.scales.size() != rows) {
      return InvalidArgument(what + ": F8_E4M3 needs 1 scale (per tensor) or " +
                             std::to_string(rows) +
                             " (per row of the box), got " +
                             std::to_string(d.scales.size()));
    }
  }
  return Status::Ok();
}

}  // namespace

namespace {

// A box of a holder of slices.
struct HolderPiece {
  uint32_t holder;  // index in SlicePlan::holders
  uint32_t tensor;  // index in its layout
  Box box;          // of the global tensor
};

// The read of `item`'s wanted bytes (of trainer piece `t`) from holder
// piece `h` (layout tensor `ht`), if they lie in its box: the piece's and
// the box's matrix views are both the tensor's, shifted (MatrixOrigin), so
// each wanted row of the item is one row of the holder's view.
std::optional<SliceItem> AltRead(const SliceItem& item, const TensorLayout& t,
                                 const HolderPiece& h, const TensorLayout& ht) {
  const std::vector<uint64_t> shape = t.GlobalShape();
  const auto piece = MatrixOrigin(t.PieceBox(), shape);
  const auto holder = MatrixOrigin(h.box, shape);
  if (!piece.has_value() || !holder.has_value() || item.rows.empty()) {
    return std::nullopt;
  }
  const MatrixView hm = MatrixOf(ht.spec.shape);
  const uint64_t c0 = piece->second + item.col_begin;
  const uint64_t c1 = piece->second + item.col_end;
  if (c0 < holder->second || c1 > holder->second + hm.cols) {
    return std::nullopt;
  }
  std::vector<std::pair<uint64_t, uint64_t>> rows;
  for (const auto& [b, e] : item.rows) {
    const uint64_t gb = piece->first + b, ge = piece->first + e;
    if (gb < holder->first || ge > holder->first + hm.rows) {
      return std::nullopt;
    }
    rows.push_back({gb - holder->first, ge - holder->first});
  }
  const MatrixRect want{rows.front().first, rows.back().second,
                        c0 - holder->second, c1 - holder->second};
  const std::vector<MatrixRect> grown =
      CoveringSegments({&want, 1}, hm, ht.seg);
  if (grown.size() != 1 ||
      grown[0].row_end - grown[0].row_begin > wire::kMaxStridedRuns) {
    return std::nullopt;
  }
  SliceItem a;
  a.part = h.holder;
  a.tensor = h.tensor;
  a.dest = item.dest;
  a.read = grown[0];
  a.rows = std::move(rows);
  a.col_begin = want.col_begin;
  a.col_end = want.col_end;
  a.bytes = (a.read.row_end - a.read.row_begin) *
            (a.read.col_end - a.read.col_begin) * DTypeBytes(ht.spec.dtype);
  return a;
}

// The usable boxes of holders of slices, by tensor name: same dtype and
// global shape as the version's, with segment checksums.
std::map<std::string_view, std::vector<HolderPiece>> HolderPieces(
    const SlicePlan& plan,
    const std::map<std::string_view, std::vector<PieceRef>>& pieces,
    const Manifest& manifest) {
  std::map<std::string_view, std::vector<HolderPiece>> out;
  for (uint32_t h = 0; h < plan.holders.size(); ++h) {
    const PartLayout& l = *plan.holders[h].layout;
    for (uint32_t i = 0; i < l.tensors.size(); ++i) {
      const TensorLayout& ht = l.tensors[i];
      auto it = pieces.find(ht.spec.name);
      if (it == pieces.end() || ht.seg.rows == 0) continue;
      const TensorLayout& t =
          manifest.parts()[it->second[0].part].tensors[it->second[0].tensor];
      if (ht.spec.dtype != t.spec.dtype ||
          ht.GlobalShape() != t.GlobalShape() ||
          !MatrixOrigin(ht.PieceBox(), ht.GlobalShape()).has_value()) {
        continue;  // no read can come from it (MatrixOrigin)
      }
      out[it->first].push_back({h, i, ht.PieceBox()});
    }
  }
  return out;
}

}  // namespace

namespace {

// The alternative reads of `item` (of trainer piece `t`) from the holders
// of slices `meeting` whose boxes hold its wanted bytes, one per holder.
void AddAlternatives(const TensorLayout& t,
                     const std::vector<HolderPiece>& meeting, SlicePlan* plan,
                     SliceItem* item) {
  for (const HolderPiece& h : meeting) {
    const bool have =
        std::any_of(item->alts.begin(), item->alts.end(),
                    [&](const SliceItem& a) { return a.part == h.holder; });
    if (have) continue;
    std::optional<SliceItem> alt =
        AltRead(*item, t, h, plan->holders[h.holder].layout->tensors[h.tensor]);
    if (!alt.has_value()) continue;
    plan->max_item_bytes = std::max(plan->max_item_bytes, alt->bytes);
    item->alts.push_back(std::move(*alt));
  }
}

// The items that read `cut` (global coordinates, inside piece `ref` of
// tensor `t`) for destination `di`: the cut's rectangles of the piece's
// matrix view, grown to whole segments, in blocks of whole segment rows of
// about item_bytes (at most kMaxStridedRuns rows: one strided request).
void AddItems(const Manifest& manifest, const PieceRef& ref,
              const TensorLayout& t, uint32_t di, const Box& cut,
              const std::vector<HolderPiece>& meeting, uint64_t item_bytes,
              SlicePlan* plan) {
  const Box piece = t.PieceBox();
  Box local = cut;
  for (size_t k = 0; k < local.rank(); ++k) local.offset[k] -= piece.offset[k];
  const uint64_t elem = DTypeBytes(t.spec.dtype);
  const MatrixView m = MatrixOf(t.spec.shape);
  const std::vector<MatrixRect> want = RectsOfBox(t.spec.shape, local);
  if (want.empty()) return;
  std::vector<std::pair<uint64_t, uint64_t>> rows;
  for (const MatrixRect& r : want) rows.push_back({r.row_begin, r.row_end});
  const uint64_t max_rows = std::max<uint64_t>(
      t.seg.rows, wire::kMaxStridedRuns / t.seg.rows * t.seg.rows);
  for (const MatrixRect& grown : CoveringSegments(want, m, t.seg)) {
    const uint64_t row_bytes = (grown.col_end - grown.col_begin) * elem;
    const uint64_t block_rows = std::min<uint64_t>(
        std::max<uint64_t>(
            1, item_bytes / std::max<uint64_t>(1, row_bytes * t.seg.rows)) *
            t.seg.rows,
        max_rows);
    for (uint64_t r0 = grown.row_begin; r0 < grown.row_end; r0 += block_rows) {
      SliceItem item;
      item.part = ref.part;
      item.tensor = ref.tensor;
      item.dest = di;
      item.read = grown;
      item.read.row_begin = r0;
      item.read.row_end = std::min(grown.row_end, r0 + block_rows);
      item.rows = Clip(rows, item.read.row_begin, item.read.row_end);
      // Only overhang (between wanted rows far apart): nothing to read.
      if (item.rows.empty()) continue;
      item.col_begin = want[0].col_begin;
      item.col_end = want[0].col_end;
      item.bytes = (item.read.row_end - item.read.row_begin) * row_bytes;
      const uint64_t begin =
          t.offset + (item.read.row_begin * m.cols + grown.col_begin) * elem;
      const uint64_t end =
          t.offset + ((item.read.row_end - 1) * m.cols + grown.col_end) * elem;
      const uint64_t base = manifest.chunk_base(ref.part);
      item.chunk_first = base + begin / manifest.chunk_bytes();
      item.chunk_last = base + (end - 1) / manifest.chunk_bytes();
      plan->read_bytes += item.bytes;
      plan->max_item_bytes = std::max(plan->max_item_bytes, item.bytes);
      AddAlternatives(t, meeting, plan, &item);
      plan->items.push_back(std::move(item));
    }
  }
}

}  // namespace

// One walk over the wanted boxes: each is intersected with every piece of
// its tensor, cut along the boxes of holders of slices that meet the
// intersection, and each cut becomes items (AddItems).
Result<SlicePlan> PlanSlices(const Manifest& manifest,
                             const std::vector<SliceDest>& dests,
                             uint64_t item_bytes,
                             const std::vector<FetchSource>& sources) {
  std::map<std::string_view, std::vector<PieceRef>> pieces;
  for (const PartLayout& p : manifest.parts()) {
    for (uint32_t i = 0; i < p.tensors.size(); ++i) {
      pieces[p.tensors[i].spec.name].push_back({p.rank, i});
    }
  }
  SlicePlan plan;
  for (const FetchSource& s : sources) {
    if (s.slices)
      plan.holders.push_back({s.worker, s.address, s.epoch, s.slices});
  }
  const std::map<std::string_view, std::vector<HolderPiece>> held =
      HolderPieces(plan, pieces, manifest);
  for (uint32_t di = 0; di < dests.size(); ++di) {
    const SliceDest& d = dests[di];
    auto it = pieces.find(d.name);
    if (it == pieces.end()) {
      return InvalidArgument("tensor '" + d.name +
                             "' is not part of the version");
    }
    const TensorLayout& first =
        manifest.parts()[it->second[0].part].tensors[it->second[0].tensor];
    TH_RETURN_IF_ERROR(CheckDest(d, first));
    plan.wanted_bytes += d.box.Elements() * DTypeBytes(first.spec.dtype);
    auto hit = held.find(d.name);
    const std::vector<HolderPiece> none;
    const std::vector<HolderPiece>& hs = hit == held.end() ? none : hit->second;
    for (const PieceRef& ref : it->second) {
      const TensorLayout& t = manifest.parts()[ref.part].tensors[ref.tensor];
      std::optional<Box> inter = Intersect(d.box, t.PieceBox());
      if (!inter.has_value()) continue;
      if (t.seg.rows == 0) {
        return FailedPrecondition(
            "tensor '" + d.name + "' in part " + std::to_string(ref.part) +
            " has no segment checksums (an older publisher, or device "
            "memory), so a slice of it cannot be verified: fetch it whole");
      }
      std::vector<HolderPiece> meeting;
      std::vector<Box> boxes;
      for (const HolderPiece& h : hs) {
        if (Intersect(*inter, h.box).has_value()) {
          meeting.push_back(h);
          boxes.push_back(h.box);
        }
      }
      for (const Box& cut : CutAlong(*inter, boxes)) {
        AddItems(manifest, ref, t, di, cut, meeting, item_bytes, &plan);
      }
    }
  }
  std::stable_sort(plan.items.begin(), plan.items.end(),
                   [](const SliceItem& a, const SliceItem& b) {
                     return std::tie(a.part, a.chunk_first) <
                            std::tie(b.part, b.chunk_first);
                   });
  return plan;
}

std::vector<FetchSource> SourcesForItems(const SlicePlan& plan,
                                         std::vector<FetchSource> sources) {
  for (FetchSource& s : sources) {
    std::vector<std::pair<uint64_t, uint64_t>> items;
    int holder = -1;
    for (size_t h = 0; s.slices && h < plan.holders.size(); ++h) {
      if (plan.holders[h].worker == s.worker &&
          plan.holders[h].epoch == s.epoch) {
        holder = static_cast<int>(h);
      }
    }
    for (uint64_t i = 0; i < plan.items.size(); ++i) {
      const SliceItem& it = plan.items[i];
      const bool has =
          s.slices ? std::any_of(it.alts.begin(), it.alts.end(),
                                 [&](const SliceItem& a) {
                                   return static_cast<int>(a.part) == holder;
                                 })
                   : std::any_of(s.chunks.begin(), s.chunks.end(),
                                 [&](const auto& range) {
                                   return range.first <= it.chunk_first &&
                                          it.chunk_last < range.second;
                                 });
      if (!has) continue;
      if (!items.empty() && items.back().second == i) {
        ++items.back().second;
      } else {
        items.push_back({i, i + 1});
      }
    }
    s.chunks = std::move(items);
  }
  return sources;
}

}  // namespace tensorhub::client
