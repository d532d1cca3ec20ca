// The Client on its seams (client_deps.h): a FakeTransport for the data
// plane, a scripted in-memory hub for the control plane, and a FakeClock
// that moves only when the client waits on it. No sockets, no real sleeps:
// each test runs in simulated time and checks codes and counts, never how
// long anything took.
#include "tensorhub/client.h"

#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <random>
#include <set>

#include "client/client_deps.h"
#include "client/client_metrics.h"
#include "client/control_plane.h"
#include "client/registry.h"
#include "common/clock.h"
#include "metrics/metrics.h"
#include "transport/fake/fake_transport.h"
#include "wire/proto_convert.h"

namespace tensorhub::client {
namespace {

using transport::FakeTransport;
using transport::Fault;
using transport::FaultWhat;
using transport::FaultWhere;
using Bytes = std::vector<uint8_t>;

constexpr char kModel[] = "m";
constexpr uint64_t kChunkBytes = kMinChunkBytes;

// One version of random bytes (one part, a few tensors) and the holders'
// way of serving it.
struct TestVersion {
  std::vector<Bytes> data;
  Manifest manifest;
};

TestVersion MakeVersion(uint32_t seed) {
  std::mt19937_64 rng(seed);
  TestVersion v;
  std::vector<TensorRef> refs;
  v.data.resize(6);
  for (size_t i = 0; i < v.data.size(); ++i) {
    const uint64_t n = 1 + rng() % (3 * kChunkBytes);
    v.data[i].resize(n);
    for (uint8_t& x : v.data[i]) x = static_cast<uint8_t>(rng());
    TensorRef t;
    t.spec.name = "t" + std::to_string(i);
    t.spec.dtype = DType::kU8;
    t.spec.shape = {n};
    t.data = v.data[i].data();
    t.bytes = n;
    refs.push_back(t);
  }
  Result<PartLayout> part = BuildPartLayout(0, refs, kChunkBytes);
  EXPECT_TRUE(part.ok()) << part.status().ToString();
  v.manifest = Manifest(1, kChunkBytes, {*part});
  return v;
}

// `bad_manifest`: the holder serves a manifest other than the hub's (one
// chunk checksum changed), as a holder of another encoding or a corrupt
// one would.
FakeTransport::Serve ServeFrom(const TestVersion& v,
                               bool bad_manifest = false) {
  return [&v, bad_manifest](const wire::ReadRequest& req,
                            std::span<const iovec> dest) -> Status {
    if (req.part == wire::kManifestPart) {
      Manifest m = v.manifest;
      if (bad_manifest) {
        std::vector<PartLayout> parts = m.parts();
        parts[0].chunk_xxh3[0] ^= 1;
        m = Manifest(m.group_size(), m.chunk_bytes(), std::move(parts));
      }
      const std::string bytes = wire::EncodeManifest(m);
      if (req.offset + req.length > bytes.size())
        return InvalidArgument("test: read past the manifest");
      const iovec src{const_cast<char*>(bytes.data()) + req.offset, req.length};
      if (!transport::CopyPieces({&src, 1}, dest))
        return Internal("test: bad read sizes");
      return Status::Ok();
    }
    std::vector<uint8_t*> bases;
    for (const Bytes& b : v.data)
      bases.push_back(const_cast<uint8_t*>(b.data()));
    std::vector<iovec> src;
    AppendPieces(v.manifest.parts()[req.part], bases, req.offset, req.length,
                 &src);
    if (!transport::CopyPieces(src, dest))
      return Internal("test: bad read sizes");
    return Status::Ok();
  };
}

// A hub that knows one committed version of kModel and answers from a
// script: its holders, how many answers go to one Schedule, and how many
// calls to answer UNAVAILABLE first, as a hub rebuilding after a start does.
class ScriptedHub final : public ControlPlane {
 public:
  explicit ScriptedHub(const Manifest& manifest) : manifest_(manifest) {}

  // Script (set before the client runs, or under no race: the client's
  // calls are on its fetch thread and its heartbeat, which the tests keep
  // idle).
  std::vector<ResolvedSource> holders;
  size_t sources_per_answer = 16;
  int resolve_unavailable = 0;   // the first this many Resolves: rebuilding
  int schedule_unavailable = 0;  // the first this many Schedules: rebuilding

  // BeginFetch names the manifest by its SHA-256 instead of sending it
  // (as the hub does when a source holds the whole version), to a reader
  // that can take it from a source.
  bool name_manifest = false;

  int resolves() const { return Count(resolves_); }
  int fetch_dones() const { return Count(fetch_dones_); }
  int forced_unpublishes() const { return Count(forced_unpublishes_); }
  std::set<std::string> excluded() const {
    std::lock_guard<std::mutex> l(mu_);
    return excluded_;
  }

  Result<WorkerId> Register(const WorkerId&, const std::string&,
                            const std::string&,
                            const std::vector<DataEndpoint>&, const Labels&,
                            WorkerClass, bool, int64_t) override {
    return WorkerId("reader");
  }
  Status Heartbeat(const WorkerId&) override { return Status::Ok(); }
  Status Publish(const WorkerId&, const std::string&, Version, uint32_t,
                 uint32_t, uint64_t, const PartLayout&, uint64_t, bool,
                 int64_t) override {
    return Status::Ok();
  }
  Status AddHolder(const WorkerId&, const std::string&, Version, uint64_t,
                   const Manifest&, bool, int64_t) override {
    return Status::Ok();
  }
  Result<FetchStart> BeginFetch(const WorkerId& reader,
                                const std::string& model, Version version,
                                const std::string& group, uint64_t group_step,
                                uint32_t max_sources,
                                std::optional<uint64_t> fill_epoch,
                                int64_t timeout_ms,
                                bool manifest_from_sources) override {
    Result<FetchStart> r = ControlPlane::BeginFetch(
        reader, model, version, group, group_step, max_sources, fill_epoch,
        timeout_ms, manifest_from_sources);
    if (r.ok() && name_manifest && manifest_from_sources &&
        r->resolved.manifest.has_value()) {
      const std::string bytes = wire::EncodeManifest(*r->resolved.manifest);
      r->manifest_ref = ManifestRef{wire::Sha256Of(bytes), bytes.size()};
      r->resolved.manifest.reset();
    }
    return r;
  }
  Result<Scheduled> Schedule(const WorkerId&, const std::string& model,
                             Version version,
                             const std::vector<WorkerId>& exclude,
                             uint32_t max_sources, int64_t) override {
    std::lock_guard<std::mutex> l(mu_);
    if (schedule_unavailable > 0) {
      --schedule_unavailable;
      return Unavailable(
          "schedule: the hub is rebuilding its state; try again");
    }
    TH_RETURN_IF_ERROR(Check(model, version));
    Scheduled out;
    for (const ResolvedSource& h : holders) {
      bool skip = false;
      for (const WorkerId& e : exclude) {
        excluded_.insert(e.value());
        skip = skip || e == h.worker;
      }
      if (!skip && out.sources.size() <
                       std::min<size_t>(max_sources, sources_per_answer)) {
        out.sources.push_back(h);
      }
    }
    // As the hub: when every holder is excluded there is none to offer.
    if (out.sources.empty())
      return Unavailable("schedule: no holder left but those excluded");
    return out;
  }
  Status FetchDone(const WorkerId&, const std::string&, Version,
                   int64_t) override {
    std::lock_guard<std::mutex> l(mu_);
    ++fetch_dones_;
    return Status::Ok();
  }
  Status Unpublish(const WorkerId&, const std::string&, Version, int64_t,
                   bool force, int64_t) override {
    std::lock_guard<std::mutex> l(mu_);
    forced_unpublishes_ += force ? 1 : 0;
    return Status::Ok();
  }
  Result<Resolved> Resolve(const WorkerId&, const std::string& model,
                           Version version, bool, const std::string&, uint64_t,
                           int64_t) override {
    std::lock_guard<std::mutex> l(mu_);
    ++resolves_;
    if (resolve_unavailable > 0) {
      --resolve_unavailable;
      return Unavailable("resolve: the hub is rebuilding its state; try again");
    }
    TH_RETURN_IF_ERROR(Check(model, version));
    Resolved r;
    r.version = Version(1);
    r.state = VersionState::kCommitted;
    r.manifest = manifest_;
    r.sources = holders;
    r.num_holders = static_cast<uint32_t>(holders.size());
    return r;
  }
  Result<std::vector<ModelInfo>> List() override {
    return std::vector<ModelInfo>{};
  }
  Status Leave(const WorkerId&, int64_t, int64_t) override {
    return Status::Ok();
  }
  Status Retain(const std::string&, Version, bool) override {
    return Status::Ok();
  }
  Result<KeeperPollResult> KeeperPoll(const WorkerId&, int64_t) override {
    return KeeperPollResult{};
  }

 private:
  static Status Check(const std::string& model, Version version) {
    if (model != kModel || !(version.is_latest() || version == Version(1))) {
      return NotFound("no such version");
    }
    return Status::Ok();
  }
  int Count(const int& n) const {
    std::lock_guard<std::mutex> l(mu_);
    return n;
  }

  const Manifest manifest_;
  mutable std::mutex mu_;
  int resolves_ = 0;                // guarded by mu_
  int fetch_dones_ = 0;             // guarded by mu_
  int forced_unpublishes_ = 0;      // guarded by mu_
  std::set<std::string> excluded_;  // guarded by mu_
};

ResolvedSource Holder(const std::string& name, const TestVersion& v) {
  ResolvedSource s;
  s.worker = WorkerId(name);
  s.data_address = name;
  s.epoch = 1;
  s.chunks = {{0, v.manifest.num_chunks()}};
  return s;
}

// A client on the fakes. The test keeps pointers to the fakes it hands over.
class ClientOnFakes : public ::testing::Test {
 protected:
  ClientOnFakes()
      : v_(MakeVersion(7)), clock_(0, FakeClock::Mode::kAdvanceOnWait) {
    auto transport = std::make_unique<FakeTransport>();
    auto hub = std::make_unique<ScriptedHub>(v_.manifest);
    transport_ = transport.get();
    hub_ = hub.get();
    deps_.transport = std::move(transport);
    deps_.control = std::move(hub);
    deps_.clock = &clock_;
  }

  std::unique_ptr<Client> Connect() {
    ClientOptions o;
    o.heartbeat_interval_ms = 3600 * 1000;  // no heartbeat during a test
    o.leave_timeout_ms = 0;
    Result<std::unique_ptr<Client>> c =
        ClientFactory::Connect(o, std::move(deps_));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  // Fetches kModel@1 into dest_ on one stream, so that one thread waits on
  // the clock and the run is the same every time.
  Result<FetchStats> Fetch(Client& c) {
    dest_.assign(v_.data.size(), Bytes());
    std::vector<TensorRef> refs;
    for (size_t i = 0; i < v_.data.size(); ++i) {
      dest_[i].resize(v_.data[i].size());
      TensorRef t;
      t.spec.name = "t" + std::to_string(i);
      t.spec.dtype = DType::kU8;
      t.spec.shape = {dest_[i].size()};
      t.data = dest_[i].data();
      t.bytes = dest_[i].size();
      refs.push_back(t);
    }
    FetchOptions fo;
    fo.connections = 1;
    fo.timeout_ms = 60000;  // simulated
    return c.Fetch(kModel, Version(1), refs, fo);
  }

  TestVersion v_;
  FakeClock clock_;
  ClientDeps deps_;
  FakeTransport* transport_ = nullptr;  // owned by the client (deps_ first)
  ScriptedHub* hub_ = nullptr;          // owned by the client (deps_ first)
  std::vector<Bytes> dest_;
};

// The hub names one holder at a time. The first refuses every read: the
// fetch asks the hub again, excluding it, and reads everything from the
// second.
TEST_F(ClientOnFakes, FetchFailsOverWhenAHolderRefusesReads) {
  transport_->AddHolder("a", ServeFrom(v_));
  transport_->AddHolder("b", ServeFrom(v_));
  transport_->Inject(
      Fault{"a", FaultWhere::kReadHeader, FaultWhat::kRefuse, 0, -1});
  hub_->holders = {Holder("a", v_), Holder("b", v_)};
  hub_->sources_per_answer = 1;
  std::unique_ptr<Client> c = Connect();
  ASSERT_NE(c, nullptr);
  Result<FetchStats> r = Fetch(*c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(dest_, v_.data);
  EXPECT_GE(transport_->fired(FaultWhere::kReadHeader), 1);
  EXPECT_EQ(hub_->excluded(), std::set<std::string>{"a"});
  ASSERT_EQ(r->sources.size(), 1u);
  EXPECT_EQ(r->sources[0].address, "b");
  EXPECT_GE(r->chunk_retries, 1u);
  EXPECT_EQ(hub_->fetch_dones(),
            0);  // a serving fetch reports itself as a holder instead
}

// A hub that has just started answers UNAVAILABLE while it rebuilds its
// table: the client asks again, pausing on its clock, and the fetch
// succeeds once the hub answers.
TEST_F(ClientOnFakes, FetchWaitsOutAHubRebuildingItsState) {
  transport_->AddHolder("a", ServeFrom(v_));
  hub_->holders = {Holder("a", v_)};
  hub_->resolve_unavailable = 3;
  hub_->schedule_unavailable = 1;
  std::unique_ptr<Client> c = Connect();
  ASSERT_NE(c, nullptr);
  const int64_t start_ms = clock_.NowMs();
  Result<FetchStats> r = Fetch(*c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(dest_, v_.data);
  EXPECT_EQ(hub_->resolves(), 4);
  // The three pauses were taken on the client's clock (simulated time).
  EXPECT_GE(clock_.NowMs() - start_ms, 300);
}

// Every holder serves bytes that fail their checksum: the fetch ends with
// DATA_LOSS (asking again will not help), gives up its partial copy at the
// hub, and leaves the destination to the caller.
TEST_F(ClientOnFakes, FetchFromACorruptOnlyHolderFailsWithDataLoss) {
  transport_->AddHolder("a", ServeFrom(v_));
  transport_->Inject(
      Fault{"a", FaultWhere::kReadBody, FaultWhat::kCorrupt, 0, -1});
  hub_->holders = {Holder("a", v_)};
  std::unique_ptr<Client> c = Connect();
  ASSERT_NE(c, nullptr);
  Result<FetchStats> r = Fetch(*c);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
  EXPECT_GE(transport_->fired(FaultWhere::kReadBody), 1);
  EXPECT_EQ(hub_->forced_unpublishes(), 1);  // the filling copy withdrawn
  EXPECT_EQ(hub_->fetch_dones(), 1);
}

// BeginFetch registers the reader as a filling holder and assigns it
// sources before the reader has the manifest to check its destination
// against: a destination that does not fit withdraws both (a forced
// unpublish of the filling reference, FetchDone for the sources).
TEST_F(ClientOnFakes, ADestinationThatDoesNotFitWithdrawsTheFetchStart) {
  transport_->AddHolder("a", ServeFrom(v_));
  hub_->holders = {Holder("a", v_)};
  std::unique_ptr<Client> c = Connect();
  ASSERT_NE(c, nullptr);
  Bytes wrong(3);
  TensorRef t;
  t.spec.name = "t0";
  t.spec.dtype = DType::kU8;
  t.spec.shape = {wrong.size()};
  t.data = wrong.data();
  t.bytes = wrong.size();
  FetchOptions fo;
  fo.timeout_ms = 60000;  // simulated
  Result<FetchStats> r = c->Fetch(kModel, Version(1), {t}, fo);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument)
      << r.status().ToString();
  EXPECT_EQ(hub_->forced_unpublishes(), 1);
  EXPECT_EQ(hub_->fetch_dones(), 1);
}

// A version the hub does not know ends the fetch at once with NOT_FOUND,
// with no read made.
TEST_F(ClientOnFakes, FetchOfAnUnknownVersionIsNotFound) {
  std::unique_ptr<Client> c = Connect();
  ASSERT_NE(c, nullptr);
  std::vector<TensorRef> none;
  Result<FetchStats> r = c->Fetch(kModel, Version(9), none, FetchOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().ToString();
}

std::string MetricsText(Client& c) { return ClientFactory::MetricsText(c); }

bool Has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

// The stages of FetchStats follow each other and add up to the whole call,
// and the metrics count what the fetch did: its bytes by path, its chunks,
// its retries, one observation per stage.
TEST_F(ClientOnFakes, StatsAndMetricsCarryTheFetchStages) {
  transport_->AddHolder("a", ServeFrom(v_));
  transport_->AddHolder("b", ServeFrom(v_));
  transport_->Inject(
      Fault{"a", FaultWhere::kReadHeader, FaultWhat::kRefuse, 0, -1});
  hub_->holders = {Holder("a", v_), Holder("b", v_)};
  hub_->sources_per_answer = 1;
  std::unique_ptr<Client> c = Connect();
  ASSERT_NE(c, nullptr);
  Result<FetchStats> r = Fetch(*c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // "a" refused, so at least one chunk was retried on "b": the retry
  // counter below is checked against a fetch that had retries.
  EXPECT_GE(transport_->fired(FaultWhere::kReadHeader), 1);
  EXPECT_GE(r->chunk_retries, 1u);
  const double stages[] = {r->resolve_seconds,    r->schedule_seconds,
                           r->first_byte_seconds, r->transfer_seconds,
                           r->verify_seconds,     r->register_seconds};
  double sum = 0;
  for (double s : stages) {
    EXPECT_GE(s, 0);
    sum += s;
  }
  EXPECT_LE(sum, r->total_seconds + 1e-6);
  EXPECT_LE(r->seconds, r->total_seconds);
  EXPECT_EQ(r->bytes_same_host, 0u);  // the fake transport has no such path

  const std::string text = MetricsText(*c);
  const uint64_t bytes = v_.manifest.total_bytes();
  EXPECT_TRUE(Has(text, "tensorhub_fetched_bytes_total{path=\"tcp\"} " +
                            std::to_string(bytes)))
      << text;
  EXPECT_TRUE(Has(text, "tensorhub_fetched_bytes_total{path=\"same_host\"} 0"));
  EXPECT_TRUE(Has(text, "tensorhub_fetched_chunks_total " +
                            std::to_string(v_.manifest.num_chunks())));
  EXPECT_TRUE(Has(text, "tensorhub_fetches_total{outcome=\"ok\"} 1"));
  EXPECT_TRUE(Has(text, "tensorhub_fetches_total{outcome=\"error\"} 0"));
  EXPECT_TRUE(Has(text, "tensorhub_fetch_chunk_retries_total " +
                            std::to_string(r->chunk_retries)));
  for (const char* stage : {"resolve", "schedule", "first_byte", "transfer",
                            "verify", "register"}) {
    EXPECT_TRUE(Has(text, "tensorhub_fetch_stage_seconds_count{stage=\"" +
                              std::string(stage) + "\"} 1"))
        << stage;
  }
}

// The hub names the manifest by its SHA-256: the reader reads it from its
// first source, checks it, and asks the hub nothing more.
TEST_F(ClientOnFakes, TheManifestComesFromASourceCheckedByItsDigest) {
  transport_->AddHolder("a", ServeFrom(v_));
  hub_->holders = {Holder("a", v_)};
  hub_->name_manifest = true;
  std::unique_ptr<Client> c = Connect();
  ASSERT_NE(c, nullptr);
  Result<FetchStats> r = Fetch(*c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(dest_, v_.data);
  EXPECT_EQ(hub_->resolves(), 1);  // BeginFetch's own
  // FetchStats names the source and the manifest's size, apart from bytes.
  EXPECT_EQ(r->manifest_source, "a");
  EXPECT_EQ(r->manifest_bytes, wire::EncodeManifest(v_.manifest).size());
  EXPECT_EQ(r->bytes, v_.manifest.total_bytes());
  const std::string text = MetricsText(*c);
  EXPECT_TRUE(Has(text, "tensorhub_fetch_manifests_total{from=\"source\"} 1"))
      << text;
  EXPECT_TRUE(Has(text, "tensorhub_fetch_manifests_total{from=\"hub\"} 0"));
}

// A source whose manifest is not the one the hub named is passed over for
// the next; when no source serves the right one, the manifest comes from
// the hub (Resolve), and the fetch still completes byte-exact.
TEST_F(ClientOnFakes, AManifestThatFailsItsDigestIsNeverTaken) {
  transport_->AddHolder("a", ServeFrom(v_, /*bad_manifest=*/true));
  transport_->AddHolder("b", ServeFrom(v_));
  hub_->holders = {Holder("a", v_), Holder("b", v_)};
  hub_->name_manifest = true;
  std::unique_ptr<Client> c = Connect();
  ASSERT_NE(c, nullptr);
  Result<FetchStats> r = Fetch(*c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(dest_, v_.data);
  EXPECT_EQ(hub_->resolves(), 1);  // b served it
  EXPECT_EQ(r->manifest_source, "b");
  EXPECT_TRUE(Has(MetricsText(*c),
                  "tensorhub_fetch_manifests_total{from=\"source\"} 1"));

  hub_->holders = {Holder("a", v_)};  // only the bad one now
  r = Fetch(*c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(dest_, v_.data);
  EXPECT_EQ(hub_->resolves(), 3);     // BeginFetch's, then for the manifest
  EXPECT_EQ(r->manifest_source, "");  // the hub's
  EXPECT_EQ(r->manifest_bytes, 0u);
  const std::string text = MetricsText(*c);
  EXPECT_TRUE(Has(text, "tensorhub_fetch_manifests_total{from=\"hub\"} 1"))
      << text;
  EXPECT_TRUE(Has(text, "tensorhub_fetch_manifests_total{from=\"source\"} 1"));
}

TEST_F(ClientOnFakes, AFailedFetchCountsAsAnError) {
  std::unique_ptr<Client> c = Connect();
  ASSERT_NE(c, nullptr);
  std::vector<TensorRef> none;
  ASSERT_FALSE(c->Fetch(kModel, Version(9), none, FetchOptions{}).ok());
  const std::string text = MetricsText(*c);
  EXPECT_TRUE(Has(text, "tensorhub_fetches_total{outcome=\"error\"} 1"))
      << text;
  EXPECT_TRUE(Has(text, "tensorhub_fetch_seconds_count 0"));
  EXPECT_TRUE(c->metrics_address().empty());  // no endpoint unless asked
}

}  // namespace
}  // namespace tensorhub::client
