// Pulls the chunks of one version from its holders into destination memory.
//
// Several streams run in parallel; each takes the next missing chunk that
// some live source holds (a chunk with no source yet does not hold up the
// others) and reads it from the least busy live source that holds it, so one
// version is striped across holders. Every chunk is verified (XXH3-64 against
// the manifest) before it counts. A source that fails (connection error,
// refusal, bad checksum, stall past the read timeout) is dropped and its
// chunk goes back to the queue for another source; a source far slower than
// the others loses its chunk to an idle stream (work stealing, see
// FetcherOptions); when no live source has a chunk, the sources are
// refreshed from the hub. Everything ends by the deadline: UNAVAILABLE if by
// then no source was left that answered, DEADLINE_EXCEEDED if sources were
// still live but too slow; or earlier with UNAVAILABLE when the hub says the
// version has no complete holder left and no known source has the chunks
// still missing (see SourceUpdate::unavailable). Where UNAVAILABLE would be
// the answer but every holder known served bytes that failed their
// checksum, the fetch ends DATA_LOSS.
//
// The policy is FetchPlan (fetch_plan.h); this is the I/O around it. Time is
// read from the deadline's clock.
#ifndef TENSORHUB_CLIENT_FETCH_FETCHER_H_
#define TENSORHUB_CLIENT_FETCH_FETCHER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/control_plane.h"
#include "common/deadline.h"
#include "common/manifest.h"
#include "tensorhub/client.h"
#include "transport/transport.h"

namespace tensorhub::client {

class ClientMetrics;  // client/client_metrics.h
struct FetchReport;   // below
struct SourceUpdate;  // below

struct FetchSource {
  std::string worker;  // the hub's id for it (for excluding it later)
  std::string address;
  uint64_t epoch = 0;
  std::vector<std::pair<uint64_t, uint64_t>> chunks;  // [begin, end)
  bool filling = false;  // still receiving the version itself
  // Why this holder may be out of this reader's reach (reachability.h,
  // LoopbackHolderHint), or empty: if reads from it fail, the fetch says so
  // in a warning and in its error.
  std::string unreachable_hint{};
  // A holder of slices (slice_fetch.h): its own layout instead of chunks;
  // only a slice fetch reads from it.
  std::shared_ptr<const PartLayout> slices{};
  // When `address` dials another transport than TCP (ucx://...): the
  // holder's TCP data address. A read refused on principle over that
  // transport (FAILED_PRECONDITION: e.g. a UCX holder asked for device
  // memory) moves the source to TCP, which every worker serves.
  std::string tcp_address{};
  // The deltas it serves of the version from bases this reader holds (the
  // hub's offers), and the one this fetch reads it through, if any (the
  // fetch's choice: fetch/delta_choice.h, docs/design.md "Deltas on slow
  // links"). With `delta` set, a chunk is read as its delta from this
  // source and applied to the reader's base (a chunk with no delta, or
  // whose delta does not check out, is read whole).
  std::vector<DeltaOffer> delta_offers{};
  std::optional<DeltaOffer> delta{};
  // Where the hub says it is (for the choice of a delta: its link).
  Labels labels{};
};

class DeltaReads;  // client/fetch/delta_reads.h

struct FetchJob {
  std::string model;
  Version version;
  const Manifest* manifest = nullptr;
  // dest_bases[part][i]: where tensor i of that part goes.
  std::vector<std::vector<uint8_t*>> dest_bases;
  // Where every destination base points (device: reads go through
  // Connection::ReadDevice).
  MemoryLocation memory;
  // Reads through deltas, for sources with FetchSource::delta (host memory
  // only); null: every chunk is read whole. Not owned.
  DeltaReads* deltas = nullptr;
};

// FetcherOptions::cut_through_bytes by default: four checksum leaves, 5 ms
// on a 400 Mbit/s link, so that a pipeline of N readers is S/B plus N
// times about that (times the streams sharing the link) rather than N
// chunk times. One leaf (64 KiB) cost the readers of the CLI fan-out 15-25%
// more CPU for no gain measurable on a 2-core test bed (docs/benchmarks.md
// section 3).
inline constexpr uint64_t kDefaultCutThroughBytes = 4 * kChecksumLeafBytes;
// The pieces of a chunk a stream asks for ahead of their answers
// (Connection::ReadPipelined; 4 MiB of 256 KiB pieces, a default chunk): a
// filling holder holds each read until its bytes land and answers it at
// once, with no request between pieces to wait for (a reader's request
// waits for the reader to be scheduled, then for the holder's serving
// thread, on busy CPUs). A holder still takes one request at a time per
// connection, so what it holds waiting stays one read per connection.
inline constexpr size_t kPipelinedPieces = 16;

struct FetcherOptions {
  int streams = 4;
  int64_t read_timeout_ms = 30000;  // one chunk, one source
  int64_t connect_timeout_ms = 5000;
  int64_t refresh_interval_ms = 200;  // between asks to the hub
  // Rechecks (docs/design.md, "Rack-aware pipelines"): the hub told the
  // first sources to be rechecked after recheck_after_ms (0: no), and
  // `recheck` asks it for this fetch's sources as its books have them now;
  // the fetch then reads from exactly those (FetchPlan::Rechecked).
  int64_t recheck_after_ms = 0;
  std::function<Result<SourceUpdate>()> recheck;
  int max_attempts_per_chunk = 32;
  // Work stealing: when a stream has nothing left to start, it takes back a
  // chunk that has been in flight from one source for longer than
  // steal_factor times the typical chunk time (an average over the chunks
  // done so far) and at least steal_min_ms: the read is cancelled, the
  // source is dropped as too slow, and the chunk is read again from another
  // live source that holds it completely. So a holder that turns very slow
  // (or stops answering while its connection stays open) costs about
  // max(steal_min_ms, steal_factor x chunk time) at the end of a fetch, not
  // read_timeout_ms. 0 turns it off.
  int64_t steal_min_ms = 1000;
  int steal_factor = 4;
  std::function<void(const FetchProgress&)> on_progress;
  // Called every sources_interval_ms while the fetch runs, whether bytes
  // moved or not (so a stalled fetch still reports), from the calling
  // thread with no lock held: the bytes so far in all and per source
  // (FetchReport's bytes and per_source only). The worker sends it to the
  // hub for `tensorhub top`; a slow callback holds up no stream.
  std::function<void(const FetchReport& so_far)> on_sources;
  int64_t sources_interval_ms = 1000;
  // Called once per chunk right after it was verified (from a stream
  // thread, no lock held): the caller may serve it onward from then on.
  std::function<void(uint64_t global_chunk)> on_chunk;
  // Cut-through (docs/design.md, "Cut-through"): a chunk read from a
  // filling source, or by a reader that serves onward (on_landed set), is
  // read in pieces of this many bytes (a multiple of the 64 KiB checksum
  // leaf; 0: whole chunks), their requests pipelined, and verified as a
  // whole from the pieces' leaves.
  // Host memory and tree checksums (ChunkChecksum::kXxh3Tree) only.
  uint64_t cut_through_bytes = kDefaultCutThroughBytes;
  // Called after each piece of such a read landed, with the bytes of the
  // chunk landed so far (from its start), and with 0 when the chunk's read
  // failed (from a stream thread, no lock held): the caller may serve
  // those bytes onward before the chunk is verified; its readers verify
  // the chunk themselves.
  std::function<void(uint64_t global_chunk, uint64_t bytes)> on_landed;
  // Counts chunks, bytes by path, retries and steals as they happen (not
  // owned; may be null).
  ClientMetrics* metrics = nullptr;
};

struct FetchReport {
  uint64_t bytes = 0;
  uint32_t sources_used = 0;
  uint32_t chunk_retries = 0;
  uint32_t chunks_stolen = 0;  // reads moved away from a slow source
  // How long each stolen read had run when it was taken away (at most
  // kMaxStealWaits of them), on the deadline's clock.
  std::vector<int64_t> steal_waits_ms;
  std::vector<FetchSourceStats> per_source;  // those that served a chunk
  // Filled by RunFetch (I/O, not policy): of `bytes`, those copied from a
  // holder on this host; the checksum time summed over the streams; the
  // streams run; and when (real time) the first chunk was verified.
  uint64_t bytes_same_host = 0;
  double verify_seconds_all_streams = 0;
  int streams = 0;
  std::optional<std::chrono::steady_clock::time_point> first_chunk_at;
  // Connections opened over TLS; of which the kernel decrypts (kTLS).
  uint32_t tls_connections = 0;
  uint32_t kernel_tls_connections = 0;
  // Deltas (FetchStats' fields of the same names): bytes of the version
  // rebuilt from deltas, the delta bytes read for them, chunks read whole
  // after their delta failed. per_source carries each source's share.
  Version delta_base;  // 0: no source was read through a delta
  uint64_t bytes_from_delta = 0;
  uint64_t delta_wire_bytes = 0;
  uint32_t delta_chunks_read_whole = 0;
};
inline constexpr size_t kMaxStealWaits = 64;

// What the hub answered when asked again for sources.
struct SourceUpdate {
  SourceUpdate() = default;
  explicit SourceUpdate(std::vector<FetchSource> s) : sources(std::move(s)) {}
  std::vector<FetchSource> sources;
  // Set (with the hub's reason) when the hub itself answered that the
  // version is committed but no live worker holds all of its chunks: a
  // considered answer, not a transport error nor a hub still rebuilding its
  // state after a restart. `sources` is then empty. Two such answers at
  // least refresh_interval_ms apart, with no live source known for some
  // missing chunk, end the fetch with UNAVAILABLE at once instead of at its
  // deadline.
  std::optional<std::string> unavailable;
  // The hub asks the reader to recheck these sources after this long
  // (docs/design.md, "Rack-aware pipelines"); 0: no need.
  int64_t recheck_after_ms = 0;
};

// Asks the hub again for sources of the same version; `failed` names the
// workers that failed this fetch so far (the hub should avoid them). An
// error is final if NOT_FOUND, ABORTED, INVALID_ARGUMENT or
// PERMISSION_DENIED; any other (the hub unreachable or restarting) is
// retried at the next refresh.
using SourceRefresher =
    std::function<Result<SourceUpdate>(const std::vector<std::string>& failed)>;

Result<FetchReport> RunFetch(transport::Transport& transport,
                             const FetchJob& job,
                             std::vector<FetchSource> sources,
                             const SourceRefresher& refresh,
                             const FetcherOptions& options,
                             const Deadline& deadline);

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_FETCH_FETCHER_H_
