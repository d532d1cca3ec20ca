// Stops a fetch in this process at a known point so that a test can inject
// a fault there: once `after_chunks` chunks of the fetch are verified, the
// stream that got there announces it (`paused(n)`, e.g. a line "paused N" on
// stdout) and then calls `resume()`, which blocks until the test says go
// (e.g. reads the line "go" from stdin); every other stream that finishes a
// chunk meanwhile waits too, so the reader pulls nothing while the test
// kills, stops or cuts off a holder. Built on the test point
// "fetcher.chunk_done" (common/test_point.h). Fires once; disarmed when
// destroyed, which must come after the fetch returned (its streams call
// into this object). One FetchPause per process at a time. `resume` must
// return in bounded time (a reply, or EOF when the test goes away): the
// streams wait as long as it blocks.
//
// With `quiet_streams` > 0, the stream that got there first waits (at most
// kGatherMs) until that many streams wait at the point before it announces:
// then none of them has a read in flight (each waits between two chunks),
// for a fault that must not land while a holder answers this reader's reads
// (a reader killed while UCX 1.13 emulates its gets kills the holder:
// docs/design.md, UCX data plane). streams_quiet() says how many did.
#ifndef TENSORHUB_TOOLS_FETCH_PAUSE_H_
#define TENSORHUB_TOOLS_FETCH_PAUSE_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

namespace tensorhub::cli {

class FetchPause {
 public:
  FetchPause(uint64_t after_chunks,
             std::function<void(uint64_t chunks_done)> paused,
             std::function<void()> resume, int quiet_streams = 0);
  ~FetchPause();
  FetchPause(const FetchPause&) = delete;
  FetchPause& operator=(const FetchPause&) = delete;

  // The CLI's pause (a test's known point, --pause-after-chunks): says
  // "paused after N chunks" on stderr, then waits for a line (or EOF) on
  // stdin. None where `after_chunks` is 0.
  static std::unique_ptr<FetchPause> OnStdio(uint64_t after_chunks);

  // How many chunks were done when the fetch paused; 0 if it never did.
  uint64_t paused_at() const;
  // How many streams waited at the point when the fetch paused (announced).
  int streams_quiet() const;

  // How long the first stream waits for the others (quiet_streams).
  static constexpr int64_t kGatherMs = 30000;

 private:
  void OnChunk(uint64_t chunks_done);

  const uint64_t after_chunks_;
  const std::function<void(uint64_t)> paused_;
  const std::function<void()> resume_;
  const int quiet_streams_;
  mutable std::mutex mu_;
  std::condition_variable released_;
  std::condition_variable arrived_;
  enum class Phase {
    kRunning,
    kPaused,
    kReleased
  } phase_ = Phase::kRunning;  // guarded by mu_
  uint64_t paused_at_ = 0;     // guarded by mu_
  int waiting_ = 0;            // streams at the point; guarded by mu_
  int streams_quiet_ = 0;      // guarded by mu_
};

}  // namespace tensorhub::cli

#endif  // TENSORHUB_TOOLS_FETCH_PAUSE_H_
