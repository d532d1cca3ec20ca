#include "client/fetch/slice_run.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "client/fetch/fetch_plan.h"
#include "client/fetch/plan_run.h"
#include "common/checksum.h"
#include "common/convert.h"
#include "common/test_point.h"

namespace tensorhub::client {
namespace {

uint64_t CeilDiv(uint64_t a, uint64_t b) {
  return a == 0 ? 0 : (a - 1) / b + 1;
}

}  // namespace

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

  // What to read for plan item `step.chunk` from the source `step` names:
  // the item itself from a trainer part, or, from a holder of slices, the
  // item's alternative read in the holder's own layout.
  struct Chosen {
    const SliceItem* item;
    const TensorLayout* layout;
    uint32_t part;  // the part the request names
  };
  Result<Chosen> Choose(const FetchStep& step) const {
    const SliceItem& item = job_.plan->items[step.chunk];
    const std::vector<SliceHolderRef>& holders = job_.plan->holders;
    for (size_t h = 0; h < holders.size(); ++h) {
      if (holders[h].address != step.address ||
          holders[h].epoch != step.epoch) {
        continue;
      }
      for (const SliceItem& a : item.alts) {
        if (a.part != h) continue;
        return Chosen{&a, &holders[h].layout->tensors[a.tensor],
                      wire::kSliceHolderPart};
      }
      return Internal("slice read " + std::to_string(step.chunk) +
                      " has no read from holder of slices " + step.address);
    }
    return Chosen{&item,
                  &job_.manifest->parts()[item.part].tensors[item.tensor],
                  item.part};
  }

  // Lands every row of `item` (Land), into `rows`; the pieces as the read's
  // destination, neighbours that touch in memory merged.
  std::vector<iovec> LandRows(const SliceItem& item, const TensorLayout& t,
                              bool convert, uint8_t* scratch,
                              std::vector<RowLanding>* rows) const {
    const uint64_t elem = DTypeBytes(t.spec.dtype);
    const MatrixRect& rd = item.read;
    std::vector<iovec> dest;
    uint64_t used = 0;
    for (uint64_t r = rd.row_begin; r < rd.row_end; ++r) {
      rows->push_back(Land(item, t, r, convert, scratch, &used));
      const RowLanding& l = rows->back();
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
    return dest;
  }

  Status Read(StreamState& s, const FetchStep& step,
              transport::ReadInfo* info) override {
    if (s.scratch.size() < job_.plan->max_item_bytes) {
      s.scratch.resize(job_.plan->max_item_bytes);
    }
    TH_ASSIGN_OR_RETURN(const Chosen chosen, Choose(step));
    const SliceItem& item = *chosen.item;
    const TensorLayout& t = *chosen.layout;
    const bool convert = (*job_.dests)[item.dest].dtype != t.spec.dtype;
    const uint64_t elem = DTypeBytes(t.spec.dtype);
    const MatrixView m = MatrixOf(t.spec.shape);
    const MatrixRect& rd = item.read;
    TH_ASSIGN_OR_RETURN(transport::Connection * conn, Connect(s, step));
    std::vector<RowLanding> rows;
    const std::vector<iovec> dest =
        LandRows(item, t, convert, s.scratch.data(), &rows);
    wire::ReadRequest req;
    req.model = job_.model;
    req.version = job_.version.value();
    req.epoch = step.epoch;
    req.part = chosen.part;
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
