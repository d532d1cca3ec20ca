#include "client/fetch/delta_choice.h"

#include <algorithm>

#include "delta/version_delta.h"

namespace tensorhub::client {

bool DeltaWins(uint64_t version_bytes, uint64_t delta_bytes,
               double link_bytes_per_s, double apply_bytes_per_s) {
  if (link_bytes_per_s <= 0 || apply_bytes_per_s <= 0) return false;
  const double v = static_cast<double>(version_bytes);
  const double d = static_cast<double>(delta_bytes);
  return d / link_bytes_per_s + v / apply_bytes_per_s < v / link_bytes_per_s;
}

double AssumedLinkBytesPerSecond(const Labels& reader, const Labels& source,
                                 const DeltaOptions& options) {
  return reader.datacenter == source.datacenter
             ? options.datacenter_link_bytes_per_s
             : options.wide_area_link_bytes_per_s;
}

void ChooseDeltas(std::vector<FetchSource>* sources, Version base,
                  uint64_t version_bytes, const Labels& reader,
                  const DeltaOptions& options) {
  for (FetchSource& s : *sources) {
    s.delta.reset();
    if (!options.read || s.slices != nullptr) continue;
    for (const DeltaOffer& o : s.delta_offers) {
      if (o.base == base &&
          DeltaWins(version_bytes, o.bytes,
                    AssumedLinkBytesPerSecond(reader, s.labels, options),
                    options.apply_bytes_per_s)) {
        s.delta = o;
      }
    }
  }
}

bool NearbyDeltasWin(const DeltaOptions& options) {
  constexpr uint64_t kVersion = 1ull << 30;  // the choice scales with it
  return options.read &&
         DeltaWins(kVersion,
                   static_cast<uint64_t>(static_cast<double>(kVersion) *
                                         kAssumedDeltaShare),
                   options.datacenter_link_bytes_per_s,
                   options.apply_bytes_per_s);
}

void ReadCompleteDeltaSourceAlone(std::vector<FetchSource>* sources) {
  auto it = std::find_if(
      sources->begin(), sources->end(),
      [](const FetchSource& s) { return s.delta.has_value() && !s.filling; });
  if (it == sources->end() || sources->size() == 1) return;
  FetchSource alone = std::move(*it);
  sources->assign(1, std::move(alone));
}

bool AnySourceNearby(const std::vector<FetchSource>& sources,
                     const Labels& reader) {
  return std::any_of(sources.begin(), sources.end(), [&](const FetchSource& s) {
    return s.labels.datacenter == reader.datacenter;
  });
}

std::optional<DeltaBase> PickDeltaBase(Registry& registry,
                                       const std::string& model,
                                       Version version,
                                       const Manifest& manifest,
                                       const std::vector<Version>& offered) {
  const std::vector<Version> held = registry.WholeVersions(model);
  std::optional<DeltaBase> newest, named;
  for (auto it = held.rbegin(); it != held.rend(); ++it) {
    if (*it >= version) continue;
    if (newest.has_value() &&
        std::find(offered.begin(), offered.end(), *it) == offered.end()) {
      continue;  // an older one is only worth it if a source offers it
    }
    std::optional<WholeCopy> c = registry.PinWhole(model, *it);
    if (!c.has_value() || !c->holding.memory.is_host() ||
        !delta::CheckSameChunks(c->manifest, manifest).ok()) {
      continue;
    }
    DeltaBase b{*it, c->holding.epoch, std::move(c->manifest)};
    const bool is_offered =
        std::find(offered.begin(), offered.end(), *it) != offered.end();
    if (!newest.has_value()) newest = b;
    if (is_offered) {
      named = std::move(b);
      break;
    }
  }
  return named.has_value() ? named : newest;
}

}  // namespace tensorhub::client
