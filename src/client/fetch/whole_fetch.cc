#include "client/fetch/whole_fetch.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "client/fetch/delta_choice.h"
#include "client/fetch/delta_reads.h"
#include "client/fetch/fetch_session.h"
#include "client/fetch/slice_fetch.h"
#include "client/tensor_checks.h"
#include "common/log.h"

namespace tensorhub::client {
namespace {

bool HasPieces(const Manifest& m) {
  for (const PartLayout& p : m.parts()) {
    for (const TensorLayout& t : p.tensors) {
      if (t.sharded()) return true;
    }
  }
  return false;
}

// A whole fetch of a version published as pieces: every logical tensor
// once, with its global shape and dtype, as a slice of all of it.
Result<std::vector<TensorSlice>> WholeSlices(const Manifest& manifest,
                                             const std::vector<TensorRef>& dest,
                                             const std::string& vname) {
  std::map<std::string, const TensorLayout*> logical;
  for (const PartLayout& p : manifest.parts()) {
    for (const TensorLayout& t : p.tensors) logical.emplace(t.spec.name, &t);
  }
  std::vector<TensorSlice> out;
  for (const TensorRef& d : dest) {
    auto it = logical.find(d.spec.name);
    if (it == logical.end()) {
      return InvalidArgument("destination tensor '" + d.spec.name +
                             "' is not part of " + vname +
                             " (or is named twice)");
    }
    const TensorLayout& t = *it->second;
    if (d.spec.dtype != t.spec.dtype || d.spec.shape != t.GlobalShape()) {
      const TensorSpec global{t.spec.name, t.spec.dtype, t.GlobalShape()};
      return InvalidArgument("destination tensor '" + d.spec.name + "' is " +
                             DescribeSpec(d.spec) + " but " + vname + " has " +
                             DescribeSpec(global));
    }
    out.push_back({d, Box::Whole(d.spec.shape), {}});
    logical.erase(it);
  }
  if (!logical.empty()) {
    return InvalidArgument("destination lacks tensor '" +
                           logical.begin()->first + "' of " + vname);
  }
  return out;
}

// Checks `dest` against the manifest, by tensor name (every tensor of the
// version, once, with its dtype, shape and size): the run's job.
Result<FetchJob> MapDestination(const FetchSession& session,
                                const std::vector<TensorRef>& dest) {
  const std::string& vname = session.name();
  std::map<std::string, const TensorRef*> by_name;
  for (const TensorRef& t : dest) {
    if (!by_name.emplace(t.spec.name, &t).second) {
      return InvalidArgument("destination names tensor '" + t.spec.name +
                             "' twice");
    }
  }
  FetchJob job;
  TH_ASSIGN_OR_RETURN(job.memory, CheckMemory(dest, "fetch"));
  job.model = session.model();
  job.version = session.version();
  job.manifest = &session.manifest();
  for (const PartLayout& p : session.manifest().parts()) {
    std::vector<uint8_t*> bases;
    for (const TensorLayout& t : p.tensors) {
      auto it = by_name.find(t.spec.name);
      if (it == by_name.end()) {
        return InvalidArgument("destination lacks tensor '" + t.spec.name +
                               "' of " + vname);
      }
      const TensorRef& d = *it->second;
      if (d.spec.dtype != t.spec.dtype || d.spec.shape != t.spec.shape) {
        return InvalidArgument("destination tensor '" + t.spec.name + "' is " +
                               DescribeSpec(d.spec) + " but " + vname +
                               " has " + DescribeSpec(t.spec));
      }
      if (d.bytes != t.bytes || (d.data == nullptr && t.bytes > 0)) {
        return InvalidArgument("destination tensor '" + t.spec.name + "' has " +
                               std::to_string(d.bytes) + " bytes, needs " +
                               std::to_string(t.bytes));
      }
      bases.push_back(static_cast<uint8_t*>(d.data));
      by_name.erase(it);
    }
    job.dest_bases.push_back(std::move(bases));
  }
  if (!by_name.empty()) {
    return InvalidArgument("destination tensor '" + by_name.begin()->first +
                           "' is not part of " + vname);
  }
  return job;
}

// Tells the hub this reader will not make the delta it read across the
// wide-area link for its datacenter after all (HubState::ClaimRelay: the
// hub claimed it for the reader when it pointed it at that delta), so that
// the datacenter's readers waiting for it stop waiting. Only when some
// source in another datacenter offered one (the hub's cue); a claim that
// was not made answers NOT_FOUND, which is fine.
void DropRelayClaims(WorkerContext& ctx, const FetchSession& session,
                     const std::vector<FetchSource>& sources) {
  for (const FetchSource& s : sources) {
    if (s.labels.datacenter == ctx.options.labels.datacenter) continue;
    for (const DeltaOffer& d : s.delta_offers) {
      Result<bool> r = ctx.hub.ReportDelta(
          ctx.membership.id(), session.model(), session.version(), d.base,
          DeltaAction::kDrop, 0, ctx.options.rpc_timeout_ms);
      if (!r.ok() && r.status().code() != StatusCode::kNotFound) {
        TH_LOG(DEBUG) << "drop relayed delta: " << r.status().ToString();
      }
    }
  }
}

// Deltas (docs/design.md, "Deltas on slow links"): the base this fetch
// applies deltas to, if it holds one, and which sources it reads through
// them (ChooseDeltas, per source). A reader with a delta from its base
// being made where it would read it (HubState::DeltaPending: across the
// wide-area link while no source is nearby, or in its own datacenter when
// its link there is slow enough for a delta to win: NearbyDeltasWin)
// asks the hub again for up to DeltaOptions::wait_ms before it reads the
// version whole. A source read through a delta that holds every chunk is
// read alone: the others would send their chunks whole.
std::optional<DeltaBase> PrepareDeltas(WorkerContext& ctx,
                                       FetchSession& session,
                                       const FetchJob& job,
                                       std::vector<FetchSource>* sources) {
  const DeltaOptions& o = ctx.options.deltas;
  std::optional<DeltaBase> base;
  if (o.read && job.memory.is_host()) {
    std::vector<Version> offered;
    for (const FetchSource& s : *sources) {
      for (const DeltaOffer& d : s.delta_offers) offered.push_back(d.base);
    }
    base = PickDeltaBase(ctx.registry, session.model(), session.version(),
                         session.manifest(), offered);
  }
  if (!base.has_value()) {
    DropRelayClaims(ctx, session, *sources);
    return std::nullopt;
  }
  const uint64_t bytes = session.manifest().total_bytes();
  auto choose = [&](std::vector<FetchSource>& s) {
    ChooseDeltas(&s, base->version, bytes, ctx.options.labels, o);
    return std::any_of(s.begin(), s.end(), [](const FetchSource& f) {
      return f.delta.has_value();
    });
  };
  const bool wait_nearby = NearbyDeltasWin(o);
  if (!choose(*sources) && session.delta_pending() && o.wait_ms > 0 &&
      (wait_nearby || !AnySourceNearby(*sources, ctx.options.labels))) {
    TH_LOG(INFO) << "fetch " << session.name() << ": a delta from "
                 << base->version.value() << " is being made; waiting up to "
                 << o.wait_ms << " ms for it";
    const bool got = session.AwaitSources(choose, o.wait_ms);
    if (got) {
      Result<std::vector<FetchSource>> again = session.FirstSources();
      if (again.ok()) {
        *sources = std::move(again).value();
        choose(*sources);
      }
    }
    TH_LOG(INFO) << "fetch " << session.name() << ": "
                 << (got ? "the delta is ready" : "reading it whole");
  }
  ReadCompleteDeltaSourceAlone(sources);
  const bool relays =
      o.serve &&
      std::any_of(sources->begin(), sources->end(), [&](const FetchSource& s) {
        return s.delta.has_value() &&
               s.labels.datacenter != ctx.options.labels.datacenter;
      });
  if (!relays) DropRelayClaims(ctx, session, *sources);
  return base;
}

// A version read as slices (of pieces, or held in part only by holders of
// slices): the destination names the logical tensors, which come whole
// through the slice body and, with `serve`, are served onward afterwards
// as a holder of slices whose boxes are the whole tensors. The hub takes
// no filling registration then; one an older hub took is withdrawn.
Result<FetchStats> FetchWholeAsSlices(WorkerContext& ctx, Serving& serving,
                                      FetchSession& session,
                                      const std::vector<TensorRef>& dest) {
  session.DropFilling();
  TH_ASSIGN_OR_RETURN(std::vector<TensorSlice> whole,
                      WholeSlices(session.manifest(), dest, session.name()));
  TH_ASSIGN_OR_RETURN(SliceDestinations d, CheckSlices(std::move(whole)));
  return RunSlices(ctx, serving, session, d, /*ask_with_boxes=*/false,
                   /*serve=*/session.options().serve);
}

// Map the destination onto the manifest, release memory that still serves
// an older version, register the destination as a filling holder, run the
// chunks, report the complete copy. The steps are timed as FetchStats'
// stages (tensorhub/client.h).
Result<FetchStats> FetchWholeBody(WorkerContext& ctx, Serving& serving,
                                  std::string_view model, Version version,
                                  const std::vector<TensorRef>& dest,
                                  const FetchOptions& opts) {
  // BeginFetch registers the destination at the hub as a filling holder
  // under an epoch reserved here, before the destination is mapped: reads
  // of the epoch that arrive before it is registered below wait for it.
  EpochReservation reserved(ctx.registry, opts.serve);
  if (opts.serve) ctx.addresses.WarnIfUnreachable();
  TH_ASSIGN_OR_RETURN(
      std::unique_ptr<FetchSession> session,
      FetchSession::Begin(ctx, model, version, opts, reserved.epoch()));
  // The hub offers holders of slices to a whole fetch only of a version
  // it must read as slices (hub_state.h, BeginFetch).
  if (HasPieces(session->manifest()) || session->OffersHoldersOfSlices()) {
    return FetchWholeAsSlices(ctx, serving, *session, dest);
  }
  TH_ASSIGN_OR_RETURN(FetchJob job, MapDestination(*session, dest));
  TH_RETURN_IF_ERROR(
      serving.ReleaseOverlapping(RangesOf(dest), session->work()));
  FillingCopy fill(serving, session->model(), session->version(),
                   session->deadline());
  if (opts.serve && fill.Register(session->manifest(), job, reserved,
                                  session->filling_at_hub())) {
    session->HandOverFilling();
  } else {
    session->DropFilling();
  }
  TH_ASSIGN_OR_RETURN(std::vector<FetchSource> sources,
                      session->FirstSources());
  SourceRefresher refresh = session->Refresher();
  std::optional<DeltaReads> deltas;
  if (std::optional<DeltaBase> base =
          PrepareDeltas(ctx, *session, job, &sources)) {
    const Version b = base->version;
    // Keeps what it receives, to serve its datacenter (ClaimRelay) rather
    // than compute it again, when it serves deltas at all.
    deltas.emplace(ctx.registry, session->model(), session->version(),
                   session->manifest(), std::move(*base),
                   ctx.options.deltas.serve && opts.serve,
                   ctx.options.deltas.max_memory_bytes);
    job.deltas = &*deltas;
    // Sources the hub names later are chosen the same way.
    refresh =
        [inner = std::move(refresh), b,
         bytes = session->manifest().total_bytes(), labels = ctx.options.labels,
         o = ctx.options.deltas](
            const std::vector<std::string>& failed) -> Result<SourceUpdate> {
      Result<SourceUpdate> u = inner(failed);
      if (u.ok()) ChooseDeltas(&u->sources, b, bytes, labels, o);
      return u;
    };
  }
  FetcherOptions fo =
      session->StartRun(session->manifest().total_bytes(), fill.OnChunk());
  fo.on_landed = fill.OnLanded();
  session->FollowRechecks(fo);
  Result<FetchReport> rep = RunFetch(ctx.transport, job, std::move(sources),
                                     refresh, fo, session->work());
  // A failed run: `fill` aborts (fence, drain, withdraw), then the session
  // ends the fetch at the hub.
  if (!rep.ok()) return rep.status();
  if (deltas.has_value()) {
    fill.SetReceivedDelta(deltas->base(), deltas->TakeReceived());
  }
  return session->Finish(*rep, [&] { return fill.Complete(); });
}

}  // namespace

Result<FetchStats> FetchWhole(WorkerContext& ctx, Serving& serving,
                              std::string_view model, Version version,
                              const std::vector<TensorRef>& dest,
                              const FetchOptions& opts) {
  return CountOutcome(ctx.metrics,
                      FetchWholeBody(ctx, serving, model, version, dest, opts));
}

}  // namespace tensorhub::client
