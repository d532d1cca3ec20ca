// A whole fetch (Client::Fetch): every tensor of a version into the
// caller's tensors, chunk by chunk (RunFetch), served onward as the chunks
// arrive (partial-prefix serving) and as a complete copy afterwards. A
// version published as pieces, or one the hub says is held in part only by
// holders of slices, is fetched as whole logical tensors through the slice
// body (slice_fetch.h), in the same session, and served afterwards as a
// holder of slices whose boxes are the whole tensors.
#ifndef TENSORHUB_CLIENT_FETCH_WHOLE_FETCH_H_
#define TENSORHUB_CLIENT_FETCH_WHOLE_FETCH_H_

#include <string_view>
#include <vector>

#include "client/serving.h"
#include "tensorhub/client.h"

namespace tensorhub::client {

// Client::Fetch (tensorhub/client.h), counted in the worker's metrics.
Result<FetchStats> FetchWhole(WorkerContext& ctx, Serving& serving,
                              std::string_view model, Version version,
                              const std::vector<TensorRef>& destination,
                              const FetchOptions& options);

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_FETCH_WHOLE_FETCH_H_
