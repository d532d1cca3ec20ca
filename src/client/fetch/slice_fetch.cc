#include "client/fetch/slice_fetch.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "client/fetch/slice_run.h"
#include "client/tensor_checks.h"

namespace tensorhub::client {

Result<SliceDestinations> CheckSlices(std::vector<TensorSlice> slices) {
  SliceDestinations out;
  std::vector<TensorRef> refs;
  for (const TensorSlice& s : slices) {
    const TensorRef& t = s.tensor;
    if (t.spec.shape != s.box.extent) {
      return InvalidArgument("slice of tensor '" + t.spec.name + "': shape " +
                             DescribeSpec(t.spec) + " is not the box's " +
                             BoxToString(s.box));
    }
    TH_ASSIGN_OR_RETURN(uint64_t size, t.spec.ByteSize());
    if (size != t.bytes) {
      return InvalidArgument("slice of tensor '" + t.spec.name + "' has " +
                             std::to_string(t.bytes) + " bytes, needs " +
                             std::to_string(size));
    }
    refs.push_back(t);
    out.dests.push_back({t.spec.name, s.box, t.spec.dtype,
                         static_cast<uint8_t*>(t.data), s.fp8_scales});
  }
  TH_ASSIGN_OR_RETURN(MemoryLocation memory, CheckMemory(refs, "fetch"));
  if (!memory.is_host()) {
    return FailedPrecondition(
        "fetch of slices: device memory is not supported yet; fetch into "
        "host memory");
  }
  out.slices = std::move(slices);
  return out;
}

namespace {

// BeginFetch scheduled without the boxes: the sources of a schedule that
// names them, if the hub gives any (holders of slices that meet them come
// first); else BeginFetch's stand.
std::vector<FetchSource> WithHoldersOfSlices(const SourceRefresher& schedule,
                                             std::vector<FetchSource> first) {
  Result<SourceUpdate> with_boxes = schedule({});
  if (with_boxes.ok() && !with_boxes->sources.empty() &&
      !with_boxes->unavailable.has_value()) {
    return std::move(with_boxes->sources);
  }
  return first;
}

}  // namespace

Result<FetchStats> RunSlices(WorkerContext& ctx, Serving& serving,
                             FetchSession& session, const SliceDestinations& d,
                             bool ask_with_boxes, bool serve) {
  const Manifest& manifest = session.manifest();
  Result<SlicePlan> plan =
      PlanSlices(manifest, d.dests, manifest.chunk_bytes());
  if (!plan.ok()) return plan.status().WithContext(session.name());
  std::vector<TensorRef> refs;
  for (const TensorSlice& s : d.slices) refs.push_back(s.tensor);
  TH_RETURN_IF_ERROR(
      serving.ReleaseOverlapping(RangesOf(refs), session.work()));
  std::vector<SliceWant> wants;
  for (const SliceDest& dest : d.dests) wants.push_back({dest.name, dest.box});
  const SourceRefresher refresh = session.Refresher(std::move(wants));
  TH_ASSIGN_OR_RETURN(std::vector<FetchSource> sources, session.FirstSources());
  if (ask_with_boxes && !d.dests.empty()) {
    sources = WithHoldersOfSlices(refresh, std::move(sources));
  }
  if (std::any_of(sources.begin(), sources.end(),
                  [](const FetchSource& s) { return s.slices != nullptr; })) {
    // Holders of slices: plan again with their boxes (alternative reads).
    plan = PlanSlices(manifest, d.dests, manifest.chunk_bytes(), sources);
    if (!plan.ok()) return plan.status().WithContext(session.name());
  }
  const FetcherOptions fo = session.StartRun(plan->read_bytes);
  const SliceJob job{session.model(), session.version(), &manifest, &*plan,
                     &d.dests};
  Result<FetchReport> rep = RunSliceFetch(
      ctx.transport, job, std::move(sources), refresh, fo, session.work());
  if (!rep.ok()) return rep.status();
  // The slices are not served as a copy of the version (FetchDone ends the
  // fetch at the hub); with `serve`, as a holder of slices.
  return session.Finish(*rep, [&] {
    if (serve) {
      serving.ServeSlices(session.model(), session.version(), manifest,
                          d.slices, session.deadline());
    }
    return false;
  });
}

Result<FetchStats> FetchSlices(WorkerContext& ctx, Serving& serving,
                               std::string_view model, Version version,
                               const std::vector<TensorSlice>& slices,
                               const FetchOptions& options) {
  auto body = [&]() -> Result<FetchStats> {
    TH_ASSIGN_OR_RETURN(SliceDestinations d, CheckSlices(slices));
    TH_ASSIGN_OR_RETURN(
        std::unique_ptr<FetchSession> session,
        FetchSession::Begin(ctx, model, version, options, std::nullopt));
    return RunSlices(ctx, serving, *session, d, /*ask_with_boxes=*/true,
                     /*serve=*/options.serve_slices);
  };
  return CountOutcome(ctx.metrics, body());
}

}  // namespace tensorhub::client
