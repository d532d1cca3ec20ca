// What a hub of a highly available hub set needs from the service that
// elects its leader and keeps its durable facts (docs/design.md, "A highly
// available hub"). The hub's gRPC adapter (hub_service.cc) is written
// against this interface only; the etcd implementation is src/ha/
// (ha::MakeEtcdCoordinator), and a hub without one is a single hub, as
// before. No gRPC or etcd type appears here.
//
// Threads: Leading(), Leader() and Persist() may be called from any thread
// at any time between Start() and Stop(). The callbacks run on the
// coordinator's own thread, one at a time, never while Persist() is being
// called by it.
#ifndef TENSORHUB_HUB_COORDINATOR_H_
#define TENSORHUB_HUB_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hub/hub_state.h"
#include "tensorhub/status.h"

namespace tensorhub::hub {

class Coordinator {
 public:
  struct Callbacks {
    // This hub won the election and the durable facts were loaded: the
    // hub installs them in a fresh state machine. Leading() turns true only
    // after this returns OK; on an error the coordinator resigns.
    std::function<Status(const DurableState&)> elected;
    // This hub is no longer the leader (its lease ended or could not be
    // renewed in time, another hub owns the leader key, or Stop()).
    // Leading() is already false when this runs; the hub drops its state.
    std::function<void()> demoted;
  };

  virtual ~Coordinator() = default;

  // Checks that this hub may join the set (the same secret as the hub set
  // recorded) and starts campaigning in the background. FAILED_PRECONDITION
  // with the reason if it may not; UNAVAILABLE if the store is unreachable.
  virtual Status Start(Callbacks callbacks) = 0;
  // Whether this hub is the leader at this moment: it won the election and
  // its lease, as last renewed, has not run out by its own clock. Cheap
  // (an atomic load and a clock read): called on every RPC.
  virtual bool Leading() const = 0;
  // The leader's advertised address as this hub last saw it ("" when no
  // leader is known); this hub's own while it leads.
  virtual std::string Leader() const = 0;
  // This hub's own advertised address.
  virtual const std::string& self() const = 0;
  // Writes `changes` in order, fenced: every write is conditioned on this
  // hub still owning the leader key under its lease, so a hub that lost the
  // election cannot write. OK once all are durable. FAILED_PRECONDITION
  // (and this hub stops leading) if the fence failed; UNAVAILABLE if the
  // store could not be reached by `deadline_ms` (NowMs() scale): then
  // nothing or a prefix was written, and the caller retries the whole list
  // (the changes are idempotent).
  virtual Status Persist(const std::vector<DurableChange>& changes,
                         int64_t deadline_ms) = 0;
  // Resigns (so that a standby takes over at once rather than after a
  // lease) and stops the background thread. Idempotent. Bounded by the
  // store's call timeout.
  virtual void Stop() = 0;
};

}  // namespace tensorhub::hub

#endif  // TENSORHUB_HUB_COORDINATOR_H_
