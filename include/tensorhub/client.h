// The TensorHub worker library: publish, unpublish, fetch, and serve reads.
//
// A Client is one worker: it registers with the hub, keeps its lease alive
// with heartbeats, and runs a data-plane server that answers reads of the
// versions it holds, straight from the caller's memory. All methods are safe
// to call from several threads at once. Every call that waits takes a
// deadline (a timeout in milliseconds) and returns DEADLINE_EXCEEDED or
// UNAVAILABLE instead of hanging.
//
// Memory contract: memory passed to Publish(), or filled by Fetch() with
// `serve` on, is served to other workers until Unpublish() of that version
// returns. Do not modify or free it before then. Fetch() into memory that
// still serves an older version unpublishes that version first (waiting for
// its reads in flight), so a buffer is never served as a mix of two versions.
#ifndef TENSORHUB_CLIENT_H_
#define TENSORHUB_CLIENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tensorhub/reshard.h"
#include "tensorhub/snapshot.h"
#include "tensorhub/status.h"
#include "tensorhub/types.h"

namespace tensorhub {

namespace client {
class ClientFactory;  // internal: builds a Client on other seams (tests)
}  // namespace client

// How a worker uses deltas (ClientOptions::deltas). Host memory only: a
// version in device memory always travels whole.
struct DeltaOptions {
  // Serve deltas: when this worker holds a version whole (published alone,
  // or fetched) and an older version of the model cut into the same chunks,
  // it asks the hub whether to compute the delta between them; the first
  // worker to ask per (base, version) does, once, and serves it. Costs the
  // delta's memory (about 1-5% of the version at RL learning rates; see
  // max_memory_bytes) and a pass over both versions on one thread
  // (`tensorhub-lab bench delta`). While it runs, an Unpublish of either
  // version waits for it (it reads them).
  bool serve = true;
  // Read through deltas: a fetch by a worker holding an older version whole
  // reads each source offering a delta from it through the delta when
  // that wins (below); the result is checked against the version's own
  // chunk checksums, and a chunk whose delta does not check is read whole.
  bool read = true;
  // The link to a source as the choice assumes it, in bytes per second:
  // in this worker's datacenter, and to another one (labels.datacenter).
  // A delta is read when delta_bytes / link + version_bytes / apply is
  // below version_bytes / link.
  double datacenter_link_bytes_per_s = 1.25e9;  // 10 Gbit/s
  double wide_area_link_bytes_per_s = 1.25e8;   // 1 Gbit/s
  // How fast this worker applies deltas, bytes of the version per second
  // (all streams).
  double apply_bytes_per_s = 1e9;
  // The deltas this worker keeps to serve, in all; one that does not fit
  // is not made (the version travels whole).
  uint64_t max_memory_bytes = 1ull << 30;
  // A reader behind a slow link whose base has a delta being computed
  // (claimed, not ready) asks the hub again for up to this long before it
  // reads the version whole.
  int64_t wait_ms = 5000;
};

struct ClientOptions {
  // The hub's control address, HOST:PORT; for a highly available hub set,
  // its hubs' addresses, comma-separated ("h1:7070,h2:7070,h3:7070"): calls
  // go to the elected leader and follow it when another hub takes over.
  std::string hub_address = "127.0.0.1:7070";
  // A human-readable name for logs and `tensorhub ls`; defaults to host:pid.
  std::string name;
  Labels labels;
  WorkerClass worker_class = WorkerClass::kReliable;
  // Where the data-plane server listens. Port 0 picks a free port.
  std::string data_listen_address = "127.0.0.1:0";
  // The host other workers should dial; defaults to the listen host.
  std::string data_advertise_host;
  // Deadline of each control call to the hub.
  int64_t rpc_timeout_ms = 5000;
  // Deadline for the first registration with the hub.
  int64_t connect_timeout_ms = 10000;
  // How often the worker renews its lease with the hub. 0: a third of the
  // lease the hub grants (serve --lease-ms; 5 s by default, so 1.67 s), at
  // most 5 s.
  int64_t heartbeat_interval_ms = 0;
  // Bound on data-plane connections this worker serves at once.
  size_t max_serving_connections = 256;
  // Shared secret for the hub (empty: none).
  std::string secret;
  // TLS (PEM file paths; docs/security.md). tls_ca_file set: the channel to
  // the hub runs TLS and trusts a hub certificate signed by this CA (a
  // bundle may hold several) for the host in hub_address, or for
  // tls_server_name if set. tls_cert_file and tls_key_file: this worker's
  // certificate, for a hub that requires client certificates (mutual TLS)
  // and for the data plane's TLS. Connect reads and checks the files
  // (INVALID_ARGUMENT naming a bad one), and if the hub cannot be reached
  // because of TLS (one end without it, a certificate not trusted or
  // missing) says so: FAILED_PRECONDITION or PERMISSION_DENIED.
  std::string tls_ca_file{};
  std::string tls_cert_file{};
  std::string tls_key_file{};
  std::string tls_server_name{};
  // TLS on data-plane connections too, both ways (mutual: every worker
  // shows its certificate, which must chain to tls_ca_file; needs all three
  // files, and implies TLS to the hub). Kernel TLS where the kernel has it,
  // so that sends stay zero-copy; else OpenSSL in user space, said once in
  // the log. Every worker of a deployment must agree: a reader and a holder
  // that differ refuse each other with FAILED_PRECONDITION. The shared
  // secret's challenge still runs, inside TLS.
  bool data_tls = false;
  // Accept a data server on a non-loopback address with neither a secret
  // nor data_tls (a private test network). Without it, Connect refuses such
  // a worker (FAILED_PRECONDITION, saying why and how to fix it).
  bool insecure = false;
  // On destruction, if this worker holds the last reliable copy of a
  // retained version (or, as a spot worker, its last copy), wait up to this
  // long, still serving, for a keeper to copy it before leaving.
  int64_t leave_timeout_ms = 10000;
  // HOST:PORT to serve Prometheus metrics on (GET /metrics; port 0 picks a
  // free port, see Client::metrics_address()). Empty: no metrics endpoint.
  // The metrics are listed in docs/metrics.md.
  std::string metrics_listen;
  // Data-plane transports in order of preference ("ucx", "tcp"); the first
  // this build and machine can run is used for serving and reading, and the
  // choice is logged. Empty: the environment's TENSORHUB_TRANSPORTS (a comma
  // list, e.g. "ucx,tcp"), else tcp. A worker serves TCP and each listed
  // transport it can run, and reads each holder over the first of its list
  // that the holder serves, else TCP (docs/design.md, "Transport per peer").
  // A holder on this worker's host (the same boot id and pid and network
  // namespaces, which its UCX hello names) is read over TCP whatever the
  // list: TCP's same-host path (cross-memory attach, CUDA IPC) moves the
  // bytes once, and UCX 1.13 on one host cannot (emulated gets;
  // docs/benchmarks.md sections 2 and 14).
  std::vector<std::string> transports;
  // Read same-host holders over the listed transports too, as other hosts'
  // (for tests and benchmarks of UCX on one host). Also set by the
  // environment's TENSORHUB_UCX_SAME_HOST=1.
  bool ucx_same_host = false;
  // Deltas on slow links (docs/design.md, "Deltas on slow links"): a
  // version crosses a slow link as what changed since a base the reader
  // holds, computed once per (base, version) by a worker holding both.
  DeltaOptions deltas;
  // Let UCX use its wires on which no hardware checks a peer (tcp, shared
  // memory, cma: every wire of Debian's UCX 1.13 but RDMA), over which a
  // peer that proved the secret and modifies its UCX can write into this
  // process's memory (UCX's tcp put requests); for networks whose every
  // host runs the deployment's own binaries, and tests. Off (the default), UCX
  // runs only over RDMA (rc, dc) and is refused elsewhere: a worker that also
  // lists tcp serves and reads tcp, saying why; one whose transports are ucx
  // alone fails to start (docs/security.md, "What a UCX peer can reach").
  // Also set by the environment's TENSORHUB_UCX_EMULATED_GETS=allow.
  bool ucx_emulated_gets = false;
};

struct PublishOptions {
  uint32_t rank = 0;
  uint32_t group_size = 1;
  uint64_t chunk_bytes = 4ull << 20;
  int64_t timeout_ms = 10000;
  // Free-form pairs stored with this rank's part (at most 64, 16 MiB in
  // all); readers see them in VersionInfo::metadata.
  std::vector<std::pair<std::string, std::string>> metadata;
  // Shards (reshard.h): a tensor named here is this rank's box of a logical
  // tensor of that name (its global shape and the box's offset; the box's
  // extents are the tensor's shape). The ranks' boxes of every tensor must
  // tile it: the hub refuses the last rank's publish otherwise.
  std::map<std::string, TensorPiece> pieces;
  // Segment checksums (about this many bytes each; 0: none), so that
  // readers of a slice verify what they read (FetchSlices). Computed on
  // the CPU: tensors in device memory get none.
  uint64_t segment_bytes = 64 << 10;
  // The chunk checksum this rank's part names (docs/wire.md):
  // "xxh3-64-tree-64k", which a GPU verifies in parallel, or "xxh3-64",
  // the only one builds before 2026-11-25 can verify (publish it while
  // such readers remain; this build verifies both). Empty: the
  // environment's TENSORHUB_CHUNK_CHECKSUM, else "xxh3-64-tree-64k". Any
  // other name fails the publish.
  std::string chunk_checksum;
};

struct FetchProgress {
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
};

struct FetchOptions {
  int64_t timeout_ms = 120000;
  // Parallel data-plane streams; each may go to a different holder.
  int connections = 4;
  // Holders to stripe over (the hub picks them): at most this many, plus
  // what it takes to cover every part of a group publish of more parts.
  int max_sources = 4;
  // Serve what we fetch: each chunk as soon as it is verified (so readers
  // arriving together form a pipeline), and the whole version afterwards.
  bool serve = true;
  // FetchSlices only: once the slices are fetched and verified, serve them
  // onward as a holder of slices (the hub gives them to other readers of
  // slices that intersect them). As with `serve`, the memory then belongs to
  // the version until Unpublish(model, version). Only slices kept in the
  // published dtype are served. Off by default: a caller that reuses slice
  // buffers must opt in knowingly.
  bool serve_slices = false;
  // Called from a fetch thread, at most every few milliseconds.
  std::function<void(const FetchProgress&)> on_progress;
  // Reader group (the ranks of one model-parallel inference instance):
  // with Version::Latest(), every call naming the same `group` and
  // `group_step` gets the version the group's first call resolved, even if
  // a newer one has committed since. All ranks pass the same id and the
  // same step for the same update (e.g. the rollout iteration). Ignored
  // for an explicit version; empty: no group.
  std::string group;
  uint64_t group_step = 0;
};

// How much one holder contributed to a fetch, over one transport. A holder
// whose reads moved to TCP mid-fetch (it refused them over UCX on
// principle, e.g. for device memory) has two entries, one per transport,
// each with what it carried; `sources_used` counts it once.
struct FetchSourceStats {
  WorkerId worker;
  std::string address;
  uint64_t bytes = 0;
  uint64_t chunks = 0;
  // The holder was itself still receiving the version when it was chosen:
  // it served chunks it had verified while the rest was still arriving.
  bool was_filling = false;
  // The data-plane transport the chunks came over ("tcp", "ucx").
  std::string transport;
  // Of `bytes`, those rebuilt here from a delta against FetchStats::
  // delta_base, and the delta bytes (index included) that came for them:
  // what crossed the link is delta_wire_bytes + bytes - delta_bytes.
  uint64_t delta_bytes = 0;
  uint64_t delta_wire_bytes = 0;
};

// Where one fetch's time went. The stages follow each other and add up to
// total_seconds (less a few microseconds of bookkeeping between them); the
// metric tensorhub_fetch_stage_seconds{stage} records the same figures
// (docs/metrics.md):
//   resolve     the hub round trip that starts the fetch (retries
//               included): one BeginFetch names the version, registers the
//               filling holder and chooses the first sources
//   schedule    mapping the destination (releasing memory that still served
//               an older version: its drain) and registering it for
//               serving here
//   first_byte  from the sources in hand until the first chunk is verified
//   transfer    the rest of the data plane, less verify
//   verify      the checksum work's share of the data plane: the time the
//               streams spent hashing, divided by the number of streams
//               (they hash in parallel, as the bytes arrive)
//   register    reporting the copy to the hub (complete holder)
struct FetchStats {
  Version version;
  uint64_t bytes = 0;
  double seconds = 0;          // from resolve to last verified byte
  double resolve_seconds = 0;  // the hub round trip
  double schedule_seconds = 0;
  double first_byte_seconds = 0;
  double transfer_seconds = 0;
  double verify_seconds = 0;
  double register_seconds = 0;
  double total_seconds = 0;  // the whole call
  // Of `bytes`, those copied from a holder on this host (cross-memory
  // attach or CUDA IPC) rather than sent over TCP.
  uint64_t bytes_same_host = 0;
  uint32_t sources_used = 0;
  uint32_t chunk_retries = 0;
  // Chunks taken back from a holder that had become far slower than the
  // others and read from another one (included in chunk_retries).
  uint32_t chunks_stolen = 0;
  // Data-plane connections this fetch opened over TLS
  // (ClientOptions::data_tls), and of those, how many the kernel decrypts
  // (kTLS receive). A holder's log says whether its sends use kTLS.
  uint32_t tls_connections = 0;
  uint32_t kernel_tls_connections = 0;
  std::vector<FetchSourceStats> sources;
  // Where the manifest came from when the hub named it by its SHA-256
  // instead of sending it (docs/design.md, "The manifest from a source"):
  // the address the source that served it was read at (as in
  // FetchSourceStats::address: ucx://HOST:PORT over UCX), and its size.
  // Empty and 0 when the hub sent it. Not counted in `bytes` or `sources`.
  std::string manifest_source;
  uint64_t manifest_bytes = 0;
  // Deltas (docs/design.md, "Deltas on slow links"): the base they were
  // applied to (0: none was read), the bytes of the version rebuilt from
  // them, the delta bytes read for those (indexes included), and the
  // chunks whose delta did not check out (or whose base was gone) and were
  // read whole. Every other byte came whole.
  Version delta_base;
  uint64_t bytes_from_delta = 0;
  uint64_t delta_wire_bytes = 0;
  uint32_t delta_chunks_read_whole = 0;
};

struct TensorInfo {
  // For a tensor published as pieces (PublishOptions::pieces): the logical
  // tensor, once, with its global shape; `rank` is the first part holding
  // a piece of it.
  TensorSpec spec;
  uint32_t rank = 0;  // which trainer rank's part holds it
  uint64_t bytes = 0;
};

struct HolderInfo {
  WorkerId worker;
  std::string data_address;
  Labels labels;
  WorkerClass worker_class = WorkerClass::kReliable;
  uint64_t chunks = 0;  // how many of the version's chunks it holds
  // Still receiving the version: it serves the chunks it has verified, and
  // may depend on other holders for the rest.
  bool filling = false;
};

struct VersionInfo {
  std::string model;
  Version version;
  VersionState state = VersionState::kPending;
  uint32_t group_size = 0;
  uint32_t parts_published = 0;
  uint64_t total_bytes = 0;
  uint64_t chunk_bytes = 0;
  uint64_t num_chunks = 0;
  uint32_t num_holders = 0;
  // Retained (Client::Retain, or the hub's --keep-latest policy).
  bool retained = false;
  std::vector<TensorInfo> tensors;  // filled by Describe, in layout order
  // Every part's metadata, rank 0's first; filled by Describe.
  std::vector<std::pair<std::string, std::string>> metadata;
  // Filled by Describe: the nearest holders, at most 64 (num_holders
  // counts them all).
  std::vector<HolderInfo> holders;
};

struct ModelInfo {
  std::string model;
  std::vector<VersionInfo> versions;  // summaries, oldest first
};

class Client {
 public:
  // Registers with the hub and starts serving. Fails with UNAVAILABLE or
  // DEADLINE_EXCEEDED if the hub does not answer within connect_timeout_ms.
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  // Leaves the hub (first waiting, up to leave_timeout_ms and still
  // serving, for keepers to copy retained versions only this worker holds),
  // then stops serving (reads in flight fail over to other holders). Call
  // Unpublish first for a graceful exit.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Registers references to caller-owned tensors as rank `rank` of a group
  // of `group_size`. No copy. The version becomes readable when all ranks
  // of the group have published. Version numbers must increase per model.
  // Fails with, and then nothing stays published:
  //   INVALID_ARGUMENT     bad version number, rank, chunk size or checksum
  //                        name; tensors of mixed memories; a part the hub
  //                        finds inconsistent with the version's other
  //                        ranks (group size, chunk size; pieces that
  //                        overlap, or with the last rank do not tile).
  //   FAILED_PRECONDITION  the version number is not greater than the
  //                        model's last; the memory is still published as
  //                        another version (Unpublish it first).
  //   ALREADY_EXISTS       this rank of the version is published already,
  //                        by another worker or with other bytes.
  //   ABORTED              the version was aborted.
  //   RESOURCE_EXHAUSTED   the hub's bounds (models) are reached.
  //   PERMISSION_DENIED    the hub refused the secret or certificate.
  //   UNAVAILABLE, DEADLINE_EXCEEDED  the hub did not answer in timeout_ms.
  Status Publish(std::string_view model, Version version,
                 const std::vector<TensorRef>& tensors,
                 const PublishOptions& options = {});

  // Withdraws this worker's reference and waits until reads in flight from
  // it have finished; afterwards the memory may be reused. Reads that arrive
  // later are refused. DEADLINE_EXCEEDED if reads are still running at the
  // deadline (new reads are refused all the same).
  //
  // Retained versions: if this worker holds the last reliable copy, the
  // call first waits (still serving, within the timeout) until a keeper or
  // another reliable worker has copied it. If none has by then, it fails
  // with FAILED_PRECONDITION and nothing changes (still published), unless
  // `force` is set: then the reference is dropped and the version may be
  // lost.
  Status Unpublish(std::string_view model, Version version,
                   int64_t timeout_ms = 30000, bool force = false);

  // Pins a version (pending or committed) as retained: it stays fetchable
  // as long as one reliable copy lives, because the last reliable holder
  // cannot unpublish or leave before a keeper (`tensorhub keeper`) has
  // copied it. A retained version is lost only if its last reliable copy
  // dies; it is then UNAVAILABLE. Pins live in the hub: after a hub restart,
  // keepers pin the versions they hold again; others must be pinned again.
  Status Retain(std::string_view model, Version version);
  // Withdraws a Retain pin (NOT_FOUND if there is none).
  Status Unretain(std::string_view model, Version version);

  // Resolves `version` (Version::Latest() for the highest committed one),
  // pulls every chunk from holders into `destination`, verifies each
  // chunk's checksum, retries failed chunks on other holders, and returns
  // the version fetched. `destination` must name exactly the version's
  // tensors with matching dtypes and shapes. For a version published as
  // pieces (PublishOptions::pieces) that is every logical tensor with its
  // global shape; it is then fetched as whole slices (FetchSlices), and
  // with `serve` served onward once verified as a holder of slices whose
  // boxes are the whole tensors (Unpublish withdraws it). So is a version
  // published whole that the hub says is held in part only by holders of
  // slices. Fails with (the destination's contents then unspecified, none
  // of it served):
  //   INVALID_ARGUMENT     the destination does not match the version
  //                        (names, dtypes, shapes, sizes), or a reader group
  //                        id over 256 characters.
  //   NOT_FOUND            unknown model or version.
  //   FAILED_PRECONDITION  the version is not committed; a reader group's
  //                        step older than the steps it keeps; every holder
  //                        refused this reader's configuration (TLS).
  //   DATA_LOSS            every holder known served bytes that failed
  //                        their checksum: asking again will not help.
  //   UNAVAILABLE          no live holder (or the hub is unreachable).
  //   DEADLINE_EXCEEDED    timeout_ms passed while bytes still arrived.
  //   ABORTED              the version was aborted during the fetch.
  //   PERMISSION_DENIED    the hub or the holders refused the secret or
  //                        certificate.
  // The hub is told the fetch ended either way.
  Result<FetchStats> Fetch(std::string_view model, Version version,
                           const std::vector<TensorRef>& destination,
                           const FetchOptions& options = {});

  // Partial fetch: resolves `version` and pulls only the given boxes of
  // its logical tensors (reshard.h: TensorSlice), whatever the trainer
  // ranks' layout, straight into the caller's memory (host memory), with
  // an optional dtype conversion on the way in. Reads only the segments
  // the boxes touch (the publisher's segment checksums verify them: at
  // most one segment more at each end of each range read), striped over
  // the holders, failing over like Fetch. The slices are served onward
  // only with FetchOptions::serve_slices. FetchStats::bytes counts the bytes
  // read; its stages and the metrics count a fetch of slices as any fetch.
  // Fails as Fetch does, and with INVALID_ARGUMENT (nothing fetched) for an
  // unknown tensor, a box outside the tensor, a dtype that cannot be
  // converted, F8 without scales, a shape that is not the box's;
  // FAILED_PRECONDITION for a version published without segment checksums
  // (or from device memory: fetch it whole), or slices in device memory.
  Result<FetchStats> FetchSlices(std::string_view model, Version version,
                                 const std::vector<TensorSlice>& slices,
                                 const FetchOptions& options = {});

  Result<std::vector<ModelInfo>> List();
  // Manifest and holders of one version (Latest() allowed). Uncommitted
  // versions are described too, with their state.
  Result<VersionInfo> Describe(std::string_view model, Version version);
  // The same for a reader group (FetchOptions::group): Latest() resolves to
  // the version the group pinned for `group_step`, pinning the newest
  // committed one if this is the group's first call for the step.
  Result<VersionInfo> Describe(std::string_view model, Version version,
                               std::string_view group, uint64_t group_step);

  const WorkerId& id() const;
  std::string data_address() const;
  // Where the metrics are served (HOST:PORT), empty without
  // ClientOptions::metrics_listen.
  std::string metrics_address() const;

 private:
  class Impl;
  friend class client::ClientFactory;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A read-only view of the hub for monitoring and inspection (`tensorhub
// top`, `ls`, `show`): it does not register as a worker, holds nothing and
// serves nothing. Uses only
// ClientOptions' hub_address (an HA set's list too), secret, TLS files
// (tls_ca_file, tls_cert_file, tls_key_file, tls_server_name) and
// rpc_timeout_ms. Safe to call from several threads at once.
class HubWatcher {
 public:
  // Reads and checks the TLS files (INVALID_ARGUMENT naming a bad one);
  // connects lazily, so an unreachable hub shows at the first Snapshot.
  static Result<std::unique_ptr<HubWatcher>> Connect(
      const ClientOptions& options);
  ~HubWatcher();
  HubWatcher(const HubWatcher&) = delete;
  HubWatcher& operator=(const HubWatcher&) = delete;

  // One bounded view (snapshot.h), within rpc_timeout_ms.
  Result<HubSnapshot> Snapshot(const SnapshotLimits& limits = {});
  // As Client::List and Client::Describe (holders in the hub's order, not
  // nearest first: a watcher has no place), within rpc_timeout_ms.
  Result<std::vector<ModelInfo>> List();
  Result<VersionInfo> Describe(std::string_view model, Version version);

 private:
  class Impl;
  explicit HubWatcher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tensorhub

#endif  // TENSORHUB_CLIENT_H_
