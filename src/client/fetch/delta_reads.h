// The reads of one fetch that go through a delta (docs/design.md, "Deltas
// on slow links"): for a chunk whose source the fetch reads through the
// delta from `base` (FetchSource::delta), the source's delta index (read
// once per source), then the chunk's delta, applied to this worker's own
// copy of the base and checked against the version's chunk checksum.
// Nothing unchecked is ever left as the chunk: whenever the delta cannot
// serve (none was made of the chunk, the source's index or delta is
// corrupt, the base was unpublished or changed here, the result does not
// check), the caller reads the chunk whole. A source whose delta failed
// once is read whole for the rest of the fetch.
//
// The base's bytes are pinned chunk by chunk (a read of this worker's own
// registry), never for the whole fetch: an Unpublish of the base waits at
// most for one chunk to be applied, and the chunks after it are read whole.
//
// Threads: Read from the run's streams concurrently; the counters are
// guarded.
#ifndef TENSORHUB_CLIENT_FETCH_DELTA_READS_H_
#define TENSORHUB_CLIENT_FETCH_DELTA_READS_H_

#include <sys/uio.h>

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "client/fetch/delta_choice.h"
#include "client/fetch/fetch_plan.h"
#include "client/fetch/fetcher.h"
#include "client/registry.h"
#include "common/mutex.h"
#include "delta/version_delta.h"
#include "transport/transport.h"

namespace tensorhub::client {

class DeltaReads {
 public:
  // Borrows `own` (this worker's registry) and `manifest` (the version's).
  // `keep`: keep the chunk deltas received, to serve them (TakeReceived),
  // up to `keep_max_bytes` of body.
  DeltaReads(Registry& own, std::string model, Version version,
             const Manifest& manifest, DeltaBase base, bool keep = false,
             uint64_t keep_max_bytes = 0);

  Version base() const { return base_.version; }

  enum class Outcome { kApplied, kReadWhole };
  // Reads chunk `step.chunk` through the delta `step.delta` names, on
  // `conn` (the source's), into `dest` (the chunk's place in the
  // destination, host memory). kApplied: `dest` holds the chunk, checked;
  // kReadWhole: the caller reads the chunk whole (dest holds anything). An
  // error: the connection failed (the source's fault, as a plain read's).
  // `verify_ns` gets the time spent checking.
  Result<Outcome> Read(transport::Connection& conn, const FetchStep& step,
                       std::span<const iovec> dest, const Deadline& deadline,
                       std::vector<uint8_t>* scratch, int64_t* verify_ns);

  // Adds the fetch's delta figures to `report` (after the run): totals,
  // and each source's share in its per_source entries (by address).
  void AddTo(FetchReport* report) const;

  // The delta as received (after the run), when this worker may serve it
  // onward (`keep`, below) and every chunk delta of one source's index was
  // applied here and checked against the version's checksums: the index
  // and body that source served, byte for byte, for this worker to serve
  // in turn instead of computing it (docs/design.md, "Once per remote
  // datacenter"). Null otherwise. Once.
  std::shared_ptr<const delta::VersionDelta> TakeReceived();

 private:
  struct Source {
    std::shared_ptr<const delta::DeltaIndex> index;
    bool failed = false;      // read it whole from now on
    int failures = 0;         // chunks whose delta did not check
    uint64_t bytes = 0;       // of the version, rebuilt from its deltas
    uint64_t wire_bytes = 0;  // delta bytes read from it, index included
  };
  // The source's index, read on first use (a stream that finds none reads
  // it; two streams may both read it once).
  Result<std::shared_ptr<const delta::DeltaIndex>> IndexOf(
      transport::Connection& conn, const FetchStep& step,
      const Deadline& deadline);
  void Failed(const std::string& address, const std::string& why);
  // Keeps a chunk's delta `bytes` (applied and checked) if it came from
  // the source whose deltas are kept (the first to give an index).
  void Keep(const std::string& address, const delta::DeltaIndexEntry& entry,
            std::span<const uint8_t> bytes);

  Registry& own_;
  const std::string model_;
  const Version version_;
  const Manifest& manifest_;
  const DeltaBase base_;

  mutable Mutex mu_;
  std::map<std::string, Source> sources_ TH_GUARDED_BY(mu_);  // by address
  bool base_gone_ TH_GUARDED_BY(mu_) = false;
  uint32_t read_whole_ TH_GUARDED_BY(mu_) = 0;
  // What TakeReceived gives: one source's index and the chunk deltas of it
  // applied here, in place in its body.
  const bool keep_;
  const uint64_t keep_max_bytes_;
  std::string kept_from_ TH_GUARDED_BY(mu_);  // its address; empty: none
  std::shared_ptr<const delta::DeltaIndex> kept_index_ TH_GUARDED_BY(mu_);
  std::string kept_body_ TH_GUARDED_BY(mu_);
  uint64_t kept_chunks_ TH_GUARDED_BY(mu_) = 0;
};

}  // namespace tensorhub::client

#endif  // TENSORHUB_CLIENT_FETCH_DELTA_READS_H_
