#include "client/transport_set.h"

#include <gtest/gtest.h>

namespace tensorhub::client {
namespace {

TEST(DialAddress, FirstOfTheReadersPreferenceTheHolderServes) {
  const std::vector<DataEndpoint> ucx = {{"ucx", "10.0.0.2:4001"}};
  EXPECT_EQ(DialAddress({"ucx", "tcp"}, "10.0.0.2:4000", ucx),
            "ucx://10.0.0.2:4001");
  EXPECT_EQ(TransportOf("ucx://10.0.0.2:4001"), "ucx");
}

TEST(DialAddress, TcpWhenTheHolderServesNothingElse) {
  EXPECT_EQ(DialAddress({"ucx", "tcp"}, "10.0.0.2:4000", {}), "10.0.0.2:4000");
  EXPECT_EQ(TransportOf("10.0.0.2:4000"), "tcp");
  EXPECT_EQ(TransportOf("[::1]:4000"), "tcp");
}

TEST(DialAddress, TcpWhenTheReaderSpeaksOnlyTcp) {
  const std::vector<DataEndpoint> ucx = {{"ucx", "10.0.0.2:4001"}};
  EXPECT_EQ(DialAddress({"tcp"}, "10.0.0.2:4000", ucx), "10.0.0.2:4000");
  // "tcp" ends the search even if something the holder serves comes later.
  EXPECT_EQ(DialAddress({"tcp", "ucx"}, "10.0.0.2:4000", ucx), "10.0.0.2:4000");
  // A transport the holder does not serve is skipped for the next one.
  EXPECT_EQ(DialAddress({"rdma9", "ucx"}, "10.0.0.2:4000", ucx),
            "ucx://10.0.0.2:4001");
}

}  // namespace
}  // namespace tensorhub::client
