// What a worker serves, and the hub's record of it: a trainer rank's part
// (Publish), withdrawn with a drain (Unpublish: the mutability contract), a
// fetch's destination served while it fills and afterwards (FillingCopy),
// and slices a fetch verified, served onward (ServeSlices). Every
// registration lives in the worker's Registry; the hub is told through
// WorkerContext::hub, and what it cannot be told now is left to the
// membership's heartbeat (Membership::Withdraw).
//
// Threads: every method may be called from any thread.
#ifndef TENSORHUB_CLIENT_SERVING_H_
#define TENSORHUB_CLIENT_SERVING_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "client/fetch/fetcher.h"
#include "client/tensor_checks.h"
#include "client/worker_context.h"
#include "common/deadline.h"
#include "delta/version_delta.h"
#include "tensorhub/client.h"

namespace tensorhub::client {

class Serving {
 public:
  explicit Serving(WorkerContext& ctx) : ctx_(ctx) {}
  Serving(const Serving&) = delete;
  Serving& operator=(const Serving&) = delete;

  // Client::Publish and Client::Unpublish (tensorhub/client.h).
  Status Publish(std::string_view model, Version version,
                 const std::vector<TensorRef>& tensors,
                 const PublishOptions& opts);
  Status Unpublish(std::string_view model, Version version, int64_t timeout_ms,
                   bool force);

  // Waits for the reads in flight of a revoked registration
  // (Registry::Drain), observed by the metrics.
  Status Drain(const std::string& model, Version version, uint64_t epoch,
               const Deadline& deadline);

  // The mutability contract on a reader's side: every registration whose
  // memory overlaps `ranges` stops serving its version (Unpublish, waiting
  // for its reads) before a fetch overwrites the memory.
  Status ReleaseOverlapping(const std::vector<MemoryRange>& ranges,
                            const Deadline& deadline);

  // After a verified fetch of slices: serves them onward as a holder of
  // slices. The segment checksums are computed here, over the bytes just
  // verified, and registered with the hub beside the boxes (docs/design.md,
  // "Holders of slices"). Best effort: a slice that cannot be served
  // (converted, a tensor named twice, this worker serves the version
  // already) is logged and the fetch still succeeds.
  void ServeSlices(const std::string& model, Version version,
                   const Manifest& manifest,
                   const std::vector<TensorSlice>& slices,
                   const Deadline& deadline);

  WorkerContext& context() const { return ctx_; }

 private:
  // Publish's hub call, registering again first if the hub does not know
  // this worker (it restarted), within `deadline`.
  Status TellHubOfPart(const std::string& model, Version version,
                       const PublishOptions& opts, const PartLayout& part,
                       uint64_t epoch, const Deadline& deadline);

  WorkerContext& ctx_;
};

// An epoch reserved for a fetch destination's registration
// (Registry::ReserveEpoch), so that BeginFetch can tell the hub of it before
// the destination is mapped; cancelled unless a FillingCopy used it.
class EpochReservation {
 public:
  EpochReservation(Registry& registry, bool reserve) : registry_(registry) {
    if (reserve) epoch_ = registry_.ReserveEpoch();
  }
  ~EpochReservation() {
    if (epoch_.has_value()) registry_.CancelReservation(*epoch_);
  }
  EpochReservation(const EpochReservation&) = delete;
  EpochReservation& operator=(const EpochReservation&) = delete;
  std::optional<uint64_t> epoch() const { return epoch_; }
  void Used() { epoch_.reset(); }

 private:
  Registry& registry_;
  std::optional<uint64_t> epoch_;
};

// A whole fetch's destination, served while it fills (partial-prefix
// serving: each chunk once verified) and as a complete copy afterwards.
// Until Complete(), every exit aborts it (Abort, also on destruction): the
// registration is fenced and drained (the caller may overwrite the memory
// once the fetch returns) and the hub withdraws the reference.
class FillingCopy {
 public:
  // `deadline`: the fetch's, which the cleanup of a failed one keeps to.
  FillingCopy(Serving& serving, const std::string& model, Version version,
              const Deadline& deadline)
      : serving_(serving),
        model_(model),
        version_(version),
        deadline_(deadline) {}
  ~FillingCopy() { Abort(); }
  FillingCopy(const FillingCopy&) = delete;
  FillingCopy& operator=(const FillingCopy&) = delete;

  // Registers the destination `job` as a filling holder under the reserved
  // epoch. `reported`: the hub took the registration already (BeginFetch);
  // if not, the heartbeat reports it. False (logged) if it could not be
  // registered: the fetch then only fetches.
  bool Register(const Manifest& manifest, const FetchJob& job,
                EpochReservation& reserved, bool reported);
  // The fetch's on_chunk: serves each chunk once verified (none before
  // Register).
  std::function<void(uint64_t global_chunk)> OnChunk() const;
  // The fetch's on_landed: serves a range inside a chunk once its bytes
  // have landed, before the chunk is verified (cut-through; none before
  // Register).
  std::function<void(uint64_t global_chunk, uint64_t bytes)> OnLanded() const;
  // The fetch succeeded: serves the whole copy and reports it to the hub
  // (AddHolder), which also ends the fetch there. False if nothing was
  // registered (nothing reported).
  bool Complete();
  // The fetch failed: stop serving the partial copy and withdraw it.
  void Abort();
  // The delta (`base` -> this version) the fetch received whole
  // (DeltaReads::TakeReceived): Complete offers it to serve as it is.
  void SetReceivedDelta(Version base,
                        std::shared_ptr<const delta::VersionDelta> delta) {
    received_base_ = base;
    received_ = std::move(delta);
  }

 private:
  Serving& serving_;
  const std::string model_;
  const Version version_;
  const Deadline& deadline_;
  const Manifest* manifest_ = nullptr;
  std::optional<uint64_t> epoch_;  // registered, not completed or aborted
  Version received_base_;
  std::shared_ptr<const delta::VersionDelta> received_;
};

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_SERVING_H_
