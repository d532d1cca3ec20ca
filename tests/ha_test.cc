// The highly available hub set on a real etcd (Debian's etcd-server, started
// by each test on loopback with a fresh data directory): election, clients
// following the leader, takeover after kill -9 in the middle of a fetch,
// what must outlive a leader (retain pins, reader-group pins, version
// numbers, the secret's identity), and fencing of a stopped old leader.
// Every test skips, saying why, when etcd is not installed.
//
// Faults land at known points: the reader pauses after K verified chunks
// (FetchPause) before the leader is killed; a stopped leader is resumed
// only once etcd names another leader. Waits poll a condition with a
// deadline; nothing is ordered by a sleep.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <optional>
#include <thread>

#include "common/deadline.h"
#include "etcd_process.h"
#include "ha/etcd_client.h"
#include "ha/etcd_coordinator.h"
#include "ha/etcd_keys.h"
#include "hub/hub_service.h"
#include "process_util.h"
#include "subprocess.h"
#include "tensorhub.grpc.pb.h"
#include "tensorhub/client.h"
#include "tensorhub/hub.h"
#include "test_roles.h"

namespace tensorhub::testing {
namespace {

using cli::Subprocess;

constexpr char kPrefix[] = "/tensorhub/";
constexpr char kModel[] = "test-model";
// The hubs' etcd lease, and the workers' lease at the hub.
constexpr int64_t kEtcdLeaseMs = 2000;
// A new leader's rebuild window: far longer than the workers need to find
// it and re-report (one heartbeat, 200 ms, plus a few redirects), however
// loaded the machine, so that a fetch right after a takeover is answered
// "rebuilding" (retried), never NOT_FOUND (final).
constexpr int64_t kRebuildMs = 20000;

#define REQUIRE_ETCD()                                               \
  do {                                                               \
    Result<std::string> etcd_bin = lab::FindEtcd();                  \
    if (!etcd_bin.ok()) GTEST_SKIP() << etcd_bin.status().message(); \
  } while (0)

// etcd plus N hub processes (the test binary's hub role) of one set.
class HubSet {
 public:
  explicit HubSet(int n) {
    auto etcd = lab::EtcdProcess::Start();
    EXPECT_TRUE(etcd.ok()) << etcd.status().ToString();
    if (!etcd.ok()) return;
    etcd_ = std::move(etcd).value();
    auto client = ha::EtcdClient::Create(etcd_->endpoint());
    EXPECT_TRUE(client.ok());
    client_ = std::move(client).value();
    for (int i = 0; i < n; ++i) {
      ports_.push_back(FreePort());
      hubs_.emplace_back();
      Start(i);
    }
  }
  bool ok() const { return etcd_ != nullptr && !hubs_.empty(); }

  void Start(int i) {
    hubs_[i].emplace(
        MustSpawn({"--role=hub", "--port", std::to_string(ports_[i]),
                   "--lease-ms", "2000", "--etcd", etcd_->endpoint(),
                   "--etcd-lease-ms", std::to_string(kEtcdLeaseMs),
                   "--rebuild-ms", std::to_string(kRebuildMs)}));
    auto ready = hubs_[i]->ReadLine(Deadline::AfterMs(30000));
    EXPECT_TRUE(ready.ok() && ready->rfind("ready", 0) == 0)
        << (ready.ok() ? *ready : ready.status().ToString());
  }
  void Kill(int i) {
    ::kill(hubs_[i]->pid(), SIGKILL);
    hubs_[i]->Stop(1000);
    hubs_[i].reset();
  }
  pid_t pid(int i) const { return hubs_[i]->pid(); }

  std::string address(int i) const {
    return "127.0.0.1:" + std::to_string(ports_[i]);
  }
  // Every hub's address, comma-separated: what clients are given.
  std::string addresses() const {
    std::string out;
    for (size_t i = 0; i < ports_.size(); ++i) {
      out += (i > 0 ? "," : "") + address(static_cast<int>(i));
    }
    return out;
  }
  int index_of(const std::string& address) const {
    for (size_t i = 0; i < ports_.size(); ++i) {
      if (this->address(static_cast<int>(i)) == address)
        return static_cast<int>(i);
    }
    return -1;
  }

  // The leader etcd names now ("" if none).
  std::string Leader() {
    auto r = client_->Range(ha::LeaderKey(kPrefix), "", 0, 0,
                            Deadline::AfterMs(5000));
    if (!r.ok() || r->kvs.empty()) return "";
    return r->kvs[0].value;
  }
  // Waits until etcd names a leader other than `not_this`; its index.
  int WaitForLeader(const std::string& not_this = "") {
    Deadline d = Deadline::AfterMs(60000);
    while (!d.expired()) {
      std::string l = Leader();
      if (!l.empty() && l != not_this) return index_of(l);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "no leader other than '" << not_this << "' within 60 s";
    return -1;
  }
  // The keys under the set's prefix that start with `what` ("pin/", ...).
  std::vector<ha::KeyValue> Keys(const std::string& what) {
    std::string p = std::string(kPrefix) + what;
    auto r = client_->Range(p, ha::EtcdClient::PrefixEnd(p), 0, 0,
                            Deadline::AfterMs(5000));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->kvs : std::vector<ha::KeyValue>{};
  }
  ha::EtcdClient& etcd_client() { return *client_; }
  const std::string& etcd_endpoint() const { return etcd_->endpoint(); }

 private:
  std::unique_ptr<lab::EtcdProcess> etcd_;
  std::unique_ptr<ha::EtcdClient> client_;
  std::vector<int> ports_;
  std::vector<std::optional<Subprocess>> hubs_;
};

std::unique_ptr<Client> Observer(const std::string& hubs) {
  ClientOptions o;
  o.hub_address = hubs;
  o.name = "observer";
  o.heartbeat_interval_ms = 200;
  o.rpc_timeout_ms = 5000;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// Waits until `model@version` is committed with at least `holders` holders
// (the workers re-reported to a new leader); returns what was last seen.
Result<VersionInfo> WaitCommitted(Client& c, Version version,
                                  uint32_t holders) {
  Deadline d = Deadline::AfterMs(60000);
  Result<VersionInfo> info = NotFound("not asked yet");
  while (!d.expired()) {
    info = c.Describe(kModel, version);
    if (info.ok() && info->state == VersionState::kCommitted &&
        info->num_holders >= holders)
      return info;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return info;
}

// One call straight to one hub, not following the leader: what a client
// that still takes a stopped old leader for the leader would get.
grpc::Status RawRetain(const std::string& address, uint64_t version) {
  auto stub = v1::Hub::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::RetainRequest req;
  req.set_model(kModel);
  req.set_version(version);
  v1::RetainResponse resp;
  return stub->Retain(&ctx, req, &resp);
}

// kill -9 of the leader while a fetch is under way (paused after 4 of 16
// chunks): the fetch completes (its sources need no hub), a standby takes
// over, the workers re-report to it, a new fetch works at once, the retain
// pin survives, and a version number at or below the last one is refused
// although no worker holds that version any more.
TEST(HubSet, LeaderKilledMidFetchTheFetchCompletesAndTheNewLeaderServes) {
  REQUIRE_ETCD();
  HubSet set(3);
  ASSERT_TRUE(set.ok());
  const int leader = set.WaitForLeader();
  ASSERT_GE(leader, 0);
  const std::string hubs = set.addresses();
  const std::string bytes = std::to_string(64 << 20);
  Subprocess trainer =
      MustSpawn({"--role=trainer", "--hub", hubs, "--bytes", bytes});
  Subprocess trainer2 = MustSpawn(
      {"--role=trainer", "--hub", hubs, "--bytes", "1048576", "--name", "t2"});
  Subprocess reader = MustSpawn(
      {"--role=reader", "--hub", hubs, "--bytes", bytes, "--name", "r1"});
  std::unique_ptr<Client> observer = Observer(hubs);
  ASSERT_NE(observer, nullptr);

  std::string pub = Ask(trainer, "publish 3");
  ASSERT_EQ(Word(pub, 0), "published") << pub;
  Status retained = observer->Retain(kModel, Version(3));
  ASSERT_TRUE(retained.ok()) << retained.ToString();
  ASSERT_EQ(set.Keys("pin/").size(), 1u);
  // Version 4 is published and withdrawn: no worker holds it, only etcd
  // remembers that 4 was the last number.
  std::string pub4 = Ask(trainer2, "publish 4");
  ASSERT_EQ(Word(pub4, 0), "published") << pub4;
  ASSERT_EQ(Ask(trainer2, "unpublish 4"), "unpublished 4");
  std::vector<ha::KeyValue> highest = set.Keys("highest/");
  ASSERT_EQ(highest.size(), 1u);
  EXPECT_EQ(highest[0].value, "4");

  FetchUntilPaused(reader, "3", 120000, /*pause_after=*/4);
  const std::string old_leader = set.address(leader);
  set.Kill(leader);
  std::string fetched = Resume(reader);
  ASSERT_EQ(Word(fetched, 0), "fetched") << fetched;
  EXPECT_EQ(Word(fetched, 1), "3") << fetched;
  EXPECT_EQ(Word(fetched, 2), Word(pub, 2)) << fetched;

  const int next = set.WaitForLeader(old_leader);
  ASSERT_GE(next, 0);
  ASSERT_NE(next, leader);
  // A fetch right after the takeover, by a worker that never saw the old
  // leader: "rebuilding" until the holders re-report, then served.
  Subprocess late = MustSpawn(
      {"--role=reader", "--hub", hubs, "--bytes", bytes, "--name", "late"});
  EXPECT_EQ(Ask(late, "fetch 3"), "fetched 3 " + Word(pub, 2));

  // The pin outlived the leader: restored from etcd, applied when the
  // version was re-reported.
  Result<VersionInfo> info = WaitCommitted(*observer, Version(3), 2);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_TRUE(info->retained);

  // Numbering never goes backwards: no worker knows version 4, but the new
  // leader read the highest number from etcd.
  std::string again = Ask(trainer2, "publish 4");
  EXPECT_EQ(Word(again, 0), "error") << again;
  EXPECT_NE(again.find("FAILED_PRECONDITION"), std::string::npos) << again;
  EXPECT_NE(again.find("not greater than the last one published (4)"),
            std::string::npos)
      << again;
  // And the run goes on through the new leader.
  ASSERT_EQ(Ask(trainer, "unpublish 3"), "unpublished 3");
  std::string pub5 = Ask(trainer, "publish 5");
  ASSERT_EQ(Word(pub5, 0), "published") << pub5;
  EXPECT_EQ(Ask(reader, "fetch latest"), "fetched 5 " + Word(pub5, 2));
}

// SIGSTOP of the leader (a partition) until its lease expires and another
// hub leads; after SIGCONT the old leader refuses writes, naming the new
// one, and writes nothing to etcd. A client given only the old leader's
// address is told who leads but does not follow a hint outside the hubs it
// was given (issue 27); a client given the set follows the new leader.
TEST(HubSet, StoppedOldLeaderIsFencedAndClientsFollowTheNewLeader) {
  REQUIRE_ETCD();
  HubSet set(2);
  ASSERT_TRUE(set.ok());
  const int leader = set.WaitForLeader();
  ASSERT_GE(leader, 0);
  const std::string old_leader = set.address(leader);
  const std::string hubs = set.addresses();
  Subprocess trainer =
      MustSpawn({"--role=trainer", "--hub", hubs, "--bytes", "1048576"});
  std::string pub = Ask(trainer, "publish 1");
  ASSERT_EQ(Word(pub, 0), "published") << pub;

  StopProcess(set.pid(leader));
  const int next = set.WaitForLeader(old_leader);
  ::kill(set.pid(leader), SIGCONT);
  ASSERT_GE(next, 0);
  ASSERT_NE(next, leader);

  // Straight to the old leader, whatever its election thread has noticed
  // by now: refused, naming the new leader or none.
  grpc::Status s = RawRetain(old_leader, 1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_NE(s.error_message().find("is not the leader"), std::string::npos)
      << s.error_message();
  EXPECT_TRUE(set.Keys("pin/").empty());

  // A client that knows only the old leader is told who leads, but does
  // not go there: it follows leader hints only to hubs it was given
  // (docs/security.md), and says so.
  ClientOptions lone;
  lone.hub_address = old_leader;
  lone.name = "lone";
  lone.rpc_timeout_ms = 2000;
  lone.connect_timeout_ms = 3000;
  Result<std::unique_ptr<Client>> alone = Client::Connect(lone);
  ASSERT_FALSE(alone.ok());
  EXPECT_EQ(alone.status().code(), StatusCode::kUnavailable)
      << alone.status().ToString();
  EXPECT_NE(alone.status().message().find("leader is " + set.address(next)),
            std::string::npos)
      << alone.status().ToString();
  // One given the set goes to the new leader.
  std::unique_ptr<Client> observer = Observer(hubs);
  ASSERT_NE(observer, nullptr);
  Result<VersionInfo> info = WaitCommitted(*observer, Version(1), 1);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  Status r = observer->Retain(kModel, Version(1));
  EXPECT_TRUE(r.ok()) << r.ToString();
  EXPECT_EQ(set.Keys("pin/").size(), 1u);
  Status u = observer->Unretain(kModel, Version(1));
  EXPECT_TRUE(u.ok()) << u.ToString();
  EXPECT_TRUE(set.Keys("pin/").empty());
  // The trainer followed too: the next version goes through the new leader.
  ASSERT_EQ(Ask(trainer, "unpublish 1"), "unpublished 1");
  std::string pub2 = Ask(trainer, "publish 2");
  EXPECT_EQ(Word(pub2, 0), "published") << pub2;
}

// Embedded hubs, for what needs no process: a graceful handover keeps the
// reader groups' pins, and a hub with another secret may not join.
TEST(HubSet, ReaderGroupPinsSurviveAHandover) {
  REQUIRE_ETCD();
  auto etcd = lab::EtcdProcess::Start();
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
  std::vector<std::unique_ptr<Hub>> hubs;
  std::string addresses;
  for (int i = 0; i < 2; ++i) {
    HubOptions o;
    o.listen_address = "127.0.0.1:" + std::to_string(FreePort());
    o.lease_ms = 2000;
    o.rebuild_ms = kRebuildMs;
    o.etcd_endpoints = (*etcd)->endpoint();
    o.etcd_lease_ms = kEtcdLeaseMs;
    auto h = Hub::Start(o);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    addresses += (i > 0 ? "," : "") + o.listen_address;
    hubs.push_back(std::move(h).value());
  }
  ClientOptions co;
  co.hub_address = addresses;
  co.heartbeat_interval_ms = 200;
  co.name = "trainer";
  auto trainer = Client::Connect(co);
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  std::vector<float> w1(1024, 1.0f), w2(1024, 2.0f);
  auto tensors = [](std::vector<float>& w) {
    return std::vector<TensorRef>{{{"w", DType::kF32, {1024}},
                                   w.data(),
                                   w.size() * sizeof(float),
                                   MemoryLocation::Host()}};
  };
  ASSERT_TRUE((*trainer)->Publish(kModel, Version(1), tensors(w1)).ok());
  // Rank 0 of group "inst" resolves latest for step 7: version 1 is pinned.
  auto first = (*trainer)->Describe(kModel, Version::Latest(), "inst", 7);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(first->version, Version(1));
  ASSERT_TRUE((*trainer)->Publish(kModel, Version(2), tensors(w2)).ok());

  // The leader hands over (Shutdown resigns at once).
  auto client = ha::EtcdClient::Create((*etcd)->endpoint());
  ASSERT_TRUE(client.ok());
  auto leader_of = [&]() -> std::string {
    auto r = (*client)->Range(ha::LeaderKey(kPrefix), "", 0, 0,
                              Deadline::AfterMs(5000));
    return r.ok() && !r->kvs.empty() ? r->kvs[0].value : "";
  };
  Deadline d = Deadline::AfterMs(30000);
  std::string leader;
  while (leader.empty() && !d.expired()) {
    leader = leader_of();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_FALSE(leader.empty());
  const size_t li = hubs[0]->address() == leader ? 0 : 1;
  hubs[li]->Shutdown();
  while (!d.expired() && (leader_of().empty() || leader_of() == leader)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(leader_of(), hubs[1 - li]->address());

  // Another rank of the group, same step, after the handover: version 1,
  // the group's pin, not version 2, the newest (once re-reported).
  Result<VersionInfo> other = NotFound("not asked");
  while (!d.expired()) {
    other = (*trainer)->Describe(kModel, Version::Latest(), "inst", 7);
    if (other.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_EQ(other->version, Version(1));
  // A new step pins the newest.
  auto next = (*trainer)->Describe(kModel, Version::Latest(), "inst", 8);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->version, Version(2));
  // A reader of the group fetches for a step of its own: BeginFetch records
  // the group's pin in etcd before it answers (on the hub's own threads
  // for calls that wait: WaitingCalls), and the reader gets version 2.
  co.name = "reader";
  auto reader = Client::Connect(co);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<float> got(1024, 0.0f);
  FetchOptions fo;
  fo.group = "inst";
  fo.group_step = 9;
  Result<FetchStats> fetched = NotFound("not asked");
  const Deadline fetch_deadline = Deadline::AfterMs(30000);
  while (!fetch_deadline.expired()) {
    fetched = (*reader)->Fetch(kModel, Version::Latest(), tensors(got), fo);
    if (fetched.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(fetched.ok()) << fetched.status().ToString();
  EXPECT_EQ(fetched->version, Version(2));
  EXPECT_EQ(got, w2);
}

TEST(HubSet, AHubWithAnotherSecretMayNotJoin) {
  REQUIRE_ETCD();
  auto etcd = lab::EtcdProcess::Start();
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
  HubOptions a;
  a.listen_address = "127.0.0.1:" + std::to_string(FreePort());
  a.secret = "first secret";
  a.etcd_endpoints = (*etcd)->endpoint();
  a.etcd_lease_ms = kEtcdLeaseMs;
  auto hub_a = Hub::Start(a);
  ASSERT_TRUE(hub_a.ok()) << hub_a.status().ToString();
  // The first leader records the secret's identity.
  auto client = ha::EtcdClient::Create((*etcd)->endpoint());
  ASSERT_TRUE(client.ok());
  Deadline d = Deadline::AfterMs(30000);
  bool recorded = false;
  while (!recorded && !d.expired()) {
    auto r = (*client)->Range(ha::SecretIdKey(kPrefix), "", 0, 0,
                              Deadline::AfterMs(5000));
    recorded = r.ok() && !r->kvs.empty();
    if (!recorded) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(recorded);
  HubOptions b = a;
  b.listen_address = "127.0.0.1:" + std::to_string(FreePort());
  b.secret = "another secret";
  auto hub_b = Hub::Start(b);
  ASSERT_FALSE(hub_b.ok());
  EXPECT_EQ(hub_b.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(hub_b.status().message().find("another secret"), std::string::npos)
      << hub_b.status().message();
  // The same secret joins.
  b.secret = a.secret;
  auto hub_c = Hub::Start(b);
  EXPECT_TRUE(hub_c.ok()) << hub_c.status().ToString();
}

// The fence itself: a coordinator whose key was taken over (its lease
// revoked behind its back, as etcd does when it expires) cannot write,
// even before it notices.
TEST(HubSet, WritesOfALeaderThatLostItsKeyAreRefusedByEtcd) {
  REQUIRE_ETCD();
  auto etcd = lab::EtcdProcess::Start();
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
  auto make = [&](const std::string& advertise) {
    ha::EtcdCoordinatorOptions o;
    o.endpoints = (*etcd)->endpoint();
    o.advertise = advertise;
    o.lease_ms = 10000;  // long: it must not notice by renewing
    auto c = ha::MakeEtcdCoordinator(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return std::move(c).value();
  };
  std::unique_ptr<hub::Coordinator> a = make("127.0.0.1:1");
  std::atomic<int> a_elected{0};
  ASSERT_TRUE(a->Start({[&](const hub::DurableState&) {
                          a_elected++;
                          return Status::Ok();
                        },
                        [] {}})
                  .ok());
  Deadline d = Deadline::AfterMs(30000);
  while (!a->Leading() && !d.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(a->Leading());
  hub::DurableChange pin{
      hub::DurableChange::Kind::kPin, "m", Version(1), {}, {}};
  ASSERT_TRUE(a->Persist({pin}, NowMs() + 5000).ok());

  // Revoke a's lease from outside: the leader key goes; b wins.
  auto client = ha::EtcdClient::Create((*etcd)->endpoint());
  ASSERT_TRUE(client.ok());
  auto key = (*client)->Range(ha::LeaderKey(kPrefix), "", 0, 0,
                              Deadline::AfterMs(5000));
  ASSERT_TRUE(key.ok() && key->kvs.size() == 1);
  ASSERT_TRUE(
      (*client)->RevokeLease(key->kvs[0].lease, Deadline::AfterMs(5000)).ok());
  std::unique_ptr<hub::Coordinator> b = make("127.0.0.1:2");
  ASSERT_TRUE(b->Start({[](const hub::DurableState& s) {
                          // b starts from what a recorded.
                          return s.pins.count({"m", Version(1)}) == 1
                                     ? Status::Ok()
                                     : Internal("pin not restored");
                        },
                        [] {}})
                  .ok());
  while (!b->Leading() && !d.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(b->Leading());

  hub::DurableChange pin2{
      hub::DurableChange::Kind::kPin, "m", Version(2), {}, {}};
  Status s = a->Persist({pin2}, NowMs() + 5000);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_FALSE(a->Leading());
  auto pins =
      (*client)->Range(std::string(kPrefix) + "pin/",
                       ha::EtcdClient::PrefixEnd(std::string(kPrefix) + "pin/"),
                       0, 0, Deadline::AfterMs(5000));
  ASSERT_TRUE(pins.ok());
  EXPECT_EQ(pins->kvs.size(), 1u);  // m/1 only
  EXPECT_TRUE(b->Persist({pin2}, NowMs() + 5000).ok());
  EXPECT_EQ(a_elected.load(), 1);
  a->Stop();
  b->Stop();
}

}  // namespace
}  // namespace tensorhub::testing

int main(int argc, char** argv) {
  return tensorhub::testing::RoleOrTestsMain(argc, argv,
                                             tensorhub::testing::MaybeRunRole);
}
