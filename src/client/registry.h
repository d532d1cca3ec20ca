// What this worker holds and serves: registrations of caller memory per
// (model, version), each fenced by an epoch.
//
// A read names (model, version, epoch). It is served only while that exact
// registration is live; Revoke() fences the epoch at once and Drain() waits
// for the reads already admitted to finish. A registration's memory may be
// reused by its owner only after Drain() succeeded. Thread-safe.
#ifndef TENSORHUB_CLIENT_REGISTRY_H_
#define TENSORHUB_CLIENT_REGISTRY_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/manifest.h"
#include "common/mutex.h"
#include "delta/version_delta.h"
#include "tensorhub/types.h"
#include "transport/transport.h"

namespace tensorhub::client {

struct Holding {
  std::string model;
  Version version;
  uint64_t epoch = 0;
  uint32_t group_size = 1;
  uint64_t chunk_bytes = 0;
  // A trainer rank holds one part (`rank` set, parts = {its part}); a reader
  // that fetched holds every part and knows the full manifest.
  std::optional<uint32_t> rank;
  std::optional<Manifest> manifest;
  std::map<uint32_t, PartLayout> parts;
  std::map<uint32_t, std::vector<uint8_t*>> bases;  // per part, per tensor
  MemoryLocation memory;                            // where every base points
  bool reported = false;                            // the hub acknowledged it
  // A hub acknowledged it once: only then is a trainer rank's part
  // re-reported with rebuild=true to a hub that forgot it (a publish not
  // yet acknowledged must pass the version-number check as a new one).
  bool accepted = false;
  // Still being fetched: only chunks marked with MarkChunk() are served,
  // and ranges inside one chunk once they landed (MarkLanded); a read of a
  // chunk not there yet waits for it (bounded by fill_wait_ms). Requires
  // `manifest`.
  bool filling = false;
  // A holder of slices: parts = {wire::kSliceHolderPart: its own
  // layout}, neither
  // rank nor manifest; reported with AddSliceHolder.
  bool slices = false;
  // The deltas it serves (AttachDelta): base -> their bytes, index and body
  // (re-reported with the holding to a hub that restarted).
  std::map<Version, uint64_t> deltas;
};

// A live registration of a whole version (Registry::PinWhole), with a pin
// that holds off its drain until released, as a read in flight does.
struct WholeCopy {
  Holding holding;
  Manifest manifest;  // the holding's, or its one part's (a group of one)
  std::shared_ptr<void> pin;
};

class Registry final : public transport::ReadSource {
 public:
  explicit Registry(int64_t fill_wait_ms = 10000)
      : fill_wait_ms_(fill_wait_ms) {}

  // Registers memory; returns the new registration's epoch. Replaces a
  // registration of the same (model, version) only after it was revoked.
  // holding.epoch 0: a new epoch; else one ReserveEpoch() returned.
  Result<uint64_t> Add(Holding holding);
  // An epoch for a registration added later (Add with holding.epoch set
  // to it), so that the hub can be told of the registration before the
  // fetch that makes it knows its layout (BeginFetch). A read naming the
  // epoch before the registration exists waits for it, bounded by
  // fill_wait_ms, as a read of a chunk not there yet does. Every
  // reservation ends with Add or CancelReservation.
  uint64_t ReserveEpoch();
  void CancelReservation(uint64_t epoch);
  // Fences the registration: reads not yet admitted are refused. Returns
  // its epoch, NOT_FOUND if there is none.
  Result<uint64_t> Revoke(const std::string& model, Version version);
  // Waits until no admitted read of that epoch is in flight. Only meaningful
  // after Revoke(): a live registration is not waited for.
  Status Drain(const std::string& model, Version version, uint64_t epoch,
               const Deadline& deadline);
  // Live registrations whose memory overlaps [begin, end) of any range.
  std::vector<std::pair<std::string, Version>> Overlapping(
      const std::vector<std::pair<const uint8_t*, uint64_t>>& ranges) const;
  // Whether a live (not revoked) registration of the version exists.
  bool Contains(const std::string& model, Version version) const;
  // Copies of every live registration.
  std::vector<Holding> Snapshot() const;
  // Copies of the live registrations the hub has not acknowledged (usually
  // none: the heartbeat thread asks every second, so no copies then).
  std::vector<Holding> Unreported() const;
  // The hub forgot everything (it restarted): nothing counts as reported.
  void MarkAllUnreported();
  void MarkReported(const std::string& model, Version version, uint64_t epoch,
                    bool reported);
  // A filling registration received and verified global chunk `chunk`:
  // serve it from now on, and wake reads waiting for it.
  void MarkChunk(const std::string& model, Version version, uint64_t epoch,
                 uint64_t chunk);
  // Cut-through: the first `bytes` of global chunk `chunk` of a filling
  // registration have landed (not yet verified): a read of a range inside
  // that chunk that ends within them is served from now on. 0: the chunk's
  // read failed and starts over (nothing of it is served until it lands
  // again or is marked).
  void MarkLanded(const std::string& model, Version version, uint64_t epoch,
                  uint64_t chunk, uint64_t bytes);
  // Every chunk is there: the registration serves like a full copy.
  void FinishFill(const std::string& model, Version version, uint64_t epoch);

  Result<transport::ServeLease> BeginRead(
      const wire::ReadRequest& req) override;

  // ---- Deltas (docs/design.md, "Deltas on slow links") ----
  // The versions of `model` held whole here (live, not filling, every part),
  // oldest first.
  std::vector<Version> WholeVersions(const std::string& model) const;
  // That registration of (model, version), pinned; nullopt if there is
  // none.
  std::optional<WholeCopy> PinWhole(const std::string& model, Version version);
  // Serves `delta` of (model, version) against `base` (reads of the delta
  // parts with that base, wire.md) while registration `epoch` lives;
  // replaces one of the same base. NOT_FOUND if the registration is gone.
  Status AttachDelta(const std::string& model, Version version, uint64_t epoch,
                     Version base,
                     std::shared_ptr<const delta::VersionDelta> delta);
  // Bytes of the deltas the live registrations serve.
  uint64_t delta_bytes() const;

  size_t reads_in_flight() const;
  // Reads BeginRead refused (unknown or revoked registration, a bad range,
  // a chunk that did not arrive in time).
  uint64_t reads_refused() const { return reads_refused_.load(); }
  // Live registrations: complete copies, and fetches still filling.
  struct HeldCounts {
    size_t complete = 0;
    size_t filling = 0;
  };
  HeldCounts held() const;

 private:
  Result<transport::ServeLease> Admit(const wire::ReadRequest& req);
  struct Entry {
    Holding holding;
    uint64_t inflight = 0;  // guarded by Registry::mu_
    bool revoked = false;   // guarded by Registry::mu_
    // The same, for servers waiting on a lease (ServeLease::revoked).
    std::shared_ptr<std::atomic<bool>> revoked_flag =
        std::make_shared<std::atomic<bool>>(false);
    std::vector<uint8_t> have;  // per global chunk, while filling
    // Per global chunk, while filling: its bytes landed so far (MarkLanded).
    std::vector<uint64_t> landed;
    // The whole registered memory, for transports that register it once
    // per publish (transport.h). Destroyed once the registration is revoked
    // and drained (guarded by Registry::mu_), before Drain() returns.
    std::unique_ptr<transport::Registration> registration;
    // The manifest as a source serves it (wire::kManifestPart), encoded on the
    // first read of it (outside the lock).
    std::shared_ptr<const std::string> manifest_bytes;  // Registry::mu_
    // Deltas of the version it serves, by base (Registry::mu_).
    std::map<Version, std::shared_ptr<const delta::VersionDelta>> deltas;
  };
  // The whole manifest of what `h` holds, encoded as the hub encodes it,
  // or NOT_FOUND for a trainer rank of a group or a slice holder (which
  // hold a part only). Reads only what Register() fixed: no lock needed.
  static Result<std::shared_ptr<const std::string>> EncodeManifestOf(
      const Holding& h, const std::string& name);
  // A read of wire::kManifestPart once `e.manifest_bytes` is set.
  Result<transport::ServeLease> ServeManifest(Entry& e,
                                              const wire::ReadRequest& req,
                                              const std::string& name)
      TH_REQUIRES(mu_);
  // A read of a delta part (wire::kDeltaIndexPart, kDeltaPart).
  Result<transport::ServeLease> ServeDelta(Entry& e,
                                           const wire::ReadRequest& req,
                                           const std::string& name)
      TH_REQUIRES(mu_);
  // The pin of a read or of PinWhole: its deleter ends it.
  std::shared_ptr<void> PinOf(const std::shared_ptr<Entry>& e) TH_REQUIRES(mu_);
  Entry* FindLocked(const std::string& model, Version version, uint64_t epoch)
      TH_REQUIRES(mu_);
  // Admit's steps: a filling registration's wait for the chunks a read
  // touches, and the lease of an admitted read.
  Status WaitForChunks(MutexLock& lock, Entry& e, const wire::ReadRequest& req,
                       const std::string& name) TH_REQUIRES(mu_);
  transport::ServeLease LeaseOf(const std::shared_ptr<Entry>& e,
                                const PartLayout& layout,
                                const wire::ReadRequest& req) TH_REQUIRES(mu_);
  using Key = std::pair<std::string, Version>;

  const int64_t fill_wait_ms_;
  std::atomic<uint64_t> reads_refused_{0};
  mutable Mutex mu_;
  std::condition_variable drained_;
  std::condition_variable chunk_arrived_;
  uint64_t next_epoch_ TH_GUARDED_BY(mu_) = 1;
  // Epochs reserved and not yet added or cancelled (one per fetch running).
  std::set<uint64_t> reserved_ TH_GUARDED_BY(mu_);
  std::map<Key, std::shared_ptr<Entry>> live_ TH_GUARDED_BY(mu_);
  // Revoked entries with reads still in flight, by epoch.
  std::map<uint64_t, std::shared_ptr<Entry>> draining_ TH_GUARDED_BY(mu_);
};

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_REGISTRY_H_
