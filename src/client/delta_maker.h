// Makes and serves deltas (docs/design.md, "Deltas on slow links"). When
// this worker comes to hold a version whole (a publish of a whole version,
// a whole fetch) while it also holds an older version of the model whole,
// cut into the same chunks, it asks the hub whether to compute the delta
// between them: the hub grants it to the first worker asking per (base,
// version), so a delta is computed once in the fleet, not once per reader.
// The computation runs on this unit's own thread; the delta is served with
// the version's registration (Registry::AttachDelta) and announced to the
// hub, which hands it to readers holding the base behind a slow link.
//
// Both versions are pinned from Offer until the delta is made (or not): an
// Unpublish of either waits for it, as for a read in flight, so a trainer
// that publishes v and then unpublishes v-1 never loses the delta to the
// race. Memory: the deltas served, at most DeltaOptions::max_memory_bytes
// in all; one that would not fit is not made.
//
// Threads: Offer, WaitIdle and the counters from any thread; the work runs
// on one thread of its own, started by the first Offer, stopped by Stop()
// (or the destructor).
#ifndef TENSORHUB_CLIENT_DELTA_MAKER_H_
#define TENSORHUB_CLIENT_DELTA_MAKER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "client/control_plane.h"
#include "client/membership.h"
#include "client/registry.h"
#include "common/deadline.h"
#include "common/mutex.h"
#include "delta/version_delta.h"
#include "tensorhub/client.h"

namespace tensorhub::client {

class DeltaMaker {
 public:
  // Offers waiting for the thread beyond this are dropped (logged): the
  // versions then travel whole.
  static constexpr size_t kMaxQueued = 4;

  // Borrows its arguments (Client::Impl owns them; they outlive this).
  DeltaMaker(const ClientOptions& options, ControlPlane& hub,
             Registry& registry, Membership& membership);
  ~DeltaMaker();
  DeltaMaker(const DeltaMaker&) = delete;
  DeltaMaker& operator=(const DeltaMaker&) = delete;

  // `model@version` is held whole here now. Finds the newest older version
  // held whole here with the same chunks (host memory both), pins the two,
  // claims the delta at the hub (one call, before it returns: readers that
  // start later see it pending) and, if granted, queues its computation. Does
  // nothing when deltas are not served (DeltaOptions::serve), there is no such
  // base, or the unit stopped.
  // The claim waits at most until `deadline` (the Publish's or the
  // fetch's), and at most ClientOptions::rpc_timeout_ms.
  // `received`: the delta (`received_base` -> `version`) this worker
  // received whole in its fetch of `version` (DeltaReads::TakeReceived:
  // every chunk of it applied to this worker's base and checked), served as
  // it is, not computed again; its base is then the one looked for.
  void Offer(const std::string& model, Version version,
             const Deadline& deadline, Version received_base = Version(),
             std::shared_ptr<const delta::VersionDelta> received = nullptr);
  // Ends the thread: queued offers are dropped, a computation running ends
  // first. Idempotent.
  void Stop();
  // Waits until nothing is queued or running; false at the deadline.
  bool WaitIdle(const Deadline& deadline);

  // Deltas made and announced; claims the hub refused (another worker has
  // that delta).
  uint64_t made() const { return made_.load(); }
  // Of made(): those served as received in a fetch, not computed.
  uint64_t as_received() const { return as_received_.load(); }
  uint64_t refused() const { return refused_.load(); }

 private:
  struct Job {
    std::string model;
    WholeCopy version;
    WholeCopy base;
    std::shared_ptr<const delta::VersionDelta> received;  // or compute it
  };
  void Loop();
  // Asks the hub to make this delta here; false if refused or unanswered.
  bool Claim(const Job& job, const Deadline& deadline);
  void Make(Job& job);
  // Attaches `delta` to the version's registration and tells the hub it is
  // ready (or drops the claim if it does not fit).
  void Serve(Job& job, std::shared_ptr<const delta::VersionDelta> delta,
             std::chrono::steady_clock::time_point t0);
  // Tells the hub this worker will not serve that delta after all.
  void Drop(const Job& job);

  const ClientOptions& options_;
  ControlPlane& hub_;
  Registry& registry_;
  Membership& membership_;

  Mutex mu_;
  std::condition_variable cv_;  // work queued, work done, or stopping
  std::deque<Job> queue_ TH_GUARDED_BY(mu_);
  bool busy_ TH_GUARDED_BY(mu_) = false;
  bool stopping_ TH_GUARDED_BY(mu_) = false;
  std::thread thread_;  // started by the first Offer, under mu_
  std::atomic<uint64_t> made_{0};
  std::atomic<uint64_t> as_received_{0};
  std::atomic<uint64_t> refused_{0};
};

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_DELTA_MAKER_H_
