// Publish and fetch over the UCX data plane end to end, in one process: a
// real hub and workers whose ClientOptions::transports pick ucx (the drain
// of UCX reads is tested at a known point in ucx_transport_test). Skips in a
// build without UCX.
// ctest runs it with UCX_TLS=tcp (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include "demo_model.h"
#include "hub/hub_service.h"
#include "process_util.h"
#include "tensorhub/client.h"
#include "test_roles.h"
#include "transport/ucx/ucx_transport.h"

namespace tensorhub::testing {
namespace {

using cli::SyntheticModel;

class UcxHubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!transport::UcxAvailable()) GTEST_SKIP() << "built without TH_UCX";
    HubOptions o;
    o.listen_address = "127.0.0.1:0";
    o.lease_ms = 5000;
    o.rebuild_ms = 0;
    auto hub = hub::HubServer::Start(o);
    ASSERT_TRUE(hub.ok()) << hub.status().ToString();
    hub_ = std::move(hub).value();
  }
  std::unique_ptr<Client> NewClient(const std::string& name) {
    ClientOptions o;
    o.hub_address = hub_->address();
    o.name = name;
    o.transports = {"ucx", "tcp"};
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  std::unique_ptr<hub::HubServer> hub_;
};

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
  // The trainer leaves; b fetches from a, which serves its copy over UCX.
  ASSERT_TRUE(trainer->Unpublish("m", Version(1)).ok());
  auto rb = NewClient("b");
  st = rb->Fetch("m", Version(1), b.tensors());
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(b.Digest(), src.Digest());
  for (const FetchSourceStats& s : st->sources) EXPECT_EQ(s.transport, "ucx");
}

}  // namespace
}  // namespace tensorhub::testing

int main(int argc, char** argv) {
  return tensorhub::testing::RoleOrTestsMain(argc, argv,
                                             &tensorhub::testing::MaybeRunRole);
}
