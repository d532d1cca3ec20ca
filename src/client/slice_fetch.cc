#include "client/slice_fetch.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "client/fetch_plan.h"
#include "client/plan_run.h"
#include "common/checksum.h"
#include "common/convert.h"
#include "common/test_point.h"

namespace tensorhub::client {
namespace {

uint64_t CeilDiv(uint64_t a, uint64_t b) {
  return a == 0 ? 0 : (a - 1) / b + 1;
}

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

// `inter` cut along every boundary of `hs` inside it, so that each piece
// lies wholly inside or wholly outside each of their boxes; `inter` alone
// if that makes more than kMaxSliceCuts pieces.
std::vector<Box> CutAlong(const Box& inter,
                          const std::vector<HolderPiece>& hs) {
  const size_t n = inter.rank();
  if (n == 0 || hs.empty()) return {inter};
  std::vector<std::vector<uint64_t>> cuts(n);
  uint64_t pieces = 1;
  for (size_t k = 0; k < n; ++k) {
    const uint64_t lo = inter.offset[k], hi = lo + inter.extent[k];
    std::set<uint64_t> c{lo, hi};
    for (const HolderPiece& h : hs) {
      for (uint64_t x : {h.box.offset[k], h.box.offset[k] + h.box.extent[k]}) {
        if (x > lo && x < hi) c.insert(x);
      }
    }
    cuts[k].assign(c.begin(), c.end());
    pieces *= cuts[k].size() - 1;
    if (pieces > kMaxSliceCuts) return {inter};
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

// The read of `item`'s wanted bytes (of trainer piece `t`) from holder
// piece `h` (layout tensor `ht`), if they lie in its box: the matrix view of
// tensors of 1 or 2 dimensions maps a wanted rectangle to one box.
std::optional<SliceItem> AltRead(const SliceItem& item, const TensorLayout& t,
                                 const HolderPiece& h, const TensorLayout& ht) {
  const Box piece = t.PieceBox();
  const size_t n = piece.rank();
  if (n == 0 || n > 2 || item.rows.size() != 1) return std::nullopt;
  Box want;
  if (n == 1) {
    want = {{piece.offset[0] + item.col_begin},
            {item.col_end - item.col_begin}};
  } else {
    const auto [r0, r1] = item.rows[0];
    want = {{piece.offset[0] + r0, piece.offset[1] + item.col_begin},
            {r1 - r0, item.col_end - item.col_begin}};
  }
  if (!Contains(h.box, want)) return std::nullopt;
  Box local = want;
  for (size_t k = 0; k < n; ++k) local.offset[k] -= h.box.offset[k];
  const std::vector<MatrixRect> rects = RectsOfBox(ht.spec.shape, local);
  if (rects.size() != 1) return std::nullopt;
  const std::vector<MatrixRect> grown =
      CoveringSegments(rects, MatrixOf(ht.spec.shape), ht.seg);
  if (grown.size() != 1 ||
      grown[0].row_end - grown[0].row_begin > wire::kMaxStridedRuns) {
    return std::nullopt;
  }
  SliceItem a;
  a.part = h.holder;
  a.tensor = h.tensor;
  a.dest = item.dest;
  a.read = grown[0];
  a.rows = {{rects[0].row_begin, rects[0].row_end}};
  a.col_begin = rects[0].col_begin;
  a.col_end = rects[0].col_end;
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
      if (ht.spec.dtype != t.spec.dtype || ht.GlobalShape() != t.GlobalShape())
        continue;
      out[it->first].push_back({h, i, ht.PieceBox()});
    }
  }
  return out;
}

}  // namespace

// Long on purpose (about 95 lines): the intersection, the cuts along the
// holders of slices, the growth to segments and the cut into items are one
// walk over the pieces.
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
    const uint64_t elem = DTypeBytes(first.spec.dtype);
    plan.wanted_bytes += d.box.Elements() * elem;
    auto hit = held.find(d.name);
    const std::vector<HolderPiece> none;
    const std::vector<HolderPiece>& hs = hit == held.end() ? none : hit->second;
    for (const PieceRef& ref : it->second) {
      const TensorLayout& t = manifest.parts()[ref.part].tensors[ref.tensor];
      const Box piece = t.PieceBox();
      std::optional<Box> inter = Intersect(d.box, piece);
      if (!inter.has_value()) continue;
      if (t.seg.rows == 0) {
        return FailedPrecondition(
            "tensor '" + d.name + "' in part " + std::to_string(ref.part) +
            " has no segment checksums (an older publisher, or device "
            "memory), so a slice of it cannot be verified: fetch it whole");
      }
      std::vector<HolderPiece> meeting;
      for (const HolderPiece& h : hs) {
        if (Intersect(*inter, h.box).has_value()) meeting.push_back(h);
      }
      for (const Box& cut : CutAlong(*inter, meeting)) {
        Box local = cut;
        for (size_t k = 0; k < local.rank(); ++k)
          local.offset[k] -= piece.offset[k];
        const MatrixView m = MatrixOf(t.spec.shape);
        const std::vector<MatrixRect> want = RectsOfBox(t.spec.shape, local);
        if (want.empty()) continue;
        std::vector<std::pair<uint64_t, uint64_t>> rows;
        for (const MatrixRect& r : want)
          rows.push_back({r.row_begin, r.row_end});
        for (const MatrixRect& grown : CoveringSegments(want, m, t.seg)) {
          const uint64_t row_bytes = (grown.col_end - grown.col_begin) * elem;
          // Whole row blocks per item, about item_bytes, at most
          // kMaxStridedRuns rows.
          uint64_t block_rows = std::max<uint64_t>(
              1, item_bytes / std::max<uint64_t>(1, row_bytes * t.seg.rows));
          block_rows = std::min<uint64_t>(
              block_rows * t.seg.rows,
              std::max<uint64_t>(
                  t.seg.rows, wire::kMaxStridedRuns / t.seg.rows * t.seg.rows));
          for (uint64_t r0 = grown.row_begin; r0 < grown.row_end;
               r0 += block_rows) {
            SliceItem item;
            item.part = ref.part;
            item.tensor = ref.tensor;
            item.dest = di;
            item.read = grown;
            item.read.row_begin = r0;
            item.read.row_end = std::min(grown.row_end, r0 + block_rows);
            item.rows = Clip(rows, item.read.row_begin, item.read.row_end);
            item.col_begin = want[0].col_begin;
            item.col_end = want[0].col_end;
            item.bytes = (item.read.row_end - item.read.row_begin) * row_bytes;
            const uint64_t begin =
                t.offset +
                (item.read.row_begin * m.cols + grown.col_begin) * elem;
            const uint64_t end =
                t.offset +
                ((item.read.row_end - 1) * m.cols + grown.col_end) * elem;
            const uint64_t base = manifest.chunk_base(ref.part);
            item.chunk_first = base + begin / manifest.chunk_bytes();
            item.chunk_last = base + (end - 1) / manifest.chunk_bytes();
            plan.read_bytes += item.bytes;
            plan.max_item_bytes = std::max(plan.max_item_bytes, item.bytes);
            for (const HolderPiece& h : meeting) {
              const bool have = std::any_of(
                  item.alts.begin(), item.alts.end(),
                  [&](const SliceItem& a) { return a.part == h.holder; });
              if (have) continue;
              std::optional<SliceItem> alt = AltRead(
                  item, t, h, plan.holders[h.holder].layout->tensors[h.tensor]);
              if (!alt.has_value()) continue;
              plan.max_item_bytes = std::max(plan.max_item_bytes, alt->bytes);
              item.alts.push_back(std::move(*alt));
            }
            plan.items.push_back(std::move(item));
          }
        }
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

namespace {

// Where one row of an item lands: up to three pieces (overhang before,
// wanted, overhang after), each (first column, memory).
struct RowLanding {
  std::pair<uint64_t, uint8_t*> piece[3];
  int n = 0;
};

// A slice fetch: each read is one item of the slice plan (a rectangle of
// rows and columns of one tensor, from a full holder or a holder of
// slices), landing in the caller's memory (overhang and conversions through
// the stream's scratch) and verified segment by segment.
class SliceRun final : public PlanRun {
 public:
  SliceRun(transport::Transport& transport, const SliceJob& job,
           std::vector<FetchSource> sources, const SourceRefresher& refresh,
           const FetcherOptions& options, const Deadline& deadline)
      : PlanRun(transport, refresh, options, deadline,
                FetchPlan(job.model + "@" + std::to_string(job.version.value()),
                          ItemSizes(*job.plan),
                          SourcesForItems(*job.plan, std::move(sources)),
                          static_cast<bool>(refresh), options,
                          deadline.clock().NowMs(), deadline.at_ms()),
                job.plan->read_bytes),
        job_(job) {}

 private:
  static std::vector<uint64_t> ItemSizes(const SlicePlan& plan) {
    std::vector<uint64_t> out;
    for (const SliceItem& i : plan.items) out.push_back(i.bytes);
    return out;
  }

  void AdjustSources(SourceUpdate& update) override {
    update.sources = SourcesForItems(*job_.plan, std::move(update.sources));
  }

  void Landed(const FetchStep& step, uint64_t done) override {
    (void)step;
    testpoint::Hit("fetcher.slice_done", done);
  }

  // Where row r of `item` lands: overhang into `scratch` (advancing
  // *used), wanted columns into the destination (or, when converting,
  // everything into scratch).
  RowLanding Land(const SliceItem& item, const TensorLayout& t, uint64_t r,
                  bool convert, uint8_t* scratch, uint64_t* used) const {
    const uint64_t elem = DTypeBytes(t.spec.dtype);
    const MatrixRect& rd = item.read;
    RowLanding out;
    auto to_scratch = [&](uint64_t c0, uint64_t c1) {
      if (c0 >= c1) return;
      out.piece[out.n++] = {c0, scratch + *used};
      *used += (c1 - c0) * elem;
    };
    const bool wanted = std::any_of(
        item.rows.begin(), item.rows.end(),
        [&](const auto& iv) { return iv.first <= r && r < iv.second; });
    if (convert || !wanted) {
      to_scratch(rd.col_begin, rd.col_end);
      return out;
    }
    to_scratch(rd.col_begin, item.col_begin);
    out.piece[out.n++] = {item.col_begin, DestRow(item, t, r)};
    to_scratch(item.col_end, rd.col_end);
    return out;
  }

  // The destination address of (piece row r, column item.col_begin).
  uint8_t* DestRow(const SliceItem& item, const TensorLayout& t,
                   uint64_t r) const {
    const SliceDest& d = (*job_.dests)[item.dest];
    const Box piece = t.PieceBox();
    const size_t n = piece.rank();
    const uint64_t elem = DTypeBytes(d.dtype);
    if (n == 0) return d.data;
    // Unravel r over the piece's leading dimensions, then ravel the global
    // index over the destination box.
    std::vector<uint64_t> idx(n, 0);
    uint64_t rest = r;
    for (size_t k = n - 1; k-- > 0;) {
      idx[k] = rest % piece.extent[k];
      rest /= piece.extent[k];
    }
    idx[n - 1] = item.col_begin;
    uint64_t lin = 0;
    for (size_t k = 0; k < n; ++k) {
      lin =
          lin * d.box.extent[k] + (idx[k] + piece.offset[k] - d.box.offset[k]);
    }
    return d.data + lin * elem;
  }

  Status Read(StreamState& s, const FetchStep& step,
              transport::ReadInfo* info) override {
    if (s.scratch.size() < job_.plan->max_item_bytes) {
      s.scratch.resize(job_.plan->max_item_bytes);
    }
    std::vector<uint8_t>& scratch = s.scratch;
    // From a holder of slices: the item's alternative read in its layout.
    const SliceItem* chosen = &job_.plan->items[step.chunk];
    const TensorLayout* layout = nullptr;
    uint32_t read_part = chosen->part;
    const std::vector<SliceHolderRef>& holders = job_.plan->holders;
    for (size_t h = 0; h < holders.size() && layout == nullptr; ++h) {
      if (holders[h].address != step.address ||
          holders[h].epoch != step.epoch) {
        continue;
      }
      for (const SliceItem& a : chosen->alts) {
        if (a.part != h) continue;
        layout = &holders[h].layout->tensors[a.tensor];
        chosen = &a;
        read_part = kSliceHolderPart;
        break;
      }
      if (layout == nullptr) {
        return Internal("slice read " + std::to_string(step.chunk) +
                        " has no read from holder of slices " + step.address);
      }
    }
    if (layout == nullptr) {
      layout = &job_.manifest->parts()[chosen->part].tensors[chosen->tensor];
    }
    const SliceItem& item = *chosen;
    const SliceDest& d = (*job_.dests)[item.dest];
    const TensorLayout& t = *layout;
    const uint64_t elem = DTypeBytes(t.spec.dtype);
    const MatrixView m = MatrixOf(t.spec.shape);
    const MatrixRect& rd = item.read;
    const bool convert = d.dtype != t.spec.dtype;
    TH_ASSIGN_OR_RETURN(transport::Connection * conn, Connect(s, step));
    // Land every row; neighbouring pieces that touch in memory merge.
    std::vector<RowLanding> rows;
    std::vector<iovec> dest;
    uint64_t used = 0;
    for (uint64_t r = rd.row_begin; r < rd.row_end; ++r) {
      rows.push_back(Land(item, t, r, convert, scratch.data(), &used));
      const RowLanding& l = rows.back();
      for (int k = 0; k < l.n; ++k) {
        const uint64_t c1 = k + 1 < l.n ? l.piece[k + 1].first : rd.col_end;
        const size_t len = (c1 - l.piece[k].first) * elem;
        if (!dest.empty() &&
            static_cast<uint8_t*>(dest.back().iov_base) + dest.back().iov_len ==
                l.piece[k].second) {
          dest.back().iov_len += len;
        } else {
          dest.push_back({l.piece[k].second, len});
        }
      }
    }
    wire::ReadRequest req;
    req.model = job_.model;
    req.version = job_.version.value();
    req.epoch = step.epoch;
    req.part = read_part;
    req.offset = t.offset + (rd.row_begin * m.cols + rd.col_begin) * elem;
    req.length = item.bytes;
    const uint64_t run = (rd.col_end - rd.col_begin) * elem;
    if (run != m.cols * elem && rd.row_end - rd.row_begin > 1) {
      req.run = run;
      req.stride = m.cols * elem;
    }
    TH_RETURN_IF_ERROR(conn->Read(
        req, dest, deadline().Cap(options().read_timeout_ms), nullptr));
    *info = conn->last_read();
    const auto v0 = std::chrono::steady_clock::now();
    TH_RETURN_IF_ERROR(Verify(item, t, rows, step.address));
    info->verify_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now() - v0)
                          .count();
    if (convert) Convert(item, t, rows);
    return Status::Ok();
  }

  // Every segment of the read against the manifest, hashed where its rows
  // landed.
  Status Verify(const SliceItem& item, const TensorLayout& t,
                const std::vector<RowLanding>& rows,
                const std::string& address) const {
    const uint64_t elem = DTypeBytes(t.spec.dtype);
    const MatrixView m = MatrixOf(t.spec.shape);
    const MatrixRect& rd = item.read;
    const uint64_t col_blocks = CeilDiv(m.cols, t.seg.cols);
    for (uint64_t id : SegmentIdsOf(rd, m, t.seg)) {
      const uint64_t r0 = id / col_blocks * t.seg.rows;
      const uint64_t r1 = std::min(m.rows, r0 + t.seg.rows);
      const uint64_t c0 = id % col_blocks * t.seg.cols;
      const uint64_t c1 = std::min(m.cols, c0 + t.seg.cols);
      Xxh3Stream h;
      for (uint64_t r = r0; r < r1; ++r) {
        const RowLanding& l = rows[r - rd.row_begin];
        for (int k = 0; k < l.n; ++k) {
          const uint64_t b = l.piece[k].first;
          const uint64_t e = k + 1 < l.n ? l.piece[k + 1].first : rd.col_end;
          const uint64_t lo = std::max(b, c0), hi = std::min(e, c1);
          if (lo < hi)
            h.Update(l.piece[k].second + (lo - b) * elem, (hi - lo) * elem);
        }
      }
      if (h.Digest() != t.seg_xxh3[id]) {
        return DataLoss("segment " + std::to_string(id) + " of tensor '" +
                        t.spec.name + "' in part " + std::to_string(item.part) +
                        " from " + address + " failed its checksum");
      }
    }
    return Status::Ok();
  }

  // The wanted columns of the wanted rows, from scratch into the caller's
  // memory in its dtype.
  void Convert(const SliceItem& item, const TensorLayout& t,
               const std::vector<RowLanding>& rows) const {
    const SliceDest& d = (*job_.dests)[item.dest];
    const uint64_t elem = DTypeBytes(t.spec.dtype);
    const Box piece = t.PieceBox();
    for (const auto& [b, e] : item.rows) {
      for (uint64_t r = b; r < e; ++r) {
        const RowLanding& l = rows[r - item.read.row_begin];
        const uint8_t* src =
            l.piece[0].second + (item.col_begin - item.read.col_begin) * elem;
        float scale = d.scales.empty() ? 1.0f : d.scales[0];
        if (d.scales.size() > 1) {
          // The output channel: row r's dim-0 index, in the box.
          uint64_t row0 = r;
          for (size_t k = piece.rank() - 1; k-- > 1;) row0 /= piece.extent[k];
          scale = d.scales[row0 + piece.offset[0] - d.box.offset[0]];
        }
        ConvertElements(t.spec.dtype, d.dtype, src, DestRow(item, t, r),
                        item.col_end - item.col_begin, scale);
      }
    }
  }

  const SliceJob& job_;
};

}  // namespace

Result<FetchReport> RunSliceFetch(transport::Transport& transport,
                                  const SliceJob& job,
                                  std::vector<FetchSource> sources,
                                  const SourceRefresher& refresh,
                                  const FetcherOptions& options,
                                  const Deadline& deadline) {
  if (job.manifest == nullptr || job.plan == nullptr || job.dests == nullptr) {
    return Internal("slice fetch job incomplete");
  }
  if (job.plan->items.empty()) return FetchReport{};
  SliceRun run(transport, job, std::move(sources), refresh, options, deadline);
  return run.Run();
}

}  // namespace tensorhub::client
