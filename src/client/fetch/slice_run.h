// The run of a partial fetch (slice_plan.h plans it): RunSliceFetch runs
// the items over the holders like RunFetch runs chunks (the same FetchPlan:
// striping, failover, work stealing, deadlines): bytes the caller wants land
// straight in its memory, the segment overhang in a per-stream scratch
// buffer; every segment read is verified (XXH3-64) before the item counts.
// With a dtype conversion the item lands in the scratch buffer, is verified
// there, and is converted into the caller's memory.
#ifndef TENSORHUB_CLIENT_FETCH_SLICE_RUN_H_
#define TENSORHUB_CLIENT_FETCH_SLICE_RUN_H_

#include <string>
#include <vector>

#include "client/fetch/fetcher.h"
#include "client/fetch/slice_plan.h"
#include "common/manifest.h"

namespace tensorhub::client {

struct SliceJob {
  std::string model;
  Version version;
  const Manifest* manifest = nullptr;
  const SlicePlan* plan = nullptr;
  const std::vector<SliceDest>* dests = nullptr;
};

// `sources` and the refresher's answers name chunk ranges (as the hub
// gives them); they are mapped onto items here.
Result<FetchReport> RunSliceFetch(transport::Transport& transport,
                                  const SliceJob& job,
                                  std::vector<FetchSource> sources,
                                  const SourceRefresher& refresh,
                                  const FetcherOptions& options,
                                  const Deadline& deadline);

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_FETCH_SLICE_RUN_H_
