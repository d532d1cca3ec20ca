#include "client/reachability.h"

#include <gtest/gtest.h>

namespace tensorhub::client {
namespace {

TEST(ReachabilityTest, HostOf) {
  EXPECT_EQ(HostOf("10.0.0.1:7070"), "10.0.0.1");
  EXPECT_EQ(HostOf("[::1]:7070"), "::1");
  EXPECT_EQ(HostOf("hub.example:7070"), "hub.example");
  EXPECT_EQ(HostOf("::1"), "::1");
  EXPECT_EQ(HostOf("localhost"), "localhost");
}

TEST(ReachabilityTest, LoopbackAndUnspecifiedHosts) {
  for (const char* h : {"127.0.0.1", "127.3.2.1", "::1", "::ffff:127.0.0.1",
                        "localhost", "a.localhost"}) {
    EXPECT_TRUE(IsLoopbackHost(h)) << h;
    EXPECT_TRUE(IsLocalOnlyHost(h)) << h;
    EXPECT_FALSE(IsUnspecifiedHost(h)) << h;
  }
  for (const char* h : {"0.0.0.0", "::"}) {
    EXPECT_TRUE(IsUnspecifiedHost(h)) << h;
    EXPECT_TRUE(IsLocalOnlyHost(h)) << h;
    EXPECT_FALSE(IsLoopbackHost(h)) << h;
  }
  for (const char* h : {"10.0.0.1", "128.0.0.1", "::2", "::ffff:10.0.0.1",
                        "hub.example", "mylocalhost", ""}) {
    EXPECT_FALSE(IsLocalOnlyHost(h)) << h;
  }
  EXPECT_TRUE(HostIsLoopback("127.0.0.1"));
  EXPECT_TRUE(HostIsLoopback("localhost"));
  EXPECT_FALSE(HostIsLoopback("10.1.2.3"));
}

TEST(ReachabilityTest, WarnsAWorkerOnLoopbackWhoseHubIsElsewhere) {
  const std::string w =
      LoopbackDataPlaneWarning("10.0.0.1:7070", false, "127.0.0.1:41000");
  EXPECT_NE(w.find("127.0.0.1:41000"), std::string::npos) << w;
  EXPECT_NE(w.find("10.0.0.1:7070"), std::string::npos) << w;
  EXPECT_NE(w.find("readers on other hosts cannot reach it"), std::string::npos)
      << w;
  EXPECT_NE(w.find("--data-listen 0.0.0.0:PORT --advertise-host HOST"),
            std::string::npos)
      << w;
  // Listening on every interface but advertising 0.0.0.0: the same.
  EXPECT_NE(LoopbackDataPlaneWarning("10.0.0.1:7070", false, "0.0.0.0:41000")
                .find("not one to dial"),
            std::string::npos);
  // Nothing to say: the hub is on loopback too, or the data plane is not.
  EXPECT_EQ(LoopbackDataPlaneWarning("127.0.0.1:7070", true, "127.0.0.1:1"),
            "");
  EXPECT_EQ(LoopbackDataPlaneWarning("10.0.0.1:7070", false, "10.0.0.2:1"), "");
}

TEST(ReachabilityTest, TellsAReaderOnAnotherHostWhyALoopbackHolderFails) {
  // Different host labels.
  std::string h = LoopbackHolderHint("w7", "127.0.0.1:5000", "h0", "h1",
                                     "127.0.0.1:6000", "127.0.0.1:7070", true);
  EXPECT_EQ(h.rfind("holder w7 advertises 127.0.0.1:5000, which is loopback: "
                    "it cannot be reached from this host",
                    0),
            0u)
      << h;
  EXPECT_NE(h.find("'h0'"), std::string::npos) << h;
  EXPECT_NE(h.find("--advertise-host"), std::string::npos) << h;
  // No labels; the reader itself advertises a routable address.
  h = LoopbackHolderHint("w7", "127.0.0.1:5000", "", "", "10.0.0.2:6000",
                         "127.0.0.1:7070", true);
  EXPECT_NE(h.find("this reader advertises 10.0.0.2:6000"), std::string::npos)
      << h;
  // No labels, both on loopback, but the hub is elsewhere.
  h = LoopbackHolderHint("w7", "127.0.0.1:5000", "", "", "127.0.0.1:6000",
                         "10.0.0.1:7070", false);
  EXPECT_NE(h.find("the hub at 10.0.0.1:7070"), std::string::npos) << h;
  // Nothing to say: same host label; a routable holder; all on loopback.
  EXPECT_EQ(LoopbackHolderHint("w7", "127.0.0.1:5000", "h0", "h0",
                               "10.0.0.2:6000", "10.0.0.1:7070", false),
            "");
  EXPECT_EQ(LoopbackHolderHint("w7", "10.0.0.3:5000", "h0", "h1",
                               "10.0.0.2:6000", "10.0.0.1:7070", false),
            "");
  EXPECT_EQ(LoopbackHolderHint("w7", "127.0.0.1:5000", "", "", "127.0.0.1:6000",
                               "127.0.0.1:7070", true),
            "");
}

}  // namespace
}  // namespace tensorhub::client
