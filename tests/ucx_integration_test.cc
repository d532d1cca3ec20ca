// Publish and fetch over the UCX data plane end to end, in one process: a
// real hub and workers whose ClientOptions::transports pick ucx (the drain
// of UCX reads is tested at a known point in ucx_transport_test). Skips in a
// build without UCX.
// ctest runs it with UCX_TLS=tcp (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "client/client_deps.h"
#include "client/counted_client.h"
#include "common/deadline.h"
#include "demo_model.h"
#include "hub/hub_service.h"
#include "hub_fixture.h"
#include "process_util.h"
#include "tensorhub/client.h"
#include "test_roles.h"
#include "transport/ucx/ucx_transport.h"

namespace tensorhub::testing {
namespace {

using cli::SyntheticModel;

// The same hub; the workers prefer UCX.
class UcxHubTest : public HubTest {
 protected:
  void SetUp() override {
    if (!transport::UcxAvailable()) GTEST_SKIP() << "built without TH_UCX";
    HubTest::SetUp();
  }
  ClientOptions WorkerOptions(const std::string& name) const override {
    ClientOptions o = HubTest::WorkerOptions(name);
    o.transports = {"ucx", "tcp"};
    // Every worker here is on one host, which is read over TCP otherwise.
    o.ucx_same_host = true;
    return o;
  }
};

// The value of the sample `name{path="PATH"}` in a client's metrics text
// (-1 if missing).
double PathSample(Client& c, const std::string& name, const std::string& path) {
  const std::string text = client::ClientFactory::MetricsText(c);
  const std::string key = name + "{path=\"" + path + "\"} ";
  const size_t at = text.find(key);
  if (at == std::string::npos) return -1;
  return std::strtod(text.c_str() + at + key.size(), nullptr);
}

TEST_F(UcxHubTest, PublishFetchOverUcxByteExactAndReaderServesOverUcx) {
  SyntheticModel src(TestLayout(8 << 20));
  src.Fill(1);
  auto trainer = NewClient("trainer");
  ASSERT_TRUE(trainer->Publish("m", Version(1), src.tensors()).ok());
  SyntheticModel a(TestLayout(8 << 20)), b(TestLayout(8 << 20));
  auto ra = NewClient("a");
  auto st = ra->Fetch("m", Version::Latest(), a.tensors());
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(a.Digest(), src.Digest());
  ASSERT_FALSE(st->sources.empty());
  for (const FetchSourceStats& s : st->sources) EXPECT_EQ(s.transport, "ucx");
  // The metrics count those bytes on the ucx path, at both ends.
  const double bytes = static_cast<double>(st->bytes);
  EXPECT_EQ(PathSample(*ra, "tensorhub_fetched_bytes_total", "ucx"), bytes);
  EXPECT_EQ(PathSample(*ra, "tensorhub_fetched_bytes_total", "tcp"), 0);
  // (A holder counts a read when the reader's release reaches it, which may
  // be just after the fetch returned: waited for, bounded.)
  const Deadline counted = Deadline::AfterMs(10000);
  while (PathSample(*trainer, "tensorhub_served_bytes_total", "ucx") < bytes &&
         !counted.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // The trainer also served its manifest (the hub named it by digest),
  // over the same path: a few KiB more.
  const std::string text = client::ClientFactory::MetricsText(*ra);
  EXPECT_NE(text.find("tensorhub_fetch_manifests_total{from=\"source\"} 1"),
            std::string::npos);
  const uint64_t manifest = client::ManifestBytesRead(*ra);
  EXPECT_GT(manifest, 0u);
  EXPECT_EQ(PathSample(*trainer, "tensorhub_served_bytes_total", "ucx"),
            bytes + manifest);
  EXPECT_EQ(PathSample(*trainer, "tensorhub_served_bytes_total", "tcp"), 0);
  // The trainer leaves; b fetches from a, which serves its copy over UCX.
  ASSERT_TRUE(trainer->Unpublish("m", Version(1)).ok());
  auto rb = NewClient("b");
  st = rb->Fetch("m", Version(1), b.tensors());
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(b.Digest(), src.Digest());
  for (const FetchSourceStats& s : st->sources) EXPECT_EQ(s.transport, "ucx");
}

// Transport per peer: every worker serves tcp; one asked for ucx serves it
// too and says so through the hub. A reader dials each holder over the
// first of its transports the holder serves, else tcp.
TEST_F(UcxHubTest, AReaderUsesUcxOnlyWithHoldersThatServeIt) {
  auto with = [&](const std::string& name, std::vector<std::string> t,
                  bool ucx_same_host = true) {
    ClientOptions o = HubTest::WorkerOptions(name);
    o.transports = std::move(t);
    o.ucx_same_host = ucx_same_host;
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  };
  SyntheticModel src(TestLayout(4 << 20));
  src.Fill(3);
  auto tcp_holder = with("tcp-holder", {"tcp"});
  ASSERT_TRUE(tcp_holder->Publish("m", Version(1), src.tensors()).ok());
  auto check = [&](Client& reader, const std::string& want) {
    SyntheticModel dst(TestLayout(4 << 20));
    FetchOptions fo;
    fo.serve = false;
    auto st = reader.Fetch("m", Version(1), dst.tensors(), fo);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_EQ(dst.Digest(), src.Digest());
    ASSERT_FALSE(st->sources.empty());
    for (const FetchSourceStats& s : st->sources) {
      EXPECT_EQ(s.transport, want) << s.address;
    }
  };
  // A UCX reader and a holder that serves tcp only: tcp.
  auto ucx_reader = with("ucx-reader", {"ucx", "tcp"});
  check(*ucx_reader, "tcp");
  // A holder that serves both: the UCX reader uses ucx, a tcp reader tcp.
  SyntheticModel copy(TestLayout(4 << 20));  // outlives `both`, which serves it
  auto both = with("both", {"ucx", "tcp"});
  {
    auto st = both->Fetch("m", Version(1), copy.tensors());
    ASSERT_TRUE(st.ok()) << st.status().ToString();
  }
  ASSERT_TRUE(tcp_holder->Unpublish("m", Version(1)).ok());
  check(*ucx_reader, "ucx");
  auto tcp_reader = with("tcp-reader", {"tcp"});
  check(*tcp_reader, "tcp");
  // Without ucx_same_host, a UCX reader reads a holder on its own host
  // (the holder's UCX hello names the same boot id and namespaces) over
  // TCP, whose same-host path moves the bytes once: cross-memory attach.
  auto same_host_reader =
      with("same-host-reader", {"ucx", "tcp"}, /*ucx_same_host=*/false);
  check(*same_host_reader, "tcp");
  SyntheticModel dst(TestLayout(4 << 20));
  FetchOptions fo;
  fo.serve = false;
  auto st = same_host_reader->Fetch("m", Version(1), dst.tensors(), fo);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->bytes_same_host, st->bytes);
}

}  // namespace
}  // namespace tensorhub::testing

int main(int argc, char** argv) {
  return tensorhub::testing::RoleOrTestsMain(argc, argv,
                                             &tensorhub::testing::MaybeRunRole);
}
