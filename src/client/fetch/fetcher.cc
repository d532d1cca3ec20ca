#include "client/fetch/fetcher.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "client/fetch/delta_reads.h"
#include "client/fetch/fetch_plan.h"
#include "client/fetch/plan_run.h"
#include "common/test_point.h"

namespace tensorhub::client {
namespace {

// A whole fetch: each read is one chunk of the manifest, landing in the
// caller's memory (host or device) and verified as it lands.
class FetchRun final : public PlanRun {
 public:
  FetchRun(transport::Transport& transport, const FetchJob& job,
           std::vector<FetchSource> sources, const SourceRefresher& refresh,
           const FetcherOptions& options, const Deadline& deadline)
      : PlanRun(transport, refresh, options, deadline,
                FetchPlan(job.model + "@" + std::to_string(job.version.value()),
                          *job.manifest, std::move(sources),
                          static_cast<bool>(refresh), options,
                          deadline.clock().NowMs(), deadline.at_ms()),
                job.manifest->total_bytes()),
        job_(job) {}

 private:
  Status Read(StreamState& s, const FetchStep& step,
              transport::ReadInfo* info) override {
    const ChunkLoc& loc = job_.manifest->Chunk(step.chunk);
    TH_ASSIGN_OR_RETURN(transport::Connection * conn, Connect(s, step));
    const Deadline read_deadline = deadline().Cap(options().read_timeout_ms);
    // Through a delta first, where this source's was chosen: it replaces
    // the chunk's bytes on the link, cut-through pieces included.
    if (step.delta.has_value() && job_.deltas != nullptr &&
        job_.memory.is_host()) {
      s.pieces.clear();
      AppendPieces(job_.manifest->parts()[loc.part], job_.dest_bases[loc.part],
                   loc.offset, loc.bytes, &s.pieces);
      int64_t verify_ns = 0;
      TH_ASSIGN_OR_RETURN(
          DeltaReads::Outcome o,
          job_.deltas->Read(*conn, step, s.pieces, read_deadline, &s.scratch,
                            &verify_ns));
      if (o == DeltaReads::Outcome::kApplied) {
        *info = transport::ReadInfo{};
        info->verify_ns = verify_ns;
        return Status::Ok();
      }
      // No delta to use for this chunk: read it whole, from the same source.
    }
    const uint64_t piece = PieceBytes(step, loc);
    if (piece > 0) {
      Status st = ReadInPieces(step, loc, piece, conn, info);
      if (!st.ok() && options().on_landed) options().on_landed(step.chunk, 0);
      return st;
    }
    s.pieces.clear();
    AppendPieces(job_.manifest->parts()[loc.part], job_.dest_bases[loc.part],
                 loc.offset, loc.bytes, &s.pieces);
    wire::ReadRequest req;
    req.model = job_.model;
    req.version = job_.version.value();
    req.epoch = step.epoch;
    req.part = loc.part;
    req.offset = loc.offset;
    req.length = loc.bytes;
    transport::ReadChecksum got{.kind = loc.checksum};
    if (job_.memory.is_host()) {
      TH_RETURN_IF_ERROR(conn->Read(req, s.pieces, read_deadline, &got));
    } else {
      TH_RETURN_IF_ERROR(conn->ReadDevice(req, s.pieces, job_.memory.device,
                                          read_deadline, &got));
    }
    *info = conn->last_read();
    if (got.value != loc.xxh3) {
      return DataLoss("chunk at part " + std::to_string(loc.part) + " offset " +
                      std::to_string(loc.offset) + " from " + step.address +
                      " failed its checksum (" +
                      ChunkChecksumName(loc.checksum) + ")");
    }
    return Status::Ok();
  }

  // Cut-through: the piece size a chunk is read in, 0 for one read. Only
  // where it shortens a pipeline (the source still fills, or this reader
  // serves onward), and only where the pieces' leaves verify the chunk.
  uint64_t PieceBytes(const FetchStep& step, const ChunkLoc& loc) const {
    const uint64_t piece = options().cut_through_bytes;
    if (piece == 0 || piece % kChecksumLeafBytes != 0 || piece >= loc.bytes ||
        loc.checksum != ChunkChecksum::kXxh3Tree || !job_.memory.is_host() ||
        (!step.filling && !options().on_landed)) {
      return 0;
    }
    return piece;
  }

  // The chunk in pieces of `piece` bytes, in order on one connection, the
  // requests pipelined (Connection::ReadPipelined, up to kPipelinedPieces
  // out: a filling holder answers each as soon as its bytes have landed
  // there, with no round trip between pieces), each announced (on_landed)
  // as it lands; the chunk verified from the pieces' leaves at the end.
  Status ReadInPieces(const FetchStep& step, const ChunkLoc& loc,
                      uint64_t piece, transport::Connection* conn,
                      transport::ReadInfo* info) {
    const Deadline read_deadline = deadline().Cap(options().read_timeout_ms);
    const size_t n = static_cast<size_t>((loc.bytes + piece - 1) / piece);
    std::vector<std::vector<iovec>> dests(n);
    std::vector<std::vector<uint64_t>> piece_leaves(n);
    std::vector<transport::ReadChecksum> sums(n);
    std::vector<transport::PipelinedRead> reads(n);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t off = i * piece;
      const uint64_t len = std::min(piece, loc.bytes - off);
      AppendPieces(job_.manifest->parts()[loc.part], job_.dest_bases[loc.part],
                   loc.offset + off, len, &dests[i]);
      sums[i] = transport::ReadChecksum{.kind = ChunkChecksum::kXxh3Tree,
                                        .leaves = &piece_leaves[i]};
      wire::ReadRequest& req = reads[i].req;
      req.model = job_.model;
      req.version = job_.version.value();
      req.epoch = step.epoch;
      req.part = loc.part;
      req.offset = loc.offset + off;
      req.length = len;
      reads[i].dest = dests[i];
      reads[i].sum = &sums[i];
    }
    std::vector<uint64_t> leaves;
    leaves.reserve((loc.bytes + kChecksumLeafBytes - 1) / kChecksumLeafBytes);
    TH_RETURN_IF_ERROR(conn->ReadPipelined(
        reads, kPipelinedPieces, read_deadline, [&](size_t i) -> Status {
          const transport::ReadInfo r = conn->last_read();
          info->same_host = r.same_host;
          info->verify_ns += r.verify_ns;
          if (piece_leaves[i].empty()) {
            return Internal("transport of " + step.address +
                            " gave no leaf checksums for a piece of a chunk");
          }
          leaves.insert(leaves.end(), piece_leaves[i].begin(),
                        piece_leaves[i].end());
          if (options().on_landed) {
            options().on_landed(step.chunk,
                                std::min<uint64_t>(loc.bytes, (i + 1) * piece));
          }
          return Status::Ok();
        }));
    if (TreeSumOfLeaves(leaves) != loc.xxh3) {
      return DataLoss("chunk at part " + std::to_string(loc.part) + " offset " +
                      std::to_string(loc.offset) + " from " + step.address +
                      " failed its checksum (" +
                      ChunkChecksumName(loc.checksum) + ", read in pieces)");
    }
    return Status::Ok();
  }

  void Landed(const FetchStep& step, uint64_t done) override {
    if (options().on_chunk) options().on_chunk(step.chunk);
    testpoint::Hit("fetcher.chunk_done", done);
  }

  const FetchJob& job_;
};

}  // namespace

Result<FetchReport> RunFetch(transport::Transport& transport,
                             const FetchJob& job,
                             std::vector<FetchSource> sources,
                             const SourceRefresher& refresh,
                             const FetcherOptions& options,
                             const Deadline& deadline) {
  if (job.manifest == nullptr ||
      job.dest_bases.size() != job.manifest->parts().size()) {
    return Internal("fetch job has no destination for some part");
  }
  if (job.manifest->num_chunks() == 0) return FetchReport{};
  FetchRun run(transport, job, std::move(sources), refresh, options, deadline);
  Result<FetchReport> report = run.Run();
  if (report.ok() && job.deltas != nullptr) job.deltas->AddTo(&*report);
  return report;
}

}  // namespace tensorhub::client
