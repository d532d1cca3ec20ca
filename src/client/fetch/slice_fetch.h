// A fetch of slices (Client::FetchSlices): boxes of logical tensors,
// whatever the trainer ranks' layout, planned by PlanSlices
// (slice_plan.h) and run by RunSliceFetch (slice_run.h), in one fetch
// session (fetch_session.h); optionally served onward as a holder of
// slices.
#ifndef TENSORHUB_CLIENT_FETCH_SLICE_FETCH_H_
#define TENSORHUB_CLIENT_FETCH_SLICE_FETCH_H_

#include <string_view>
#include <vector>

#include "client/fetch/fetch_session.h"
#include "client/fetch/slice_plan.h"
#include "client/serving.h"
#include "tensorhub/client.h"

namespace tensorhub::client {

// Client::FetchSlices (tensorhub/client.h), counted in the worker's
// metrics.
Result<FetchStats> FetchSlices(WorkerContext& ctx, Serving& serving,
                               std::string_view model, Version version,
                               const std::vector<TensorSlice>& slices,
                               const FetchOptions& options);

// The caller's slices, checked before the hub is asked (each tensor's
// shape is its box's, its bytes its shape's, all in host memory), as the
// plan takes them.
struct SliceDestinations {
  std::vector<TensorSlice> slices;
  std::vector<SliceDest> dests;
};
Result<SliceDestinations> CheckSlices(std::vector<TensorSlice> slices);

// The body of a fetch of slices, in a session begun for it or handed over
// by a whole fetch of a version read as slices. `ask_with_boxes`:
// BeginFetch scheduled without the boxes, so ask once more with them
// (holders of slices that meet them come first): one more hub call, worth
// it for a reader of some boxes, not for one of whole tensors (BeginFetch
// offers those holders of slices already). `serve`: serve the slices
// onward afterwards (Serving::ServeSlices).
Result<FetchStats> RunSlices(WorkerContext& ctx, Serving& serving,
                             FetchSession& session,
                             const SliceDestinations& destinations,
                             bool ask_with_boxes, bool serve);

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_FETCH_SLICE_FETCH_H_
