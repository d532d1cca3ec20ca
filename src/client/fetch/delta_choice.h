// Which sources a fetch reads through a delta (docs/design.md, "Deltas on
// slow links"): the policy, with no I/O. A reader that holds an older
// version whole (the base) reads a source that offers the delta from that
// base through it where that wins over reading the version whole, after
// the CPU cost of applying it; on a fast link (inside a datacenter) full
// chunks stay. The choice is per source.
//
// Pure functions, any thread.
#ifndef TENSORHUB_CLIENT_FETCH_DELTA_CHOICE_H_
#define TENSORHUB_CLIENT_FETCH_DELTA_CHOICE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "client/fetch/fetcher.h"
#include "client/registry.h"
#include "common/manifest.h"
#include "tensorhub/client.h"

namespace tensorhub::client {

// Whether `version_bytes` read as `delta_bytes` of delta over a link of
// `link_bytes_per_s` and applied at `apply_bytes_per_s` take less time than
// the version read whole over the same link:
//   delta / link + version / apply  <  version / link.
bool DeltaWins(uint64_t version_bytes, uint64_t delta_bytes,
               double link_bytes_per_s, double apply_bytes_per_s);

// The link the choice assumes between a reader and a source: the
// datacenter's inside one datacenter, the wide area's between two.
double AssumedLinkBytesPerSecond(const Labels& reader, const Labels& source,
                                 const DeltaOptions& options);

// Sets each source's `delta` to its offer from `base` where DeltaWins over
// its assumed link, and clears it elsewhere (no offer, or full chunks win).
void ChooseDeltas(std::vector<FetchSource>* sources, Version base,
                  uint64_t version_bytes, const Labels& reader,
                  const DeltaOptions& options);

// Whether deltas win on this worker's link inside its datacenter too:
// whether a delta of kAssumedDeltaShare of a version, applied, beats the
// version whole over DeltaOptions::datacenter_link_bytes_per_s (for any
// version size). Told to the hub at registration (it then sends the
// worker to a holder of a ready delta nearby), and a reader waits for a
// delta being made in its datacenter only then. The choice of a source
// once a delta is offered uses the delta's real size (ChooseDeltas).
inline constexpr double kAssumedDeltaShare = 0.05;  // 1-5% at RL rates
bool NearbyDeltasWin(const DeltaOptions& options);

// When a source holding every chunk is read through a delta, the fetch
// reads it alone: any other source would send its share of the chunks
// whole. Failures go to the hub for new sources, as any source's.
void ReadCompleteDeltaSourceAlone(std::vector<FetchSource>* sources);

// Whether any source is in this reader's datacenter.
bool AnySourceNearby(const std::vector<FetchSource>& sources,
                     const Labels& reader);

// The base a fetch of `version` (of `manifest`) would apply deltas to: the
// newest version of `model` held whole here, older than `version`, in host
// memory, cut into the same chunks; one named in `offered` (some source's
// offer) first. Pins nothing: its bytes are pinned chunk by chunk as they
// are used (delta_reads.h).
struct DeltaBase {
  Version version;
  uint64_t epoch = 0;
  Manifest manifest;
};
std::optional<DeltaBase> PickDeltaBase(Registry& registry,
                                       const std::string& model,
                                       Version version,
                                       const Manifest& manifest,
                                       const std::vector<Version>& offered);

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_FETCH_DELTA_CHOICE_H_
