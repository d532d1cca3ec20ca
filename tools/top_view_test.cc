// `tensorhub top`'s rendering: a snapshot in, lines out (top_view.h).
#include "top_view.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "cli_util.h"

namespace tensorhub::cli {
namespace {

std::string Joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

// One model, one committed version of 64 MiB with a complete trainer and a
// filling reader; that reader's fetch in flight from the trainer; one
// measured holder.
HubSnapshot Sample() {
  HubSnapshot s;
  s.workers = 3;
  s.models_total = 1;
  SnapshotModel& m = s.models.emplace_back();
  m.model = "llama";
  m.versions_total = 1;
  SnapshotVersion& v = m.versions.emplace_back();
  v.version = Version(7);
  v.state = VersionState::kCommitted;
  v.total_bytes = 64ull << 20;
  v.retained = true;
  v.holders_complete = 1;
  v.holders_filling = 1;
  v.holders = {{WorkerId("w1-1"), "trainer", false},
               {WorkerId("w1-2"), "r1", true}};
  s.transfers_total = 1;
  SnapshotTransfer& t = s.transfers.emplace_back();
  t.model = "llama";
  t.version = Version(7);
  t.reader = WorkerId("w1-2");
  t.reader_name = "r1";
  t.reported = true;
  t.bytes_done = 16ull << 20;
  t.bytes_total = 64ull << 20;
  t.elapsed_ms = 2000;
  t.bytes_per_second = 8ull << 20;
  t.sources = {{WorkerId("w1-1"), "trainer", 16ull << 20, 8ull << 20}};
  s.slowest = {{WorkerId("w1-1"), "trainer", 4ull << 20, 2}};
  return s;
}

TEST(TopViewTest, ShowsVersionsHoldersTransfersAndSlowest) {
  const std::vector<std::string> lines = RenderTop(Sample(), "title", 200);
  const std::string text = Joined(lines);
  EXPECT_EQ(lines[0], "title");
  EXPECT_NE(text.find("workers 3  models 1  fetches in flight 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("llama@7"), std::string::npos) << text;
  EXPECT_NE(text.find("COMMITTED"), std::string::npos) << text;
  EXPECT_NE(text.find("64.0 MiB"), std::string::npos) << text;
  EXPECT_NE(text.find("1 complete, 1 filling: trainer(w1-1), r1(w1-2)*"),
            std::string::npos)
      << text;
  // The transfer: reader, version, done / total with its share, rate, and
  // its source with the bytes and rate read from it.
  bool transfer = false;
  for (const std::string& l : lines) {
    if (l.rfind("r1(w1-2)", 0) != 0) continue;
    transfer = true;
    EXPECT_NE(l.find("llama@7"), std::string::npos) << l;
    EXPECT_NE(l.find("16.0 MiB / 64.0 MiB  25%"), std::string::npos) << l;
    EXPECT_NE(l.find("8.0 MiB/s"), std::string::npos) << l;
    EXPECT_NE(l.find("trainer(w1-1) 16.0 MiB 8.0 MiB/s"), std::string::npos)
        << l;
  }
  EXPECT_TRUE(transfer) << text;
  EXPECT_NE(text.find("SLOWEST HOLDERS"), std::string::npos) << text;
  bool slow = false;
  for (const std::string& l : lines) {
    if (l.rfind("trainer(w1-1)", 0) == 0 &&
        l.find("4.0 MiB/s") != std::string::npos) {
      slow = true;
    }
  }
  EXPECT_TRUE(slow) << text;
}

TEST(TopViewTest, EmptyHubAndUnreportedTransfer) {
  HubSnapshot s;
  std::string text = Joined(RenderTop(s, "t", 120));
  EXPECT_NE(text.find("no models"), std::string::npos) << text;
  EXPECT_NE(text.find("FETCHES IN FLIGHT (0)"), std::string::npos) << text;
  EXPECT_NE(text.find("no finished fetch measured yet"), std::string::npos)
      << text;

  s = Sample();
  s.transfers[0].reported = false;
  s.transfers[0].bytes_done = 0;
  text = Joined(RenderTop(s, "t", 200));
  EXPECT_NE(text.find("? / 64.0 MiB"), std::string::npos) << text;
}

TEST(TopViewTest, EveryLineFitsTheWidthAndIsPrintable) {
  HubSnapshot s = Sample();
  // A name from the network with an escape sequence and a long tail.
  s.transfers[0].reader_name = "evil\x1b[2J" + std::string(300, 'x');
  for (size_t width : {size_t{0}, size_t{20}, size_t{40}, size_t{80}}) {
    for (const std::string& l : RenderTop(s, "title", width)) {
      EXPECT_LE(l.size(), std::max<size_t>(width, 20)) << l;
      for (char c : l) {
        EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "byte " << int(c) << " in " << l;
      }
    }
  }
  const std::vector<std::string> cut = RenderTop(s, "title", 80);
  bool marked = false;
  for (const std::string& l : cut) marked |= l.size() == 80 && l.back() == '>';
  EXPECT_TRUE(marked);
}

TEST(TopViewTest, HeightBoundSaysWhatWasLeftOut) {
  HubSnapshot s = Sample();
  const size_t all = RenderTop(s, "t", 200).size();
  ASSERT_GT(all, 6u);
  const std::vector<std::string> lines = RenderTop(s, "t", 200, 6);
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_NE(lines.back().find(std::to_string(all - 5) + " more line(s)"),
            std::string::npos)
      << lines.back();
}

TEST(TopViewTest, SaysWhatTheLimitsLeftOut) {
  HubSnapshot s = Sample();
  s.models_total = 3;
  s.models[0].versions_total = 5;
  s.models[0].versions[0].holders_complete = 10;
  s.transfers_total = 9;
  const std::string text = Joined(RenderTop(s, "t", 300));
  EXPECT_NE(text.find("llama: 4 older version(s) not shown"), std::string::npos)
      << text;
  EXPECT_NE(text.find("2 more model(s) not shown"), std::string::npos) << text;
  EXPECT_NE(text.find(", +9 more"), std::string::npos) << text;
  EXPECT_NE(text.find("8 more not shown"), std::string::npos) << text;
}

TEST(TopViewTest, FormatRate) {
  EXPECT_EQ(FormatRate(0), "-");
  EXPECT_EQ(FormatRate(-1), "-");
  EXPECT_EQ(FormatRate(512), "512 B/s");
  EXPECT_EQ(FormatRate(3.5 * (1 << 20)), "3.5 MiB/s");
  // No overflow: a rate past any real link is capped at 1e18 B/s, not cast
  // to an integer it does not fit (undefined), and not-a-number shows "-".
  const std::string cap = FormatBytes(uint64_t{1000000000000000000}) + "/s";
  EXPECT_EQ(FormatRate(1e18), cap);
  EXPECT_EQ(FormatRate(1e300), cap);
  EXPECT_EQ(FormatRate(std::numeric_limits<double>::infinity()), cap);
  EXPECT_EQ(FormatRate(std::numeric_limits<double>::quiet_NaN()), "-");
  // A fetch's closing line: 128 MiB over a 400 Mbit/s link (50 MB/s) is
  // 47.7 MiB/s, not "0.03 GB/s"; a local copy stays in GiB/s.
  EXPECT_EQ(FormatRate(uint64_t{128} << 20, (128 << 20) / 50e6), "47.7 MiB/s");
  EXPECT_EQ(FormatRate(uint64_t{3} << 30, 2.0), "1.50 GiB/s");
  EXPECT_EQ(FormatRate(uint64_t{1} << 20, 0.0), "-");
}

}  // namespace
}  // namespace tensorhub::cli
