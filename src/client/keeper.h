// The keeper: a reliable worker whose host memory holds retained versions
// that would otherwise lose their last reliable copy (docs/design.md,
// "Retain and the keeper"). It long-polls the hub (KeeperPoll) for retained
// versions lacking a reliable complete copy, fetches each with the normal
// Fetch (scheduled like any reader, and then serving it), and unpublishes
// versions that are no longer retained. `tensorhub keeper` runs one.
//
// Threads: one loop thread owns the held buffers; Start/Stop/stats may be
// called from any thread.
#ifndef TENSORHUB_CLIENT_KEEPER_H_
#define TENSORHUB_CLIENT_KEEPER_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client/control_plane.h"
#include "common/mutex.h"
#include "tensorhub/client.h"
#include "tensorhub/host_buffer.h"

namespace tensorhub::client {

struct KeeperOptions {
  ClientOptions client;  // worker_class is forced to reliable
  // Bytes of retained versions the keeper may hold; a version that does not
  // fit is refused with a logged error (the hub keeps asking, so a keeper
  // with room, or this one after a release, can take it). 0: half of the
  // machine's physical memory.
  uint64_t memory_limit_bytes = 0;
  int64_t poll_wait_ms = 1000;  // long-poll length (at most 30000)
  int64_t fetch_timeout_ms = 300000;
  int connections = 4;
};

struct KeeperStats {
  uint64_t versions_held = 0;
  uint64_t bytes_held = 0;
  uint64_t fetched = 0;   // copies made
  uint64_t released = 0;  // versions dropped after unretain / keep-latest
  uint64_t refused = 0;   // did not fit in memory_limit_bytes
  uint64_t failed = 0;    // fetch errors (retried on a later poll)
};

class Keeper {
 public:
  static Result<std::unique_ptr<Keeper>> Start(const KeeperOptions& options);
  // Stop(), then the worker leaves the hub: if it holds the last reliable
  // copy of a retained version, that waits (client.leave_timeout_ms) for
  // another keeper to copy it.
  ~Keeper();
  Keeper(const Keeper&) = delete;
  Keeper& operator=(const Keeper&) = delete;

  // Ends the loop (within poll_wait_ms, or the fetch in progress' deadline).
  void Stop();
  KeeperStats stats() const;
  const WorkerId& id() const { return client_->id(); }
  uint64_t memory_limit_bytes() const { return limit_bytes_; }

 private:
  using Key = std::pair<std::string, Version>;
  struct Metrics;  // keeper.cc
  struct Held {
    // Huge pages where the kernel allows: same-host readers of the copy
    // read at memory speed (host_buffer.h).
    HostBuffer bytes;
    uint64_t size = 0;
  };

  Keeper(const KeeperOptions& options, std::unique_ptr<Client> client,
         HubTls hub_tls);
  void Loop();
  // Both return whether they made progress.
  bool Keep(const KeeperItem& item);
  bool Drop(const KeeperItem& item);
  // After a hub restart: pins again what was pinned before (true when done).
  bool Repin();
  bool Stopping();

  const KeeperOptions options_;
  uint64_t limit_bytes_ = 0;
  std::unique_ptr<Client> client_;
  std::unique_ptr<ControlPlane> hub_;
  const std::unique_ptr<Metrics> metrics_;  // in client_'s registry
  std::map<Key, Held> held_;                // loop thread only
  std::vector<Held> undrained_;             // loop thread only; freed at exit
  std::set<Key> refused_;                   // loop thread only: logged once
  // Hub restarts (loop thread only): the hub's incarnation last seen, the
  // Retain pins of versions we hold as the hub last reported them, the pins
  // still to restore after a restart, and until when releases wait (the
  // restarted hub is still hearing from the other workers).
  uint64_t incarnation_ = 0;
  std::set<Key> pinned_;
  std::set<Key> repin_;
  int64_t repin_deadline_ms_ = 0;
  int64_t release_after_ms_ = 0;

  mutable Mutex mu_;
  std::condition_variable cv_;
  bool stopping_ TH_GUARDED_BY(mu_) = false;
  KeeperStats stats_ TH_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_KEEPER_H_
