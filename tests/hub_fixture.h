// A hub on loopback for integration tests, and workers connected to it.
#ifndef TENSORHUB_TESTS_HUB_FIXTURE_H_
#define TENSORHUB_TESTS_HUB_FIXTURE_H_

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "hub/hub_service.h"
#include "tensorhub/client.h"

namespace tensorhub::testing {

class HubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A hub that has been up for a while: no rebuild window, so that an
    // unknown version is NOT_FOUND at once (HubOptions::rebuild_ms).
    HubOptions o;
    o.listen_address = "127.0.0.1:0";
    o.lease_ms = 5000;
    o.rebuild_ms = 0;
    auto hub = hub::HubServer::Start(o);
    ASSERT_TRUE(hub.ok()) << hub.status().ToString();
    hub_ = std::move(hub).value();
  }
  // The options of NewClient's workers; a fixture may add to them.
  virtual ClientOptions WorkerOptions(const std::string& name) const {
    ClientOptions o;
    o.hub_address = hub_->address();
    o.name = name;
    return o;
  }
  std::unique_ptr<Client> NewClient(const std::string& name) {
    auto c = Client::Connect(WorkerOptions(name));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  std::unique_ptr<hub::HubServer> hub_;
};

}  // namespace tensorhub::testing

#endif  // TENSORHUB_TESTS_HUB_FIXTURE_H_
