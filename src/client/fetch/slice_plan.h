// The plan of a partial fetch: a reader names boxes of logical tensors and
// gets exactly those, read from the parts that hold them whatever their
// layout.
//
// PlanSlices (pure: no I/O, no clock) intersects each wanted box with every
// piece of its tensor, grows each intersection to whole segments (the
// manifest's segment checksums, geometry.h) and cuts the result into reads
// ("items") of about one chunk: one strided read per item (a column slice
// is one request of `rows` runs, not one per row). RunSliceFetch
// (slice_run.h) runs the items.
#ifndef TENSORHUB_CLIENT_FETCH_SLICE_PLAN_H_
#define TENSORHUB_CLIENT_FETCH_SLICE_PLAN_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/fetch/fetcher.h"
#include "common/geometry.h"
#include "common/manifest.h"

namespace tensorhub::client {

struct SliceDest {
  std::string name;          // the logical tensor
  Box box;                   // of the global tensor
  DType dtype = DType::kU8;  // wanted (conversion from the published one)
  uint8_t* data = nullptr;   // row-major over box.extent
  // F8_E4M3 only: one scale (per tensor) or box.extent[0] (per row).
  std::vector<float> scales;
};

// One read: a segment-aligned rectangle of one piece's matrix view, and
// which of its rows and columns the caller wants.
struct SliceItem {
  // The trainer part; in an alternative (alts), the holder of slices (an
  // index in SlicePlan::holders).
  uint32_t part = 0;
  uint32_t tensor = 0;  // index in the part (or the holder's layout)
  uint32_t dest = 0;    // index in the destinations
  MatrixRect read;
  // Wanted: these rows (sorted, disjoint [begin, end) intervals inside
  // read's rows) x columns [col_begin, col_end).
  std::vector<std::pair<uint64_t, uint64_t>> rows;
  uint64_t col_begin = 0, col_end = 0;
  uint64_t bytes = 0;                        // read bytes
  uint64_t chunk_first = 0, chunk_last = 0;  // global chunks the read spans
  // The same wanted bytes read from holders of slices whose boxes contain
  // them, in their layouts (at most one per holder). Empty in alternatives.
  std::vector<SliceItem> alts;
};

// A holder of slices the plan reads from: its own layout, from the hub.
struct SliceHolderRef {
  std::string worker;
  std::string address;
  uint64_t epoch = 0;
  std::shared_ptr<const PartLayout> layout;
};

struct SlicePlan {
  std::vector<SliceItem> items;         // by (part, offset in the part)
  uint64_t wanted_bytes = 0;            // in the published dtype
  uint64_t read_bytes = 0;              // with the segment overhang
  uint64_t max_item_bytes = 0;          // alternatives included
  std::vector<SliceHolderRef> holders;  // what alts' `part` indexes
};

// Checks the destinations against the manifest (known tensor, box inside
// its global shape, a conversion that exists, scales where F8 needs them,
// sizes) and plans the reads. INVALID_ARGUMENT naming the tensor for bad
// input; FAILED_PRECONDITION for a piece without segment checksums.
// `sources` with a layout of slices (FetchSource::slices) are holders of
// slices: each wanted box is also cut along their boxes (CutAlong, at most
// kMaxSliceCuts pieces per intersection), and each read whose wanted bytes
// lie in one of their boxes gets an alternative read from it, where the
// trainer's piece and the box map onto the tensor by a shift (MatrixOrigin:
// any box of a tensor of at most 2 dimensions; for more, boxes that span
// the middle dimensions). Other sources are ignored here.
Result<SlicePlan> PlanSlices(const Manifest& manifest,
                             const std::vector<SliceDest>& dests,
                             uint64_t item_bytes,
                             const std::vector<FetchSource>& sources = {});

// The sources' chunk ranges, as ranges of the plan's item ids; a holder of
// slices gets the items with an alternative read from it (none if the plan
// does not know it).
std::vector<FetchSource> SourcesForItems(const SlicePlan& plan,
                                         std::vector<FetchSource> sources);

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_FETCH_SLICE_PLAN_H_
