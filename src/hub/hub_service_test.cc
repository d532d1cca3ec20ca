// The hub's gRPC adapter called directly (no server, no sockets): what it
// answers about versions it does not know, inside and after the rebuild
// window that follows a start.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/manifest.h"
#include "hub/coordinator.h"
#include "hub/hub_service_internal.h"
#include "wire/proto_convert.h"

namespace tensorhub::hub {
namespace {

struct Answers {
  grpc::Status resolve;
  grpc::Status resolve_latest;
  grpc::Status schedule;
};

// Asks a hub that started `age_ms` ago, with a rebuild window of
// `rebuild_ms`, about a model it has never heard of.
Answers AskAboutAnUnknownModel(int64_t rebuild_ms, int64_t age_ms) {
  HubConfig c;
  c.lease_ms = 1000;
  std::unique_ptr<v1::Hub::Service> s =
      NewHubService(c, "", rebuild_ms, NowMs() - age_ms);
  Answers a;
  grpc::ServerContext ctx1, ctx2, ctx3;
  v1::ResolveRequest rq;
  rq.set_worker_id("reader");
  rq.set_model("m");
  rq.set_version(7);
  v1::ResolveResponse rs;
  a.resolve = s->Resolve(&ctx1, &rq, &rs);
  rq.set_version(0);
  a.resolve_latest = s->Resolve(&ctx2, &rq, &rs);
  v1::ScheduleRequest sq;
  sq.set_worker_id("reader");
  sq.set_model("m");
  sq.set_version(7);
  sq.set_max_sources(4);
  v1::ScheduleResponse ss;
  a.schedule = s->Schedule(&ctx3, &sq, &ss);
  return a;
}

TEST(ManifestProtoTest, TheChunkChecksumKindRoundTripsAndAnUnknownIsRefused) {
  std::vector<uint8_t> bytes(3 * kMinChunkBytes + 5, 9);
  std::vector<TensorRef> refs = {{TensorSpec{"w", DType::kU8, {bytes.size()}},
                                  bytes.data(), bytes.size(),
                                  MemoryLocation::Host()}};
  Result<PartLayout> part = BuildPartLayout(0, refs, kMinChunkBytes);
  ASSERT_TRUE(part.ok());
  v1::PartManifest pm;
  wire::ToProto(*part, &pm);
  EXPECT_EQ(pm.chunk_checksum(), v1::CHUNK_CHECKSUM_XXH3_64_TREE_64K);
  Result<PartLayout> back = wire::FromProto(pm);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, *part);
  // A publisher of a later release: the kind comes through as it is, and
  // validation refuses it by name.
  pm.set_chunk_checksum(static_cast<v1::ChunkChecksum>(5));
  back = wire::FromProto(pm);
  ASSERT_TRUE(back.ok());
  Status s = Manifest::ValidatePart(*back, kMinChunkBytes);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("chunk checksum unknown (5)"), std::string::npos)
      << s.ToString();
}

TEST(HubServiceTest, UnknownVersionIsUnavailableWhileTheHubRebuilds) {
  // Started 100 ms ago, rebuilding for a minute: no timing in play.
  Answers a = AskAboutAnUnknownModel(60000, 100);
  for (const grpc::Status* s : {&a.resolve, &a.resolve_latest, &a.schedule}) {
    EXPECT_EQ(s->error_code(), grpc::StatusCode::UNAVAILABLE)
        << s->error_message();
    EXPECT_NE(s->error_message().find("rebuilding its state from the workers"),
              std::string::npos)
        << s->error_message();
    // The state machine's own reason is kept.
    EXPECT_NE(s->error_message().find("'m'"), std::string::npos)
        << s->error_message();
  }
}

TEST(HubServiceTest, UnknownVersionIsNotFoundAfterTheRebuildWindow) {
  // Started a minute ago with a one-second window.
  Answers a = AskAboutAnUnknownModel(1000, 60000);
  for (const grpc::Status* s : {&a.resolve, &a.resolve_latest, &a.schedule}) {
    EXPECT_EQ(s->error_code(), grpc::StatusCode::NOT_FOUND)
        << s->error_message();
    EXPECT_EQ(s->error_message().find("rebuilding"), std::string::npos)
        << s->error_message();
  }
}

TEST(HubServiceTest, NoRebuildWindowAnswersFromTheTableAtOnce) {
  Answers a = AskAboutAnUnknownModel(0, 0);
  EXPECT_EQ(a.resolve.error_code(), grpc::StatusCode::NOT_FOUND)
      << a.resolve.error_message();
  EXPECT_EQ(a.schedule.error_code(), grpc::StatusCode::NOT_FOUND)
      << a.schedule.error_message();
}

// ---- A hub of an HA set, with a coordinator the test plays ----

// Register and Heartbeat answers carry the plan for the fleet (interval
// and lease), and the default rebuild window (-1) is the planned lease, so
// it grows while a large fleet re-registers. No timing in play: the window
// is a minute or more and the test takes milliseconds.
TEST(HubServiceTest, AnswersCarryTheHeartbeatPlanAndTheWindowFollowsIt) {
  HubConfig c;
  c.lease_ms = 60000;  // base interval 5 s (capped)
  c.heartbeat_budget_per_s = 1;
  c.max_lease_ms = 600000;
  std::unique_ptr<v1::Hub::Service> s =
      NewHubService(c, "", /*rebuild_ms=*/-1, NowMs());
  auto register_one = [&](int i) {
    grpc::ServerContext ctx;
    v1::RegisterWorkerRequest rq;
    rq.set_name("w" + std::to_string(i));
    rq.set_data_address("127.0.0.1:" + std::to_string(1000 + i));
    v1::RegisterWorkerResponse rs;
    grpc::Status st = s->RegisterWorker(&ctx, &rq, &rs);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return rs;
  };
  auto unknown_model_answer = [&] {
    grpc::ServerContext ctx;
    v1::ResolveRequest rq;
    rq.set_worker_id("reader");
    rq.set_model("m");
    rq.set_version(7);
    v1::ResolveResponse rs;
    return s->Resolve(&ctx, &rq, &rs);
  };
  v1::RegisterWorkerResponse first = register_one(0);
  EXPECT_EQ(first.heartbeat_interval_ms(), 5000u);
  EXPECT_EQ(first.lease_ms(), 60000u);
  grpc::Status r = unknown_model_answer();
  EXPECT_EQ(r.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(r.error_message().find("(for 60000 ms)"), std::string::npos)
      << r.error_message();
  v1::RegisterWorkerResponse last;
  for (int i = 1; i < 30; ++i) last = register_one(i);
  // 30 workers at 1 heartbeat/s: every 30 s, a lease of 90 s.
  EXPECT_EQ(last.heartbeat_interval_ms(), 30000u);
  EXPECT_EQ(last.lease_ms(), 90000u);
  grpc::ServerContext ctx;
  v1::HeartbeatRequest hq;
  hq.set_worker_id(first.worker_id());
  v1::HeartbeatResponse hr;
  grpc::Status h = s->Heartbeat(&ctx, &hq, &hr);
  ASSERT_TRUE(h.ok()) << h.error_message();
  EXPECT_EQ(hr.heartbeat_interval_ms(), 30000u);
  EXPECT_EQ(hr.lease_ms(), 90000u);
  r = unknown_model_answer();
  EXPECT_EQ(r.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(r.error_message().find("(for 90000 ms)"), std::string::npos)
      << r.error_message();
}

// Records what the hub asks to persist; answers as the test says.
class ScriptedCoordinator final : public Coordinator {
 public:
  Status Start(Callbacks) override { return Status::Ok(); }
  bool Leading() const override { return leading; }
  std::string Leader() const override { return leader; }
  const std::string& self() const override { return self_; }
  Status Persist(const std::vector<DurableChange>& changes, int64_t) override {
    batches.push_back(changes);
    if (!answer.ok() && answer.code() == StatusCode::kFailedPrecondition) {
      leading = false;  // fenced off, as the etcd coordinator does
    }
    return answer;
  }
  void Stop() override {}

  bool leading = false;
  std::string leader;
  Status answer;
  std::vector<std::vector<DurableChange>> batches;

 private:
  std::string self_ = "127.0.0.1:1";
};

class HaHubServiceTest : public ::testing::Test {
 protected:
  HaHubServiceTest() {
    HubConfig c;
    c.lease_ms = 60000;
    service_ = NewHubService(c, "", /*rebuild_ms=*/0, -1, &coord_);
  }

  void Elect(const DurableState& d = {}) {
    ASSERT_TRUE(ElectService(service_.get(), d).ok());
    coord_.leading = true;
    coord_.leader = coord_.self();
  }

  std::string Register() {
    grpc::ServerContext ctx;
    v1::RegisterWorkerRequest rq;
    rq.set_name("w");
    rq.set_data_address("127.0.0.1:9");
    v1::RegisterWorkerResponse rs;
    grpc::Status s = service_->RegisterWorker(&ctx, &rq, &rs);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return rs.worker_id();
  }

  grpc::Status Publish(const std::string& worker, uint64_t version) {
    static std::vector<uint8_t> bytes(kMinChunkBytes, 7);
    std::vector<TensorRef> refs = {{TensorSpec{"w", DType::kU8, {bytes.size()}},
                                    bytes.data(), bytes.size(),
                                    MemoryLocation::Host()}};
    Result<PartLayout> part = BuildPartLayout(0, refs, kMinChunkBytes);
    EXPECT_TRUE(part.ok());
    grpc::ServerContext ctx;
    v1::PublishRequest rq;
    rq.set_worker_id(worker);
    rq.set_model("m");
    rq.set_version(version);
    rq.set_group_size(1);
    rq.set_chunk_bytes(kMinChunkBytes);
    rq.set_epoch(1);
    wire::ToProto(*part, rq.mutable_part());
    v1::PublishResponse rs;
    return service_->Publish(&ctx, &rq, &rs);
  }

  grpc::Status Retain(uint64_t version, bool retain = true) {
    grpc::ServerContext ctx;
    v1::RetainRequest rq;
    rq.set_model("m");
    rq.set_version(version);
    rq.set_unretain(!retain);
    v1::RetainResponse rs;
    return service_->Retain(&ctx, &rq, &rs);
  }

  ScriptedCoordinator coord_;
  std::unique_ptr<v1::Hub::Service> service_;
};

TEST_F(HaHubServiceTest, AStandbyAnswersEveryCallNamingTheLeader) {
  coord_.leader = "10.0.0.9:7070";
  grpc::ServerContext ctx;
  v1::ListModelsRequest rq;
  v1::ListModelsResponse rs;
  grpc::Status s = service_->ListModels(&ctx, &rq, &rs);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(
      s.error_message().find("is not the leader; leader is 10.0.0.9:7070"),
      std::string::npos)
      << s.error_message();
  coord_.leader.clear();
  grpc::ServerContext ctx2;
  v1::RegisterWorkerRequest rr;
  v1::RegisterWorkerResponse rp;
  s = service_->RegisterWorker(&ctx2, &rr, &rp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(s.error_message().find("no leader is elected yet"),
            std::string::npos)
      << s.error_message();
  EXPECT_TRUE(coord_.batches.empty());
}

TEST_F(HaHubServiceTest, DurableChangesAreWrittenBeforeTheAnswer) {
  DurableState d;
  d.highest["m"] = Version(4);
  Elect(d);
  std::string w = Register();
  // The floor from etcd holds; a refused publish writes nothing.
  EXPECT_EQ(Publish(w, 4).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(coord_.batches.empty());
  ASSERT_TRUE(Publish(w, 5).ok());
  ASSERT_EQ(coord_.batches.size(), 1u);
  ASSERT_EQ(coord_.batches[0].size(), 1u);
  EXPECT_EQ(coord_.batches[0][0].kind, DurableChange::Kind::kHighest);
  EXPECT_EQ(coord_.batches[0][0].version, Version(5));
  ASSERT_TRUE(Retain(5).ok());
  ASSERT_EQ(coord_.batches.size(), 2u);
  EXPECT_EQ(coord_.batches[1][0].kind, DurableChange::Kind::kPin);
}

TEST_F(HaHubServiceTest, AFailedWriteIsRetriedWithTheNextOne) {
  Elect();
  std::string w = Register();
  ASSERT_TRUE(Publish(w, 1).ok());
  coord_.answer = Unavailable("etcd down");
  grpc::Status s = Retain(1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  coord_.answer = Status::Ok();
  // The pin is in memory already (a repeat changes nothing there); the next
  // write carries it.
  ASSERT_TRUE(Publish(w, 2).ok());
  const std::vector<DurableChange>& last = coord_.batches.back();
  ASSERT_EQ(last.size(), 2u);
  EXPECT_EQ(last[0].kind, DurableChange::Kind::kPin);
  EXPECT_EQ(last[1].kind, DurableChange::Kind::kHighest);
}

TEST_F(HaHubServiceTest, AFencedWriteAnswersLikeAStandbyAndDropsTheState) {
  Elect();
  std::string w = Register();
  ASSERT_TRUE(Publish(w, 1).ok());
  coord_.answer = FailedPrecondition("lost the leadership");
  coord_.leader = "10.0.0.9:7070";
  grpc::Status s = Retain(1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(s.error_message().find("leader is 10.0.0.9:7070"),
            std::string::npos)
      << s.error_message();
  // The coordinator demotes the hub: its state goes; elected again, it
  // starts from what etcd holds, and its workers must register again.
  DemoteService(service_.get());
  coord_.answer = Status::Ok();
  Elect();
  EXPECT_EQ(Publish(w, 2).error_code(), grpc::StatusCode::NOT_FOUND);
}

// ---- BeginFetch: the three steps of a fetch's start in one answer ----

class BeginFetchTest : public HaHubServiceTest {
 protected:
  BeginFetchTest() { Elect(); }

  grpc::Status BeginFetch(const std::string& reader, uint64_t fill_epoch,
                          v1::BeginFetchResponse* rs,
                          const std::string& group = "") {
    grpc::ServerContext ctx;
    v1::BeginFetchRequest rq;
    rq.set_worker_id(reader);
    rq.set_model("m");
    rq.set_version(0);
    rq.set_group(group);
    rq.set_group_step(group.empty() ? 0 : 3);
    rq.set_max_sources(4);
    rq.set_fill_epoch(fill_epoch);
    return service_->BeginFetch(&ctx, &rq, rs);
  }
};

TEST_F(BeginFetchTest, ResolvesRegistersTheFillAndSchedulesInOneAnswer) {
  const std::string trainer = Register();
  ASSERT_TRUE(Publish(trainer, 1).ok());
  const std::string reader = Register();
  v1::BeginFetchResponse rs;
  grpc::Status s = BeginFetch(reader, /*fill_epoch=*/5, &rs);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(rs.version(), 1u);
  EXPECT_EQ(rs.state(), v1::COMMITTED);
  v1::VersionManifest vm;
  ASSERT_TRUE(vm.ParseFromString(rs.manifest()));
  EXPECT_EQ(vm.group_size(), 1u);
  EXPECT_TRUE(rs.filling()) << rs.fill_detail();
  ASSERT_EQ(rs.sources_size(), 1);
  EXPECT_EQ(rs.sources(0).worker_id(), trainer);
  EXPECT_EQ(rs.sources_code(), 0u);
  // Sources in hand: no fallback list.
  EXPECT_EQ(rs.holders_size(), 0);
  EXPECT_EQ(rs.num_holders(), 1u);

  // The reader is a filling holder now: the next reader may be sent to it
  // (it feeds readers that joined after it), under the epoch it named.
  const std::string next = Register();
  v1::BeginFetchResponse rs2;
  ASSERT_TRUE(BeginFetch(next, 0, &rs2).ok());
  EXPECT_FALSE(rs2.filling());
  EXPECT_EQ(rs2.num_holders(), 2u);
  bool saw_reader = false;
  for (const v1::Holder& h : rs2.sources()) {
    if (h.worker_id() == reader) {
      saw_reader = true;
      EXPECT_TRUE(h.filling());
      EXPECT_EQ(h.epoch(), 5u);
    }
  }
  EXPECT_TRUE(saw_reader);
}

TEST_F(BeginFetchTest, AReaderGroupPinIsWrittenBeforeTheAnswer) {
  const std::string trainer = Register();
  ASSERT_TRUE(Publish(trainer, 1).ok());
  coord_.batches.clear();
  v1::BeginFetchResponse rs;
  ASSERT_TRUE(BeginFetch(Register(), 0, &rs, "g").ok());
  EXPECT_EQ(rs.version(), 1u);
  bool pinned = false;
  for (const auto& batch : coord_.batches) {
    for (const DurableChange& c : batch) {
      pinned = pinned || (c.kind == DurableChange::Kind::kGroup &&
                          c.group == "g" && c.record.steps.count(3) == 1);
    }
  }
  EXPECT_TRUE(pinned);
}

TEST_F(BeginFetchTest, UnknownModelFailsLikeResolve) {
  v1::BeginFetchResponse rs;
  grpc::Status s = BeginFetch(Register(), 5, &rs);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
}

// A rack-aware hub tells a reader behind another rack's oversubscribed
// uplink when to ask again, and a recheck answers the books: here the
// reader in rack 2 was moved onto the one that arrived in rack 1 after it.
class RackAwareServiceTest : public HaHubServiceTest {
 protected:
  RackAwareServiceTest() {
    HubConfig c;
    c.lease_ms = 60000;
    c.rack_oversubscription = 4;
    c.recheck_ms = 3;
    service_ = NewHubService(c, "", /*rebuild_ms=*/0, -1, &coord_);
    Elect();
  }
  std::string RegisterIn(const std::string& rack) {
    grpc::ServerContext ctx;
    v1::RegisterWorkerRequest rq;
    rq.set_name("w");
    rq.set_data_address("127.0.0.1:9");
    rq.mutable_labels()->set_datacenter("dc");
    rq.mutable_labels()->set_rack(rack);
    v1::RegisterWorkerResponse rs;
    grpc::Status s = service_->RegisterWorker(&ctx, &rq, &rs);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return rs.worker_id();
  }
  v1::BeginFetchResponse Fetch(const std::string& reader) {
    grpc::ServerContext ctx;
    v1::BeginFetchRequest rq;
    rq.set_worker_id(reader);
    rq.set_model("m");
    rq.set_max_sources(1);
    rq.set_fill_epoch(2);
    v1::BeginFetchResponse rs;
    grpc::Status s = service_->BeginFetch(&ctx, &rq, &rs);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return rs;
  }
};

TEST_F(RackAwareServiceTest, AnswersCarryTheRecheckAndARecheckGivesTheBooks) {
  const std::string trainer = RegisterIn("r0");
  ASSERT_TRUE(Publish(trainer, 1).ok());
  const std::string a1 = RegisterIn("r1");
  v1::BeginFetchResponse f1 = Fetch(a1);
  ASSERT_EQ(f1.sources_size(), 1);
  EXPECT_EQ(f1.sources(0).worker_id(), trainer);
  EXPECT_EQ(f1.recheck_after_ms(), 3u);
  const std::string b1 = RegisterIn("r2");
  v1::BeginFetchResponse f2 = Fetch(b1);
  ASSERT_EQ(f2.sources_size(), 1);
  EXPECT_EQ(f2.sources(0).worker_id(), a1);
  const std::string a2 = RegisterIn("r1");
  v1::BeginFetchResponse f3 = Fetch(a2);
  ASSERT_EQ(f3.sources_size(), 1);
  EXPECT_EQ(f3.sources(0).worker_id(), a1);
  EXPECT_EQ(f3.recheck_after_ms(), 0u);  // reads inside its rack
  grpc::ServerContext ctx;
  v1::ScheduleRequest rq;
  rq.set_worker_id(b1);
  rq.set_model("m");
  rq.set_version(1);
  rq.set_max_sources(1);
  rq.set_recheck(true);
  v1::ScheduleResponse rs;
  ASSERT_TRUE(service_->Schedule(&ctx, &rq, &rs).ok());
  ASSERT_EQ(rs.holders_size(), 1);
  EXPECT_EQ(rs.holders(0).worker_id(), a2);
  EXPECT_EQ(rs.recheck_after_ms(), 3u);  // moved: soon again
}

}  // namespace
}  // namespace tensorhub::hub
