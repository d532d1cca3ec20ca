// A bounded, read-only view of what the hub is doing (`tensorhub top`):
// models and versions with their holders, the fetches in flight with their
// sources and progress, and the holders readers measured slowest lately.
//
// The hub builds it from its own state (the reference table and Schedule's
// assignments) and from the small progress reports fetching workers send at
// most once per second per fetch (docs/design.md, "tensorhub top"). It is
// soft state: a fetch's progress is dropped when the fetch ends or the
// reader leaves; a holder's measured rates when the holder leaves.
#ifndef TENSORHUB_SNAPSHOT_H_
#define TENSORHUB_SNAPSHOT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tensorhub/types.h"

namespace tensorhub {

// How much one snapshot may list. The hub clamps each to kMaxSnapshot*; the
// totals in HubSnapshot say how much was left out.
struct SnapshotLimits {
  uint32_t models = 16;
  uint32_t versions_per_model = 4;  // the newest
  uint32_t holders_per_version = 8;
  uint32_t transfers = 32;
  uint32_t slowest = 5;
};
inline constexpr uint32_t kMaxSnapshotModels = 256;
inline constexpr uint32_t kMaxSnapshotVersions = 64;
inline constexpr uint32_t kMaxSnapshotHolders = 64;
inline constexpr uint32_t kMaxSnapshotTransfers = 1024;
inline constexpr uint32_t kMaxSnapshotSlowest = 64;
// A progress report names at most this many sources (more are dropped).
inline constexpr uint32_t kMaxProgressSources = 64;

struct SnapshotHolder {
  WorkerId worker;
  std::string name;      // the worker's name as it registered
  bool filling = false;  // still receiving the version
};

struct SnapshotVersion {
  Version version;
  VersionState state = VersionState::kPending;
  uint64_t total_bytes = 0;
  bool retained = false;
  uint32_t holders_complete = 0;
  uint32_t holders_filling = 0;
  // Complete holders first, then filling ones; at most
  // SnapshotLimits::holders_per_version.
  std::vector<SnapshotHolder> holders;
};

struct SnapshotModel {
  std::string model;
  uint32_t versions_total = 0;
  std::vector<SnapshotVersion> versions;  // the newest, newest first
};

// One source of a fetch in flight, as the reader last reported it.
struct SnapshotSource {
  WorkerId worker;
  std::string name;
  uint64_t bytes = 0;  // read from it so far (0 before the first report)
  double bytes_per_second = 0;
};

// A reader the hub scheduled sources for, whose fetch has not ended.
struct SnapshotTransfer {
  std::string model;
  Version version;
  WorkerId reader;
  std::string reader_name;
  // false until the reader's first progress report (about a second into
  // the fetch): bytes and rates are then unknown.
  bool reported = false;
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
  int64_t elapsed_ms = 0;  // since its data transfer began
  // bytes_done over elapsed_ms: the fetch's mean rate so far.
  double bytes_per_second = 0;
  // Its assigned sources (Schedule), and any other it reported reading.
  std::vector<SnapshotSource> sources;
};

// A holder's recent throughput as its readers measured it (bytes they read
// from it over their fetch's transfer time), averaged over its samples.
struct SnapshotHolderRate {
  WorkerId worker;
  std::string name;
  double bytes_per_second = 0;
  uint32_t samples = 0;
};

struct HubSnapshot {
  uint32_t workers = 0;
  uint32_t models_total = 0;
  std::vector<SnapshotModel> models;  // by name
  uint32_t transfers_total = 0;
  std::vector<SnapshotTransfer> transfers;  // by model, version, reader
  std::vector<SnapshotHolderRate> slowest;  // slowest first
};

}  // namespace tensorhub

#endif  // TENSORHUB_SNAPSHOT_H_
