// RefusalLog on simulated time: one line per peer per interval, with the
// count of what was not written.
#include "common/refusal_log.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tensorhub {
namespace {

struct Lines {
  std::vector<std::string> all;
  RefusalLog::Sink sink() {
    return [this](const std::string& l) { all.push_back(l); };
  }
};

TEST(RefusalLogTest, AFloodFromOnePeerWritesOneLinePerInterval) {
  FakeClock clock(1000);
  Lines lines;
  RefusalLog log("data server x", 10000, 16, clock, lines.sink());
  for (int i = 0; i < 7132; ++i) log.Refused("10.0.0.9", "wrong secret");
  ASSERT_EQ(lines.all.size(), 1u);
  EXPECT_EQ(lines.all[0], "data server x: refused 10.0.0.9: wrong secret");
  clock.AdvanceMs(10000);
  // The next refusal, an interval later, reports the interval's count; it
  // starts the next interval's.
  log.Refused("10.0.0.9", "stalled");
  ASSERT_EQ(lines.all.size(), 2u);
  EXPECT_NE(lines.all[1].find("refused 10.0.0.9 7131 more times in the last "
                              "10 s (the last: wrong secret)"),
            std::string::npos)
      << lines.all[1];
  EXPECT_EQ(log.refusals(), 7133u);
  log.Flush();
  ASSERT_EQ(lines.all.size(), 3u);
  EXPECT_NE(lines.all[2].find("refused 10.0.0.9 1 more time in the last 0 s "
                              "(the last: stalled)"),
            std::string::npos)
      << lines.all[2];
}

TEST(RefusalLogTest, EachPeerGetsItsOwnLineAndQuietPeersAreReportedBySweep) {
  FakeClock clock(0);
  Lines lines;
  RefusalLog log("hub", 1000, 16, clock, lines.sink());
  log.Refused("a", "x");
  log.Refused("a", "x");
  log.Refused("b", "y");
  EXPECT_EQ(lines.all.size(), 2u);  // a's first, b's first
  clock.AdvanceMs(1000);
  // a went quiet: b's next refusal sweeps a's count out. b was quiet for
  // the whole interval after its first line: forgotten, so this is a first.
  log.Refused("b", "y");
  ASSERT_EQ(lines.all.size(), 4u);
  EXPECT_NE(lines.all[2].find("refused a 1 more time "), std::string::npos)
      << lines.all[2];
  EXPECT_EQ(lines.all[3], "hub: refused b: y");
  // Quiet for another interval: forgotten, so the next refusal is a first.
  clock.AdvanceMs(1000);
  log.Refused("c", "z");
  clock.AdvanceMs(1000);
  log.Refused("a", "x");
  EXPECT_EQ(lines.all.back(), "hub: refused a: x");
}

TEST(RefusalLogTest, PeersBeyondTheBoundAreCountedTogether) {
  FakeClock clock(0);
  Lines lines;
  RefusalLog log("s", 1000, 2, clock, lines.sink());
  for (int i = 0; i < 100; ++i) log.Refused("p" + std::to_string(i), "bad");
  // p0, p1, then "other peers" once: 3 lines for 100 peers.
  ASSERT_EQ(lines.all.size(), 3u);
  EXPECT_EQ(lines.all[2], "s: refused other peers: bad");
  log.Flush();
  ASSERT_EQ(lines.all.size(), 4u);
  EXPECT_NE(lines.all[3].find("refused other peers 97 more times"),
            std::string::npos)
      << lines.all[3];
}

}  // namespace
}  // namespace tensorhub
