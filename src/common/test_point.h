// Test points: named places in production code where a test may run code of
// its own (block until released, count, fail), so that a fault lands at a
// known point of a transfer, never "after N ms" or "at 25% progress", which a
// fast idle machine jumps over and a loaded one reaches late. In the spirit
// of FoundationDB's BUGGIFY, without the randomness: nothing fires unless a
// test arms it.
//
// Cost when nothing is armed: one relaxed atomic load per Hit().
//
// Points (name: where, and what `arg` is):
//   fetcher.chunk_done     a fetch stream, right after a chunk was verified
//                          and counted, no lock held; arg = chunks done so
//                          far in this fetch (1, 2, ...)
//   fetcher.slice_done     the same in a fetch of slices, after a read of
//                          the slice plan (an item); arg = reads done so far
//   fetch.hub_unavailable  a fetch got a retryable UNAVAILABLE from the hub
//                          (e.g. "rebuilding" after a hub restart) and will
//                          ask again; arg = attempts so far
//   ucx.read_landed        a UCX read's bytes are in the reader's
//                          destination, the holder's lease not yet
//                          released; arg = bytes of the read
//   ucx.reply_sent         a UCX holder's serving thread, right after it
//                          granted a reader's read and before it sends
//                          any of its pieces; arg = bytes of the read
//   ucx.piece_sending      a UCX holder is about to send a piece of a read;
//                          arg = the address of its ucx::PieceHeader, which
//                          the action may change (a hostile holder)
//   ucx.read_granted       a UCX reader was granted a read and is about to
//                          wait for its pieces; arg = pieces
//   ucx.progress_next      any thread waiting on a UCX worker (reader or
//                          holder), after it found it was not done and
//                          right before its next progress call; arg = 0
//   ucx.reader_lingers     a UCX reader that gave up with rendezvous
//                          receives outstanding closed its TCP connection
//                          and starts waiting for them to end; arg = pieces
//                          of the read
//   tcp.read_requested     a TCP reader wrote requests of a pipelined run
//                          of reads (Connection::ReadPipelined), before
//                          reading the answers still due; arg = requests
//                          of the run written so far
//   registry.reserved_read_waits  a read names an epoch the worker reserved
//                          for a fetch destination not registered yet
//                          (BeginFetch told the hub first) and is about to
//                          wait for it; arg = the epoch. Runs with the
//                          registry's lock held: the action must not call
//                          the registry.
//   delta_reads.delta_read a fetch stream read a chunk's delta (from a
//                          source it reads through a delta) and is about to
//                          pin its own copy of the base and apply it; no
//                          lock held; arg = the chunk
//   delta_maker.computing  a worker's delta maker was granted a delta by
//                          the hub and starts computing it (both versions
//                          pinned); arg = the version
//   hub.departure_held     the hub holds an Unpublish or Leave of the last
//                          reliable copy of a retained version until a
//                          keeper copies it; arg = versions held. Runs with
//                          the hub's lock held: the action must not call
//                          the hub.
//
// Thread-safety: Arm/Disarm/Hit may be called from any thread. An action runs
// on the thread that hit the point, with no lock of this module held, so it
// may block (a test's barrier) and may Disarm itself.
#ifndef TENSORHUB_COMMON_TEST_POINT_H_
#define TENSORHUB_COMMON_TEST_POINT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

namespace tensorhub::testpoint {

using Action = std::function<void(uint64_t arg)>;

// Arms `name` with `action`, replacing any action armed there before.
void Arm(const std::string& name, Action action);
// Disarms `name`; a no-op if it is not armed. An action already running
// finishes.
void Disarm(const std::string& name);

namespace internal {
extern std::atomic<int> armed_points;
void Fire(const char* name, uint64_t arg);
}  // namespace internal

inline void Hit(const char* name, uint64_t arg = 0) {
  if (internal::armed_points.load(std::memory_order_relaxed) > 0) {
    internal::Fire(name, arg);
  }
}

}  // namespace tensorhub::testpoint

#endif  // TENSORHUB_COMMON_TEST_POINT_H_
