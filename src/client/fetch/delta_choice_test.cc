#include "client/fetch/delta_choice.h"

#include <gtest/gtest.h>

namespace tensorhub::client {
namespace {

TEST(DeltaChoice, DeltaWinsOnASlowLinkNotOnAFastOne) {
  constexpr uint64_t kS = 1ull << 30;
  // 100 Mbit/s, a 2% delta, applied at 1 GB/s: 1.7 s + 1.1 s against 86 s.
  EXPECT_TRUE(DeltaWins(kS, kS / 50, 12.5e6, 1e9));
  // 10 Gbit/s: 0.02 s + 1.07 s against 0.86 s: full chunks win.
  EXPECT_FALSE(DeltaWins(kS, kS / 50, 1.25e9, 1e9));
  // A delta as large as the version never wins; nor on a link of 0.
  EXPECT_FALSE(DeltaWins(kS, kS, 12.5e6, 1e9));
  EXPECT_FALSE(DeltaWins(kS, 1, 0, 1e9));
}

TEST(DeltaChoice, ChoosesPerSourceByItsLinkAndBase) {
  DeltaOptions o;  // 10 Gbit/s inside a datacenter, 1 Gbit/s across
  const Labels reader{"b", "", ""};
  std::vector<FetchSource> sources(4);
  sources[0].labels.datacenter = "a";  // remote, offers the base: delta
  sources[0].delta_offers = {{Version(6), 1000}, {Version(7), 2000}};
  sources[1].labels.datacenter = "b";  // nearby: whole
  sources[1].delta_offers = {{Version(7), 2000}};
  sources[2].labels.datacenter = "a";  // remote, another base: whole
  sources[2].delta_offers = {{Version(5), 2000}};
  sources[3].labels.datacenter = "a";            // remote, no offer: whole
  sources[3].delta = DeltaOffer{Version(7), 1};  // stale: cleared
  ChooseDeltas(&sources, Version(7), 1 << 20, reader, o);
  ASSERT_TRUE(sources[0].delta.has_value());
  EXPECT_EQ(*sources[0].delta, (DeltaOffer{Version(7), 2000}));
  EXPECT_FALSE(sources[1].delta.has_value());
  EXPECT_FALSE(sources[2].delta.has_value());
  EXPECT_FALSE(sources[3].delta.has_value());
  EXPECT_FALSE(AnySourceNearby({sources[0], sources[2]}, reader));
  EXPECT_TRUE(AnySourceNearby(sources, reader));
  // Reading through deltas turned off: none.
  o.read = false;
  ChooseDeltas(&sources, Version(7), 1 << 20, reader, o);
  EXPECT_FALSE(sources[0].delta.has_value());
}

TEST(DeltaChoice, WaitsForADeltaNearbyOnlyWhereTheLocalLinkIsSlow) {
  DeltaOptions o;  // 10 Gbit/s inside a datacenter, applied at 1 GB/s
  EXPECT_FALSE(NearbyDeltasWin(o));
  o.datacenter_link_bytes_per_s = 1.25e8;  // 1 Gbit/s
  EXPECT_TRUE(NearbyDeltasWin(o));
  o.read = false;
  EXPECT_FALSE(NearbyDeltasWin(o));
}

TEST(DeltaChoice, ACompleteSourceReadThroughADeltaIsReadAlone) {
  std::vector<FetchSource> sources(3);
  sources[0].address = "full";
  sources[1].address = "filling-delta";
  sources[1].filling = true;
  sources[1].delta = DeltaOffer{Version(7), 10};
  sources[2].address = "delta";
  sources[2].delta = DeltaOffer{Version(7), 10};
  std::vector<FetchSource> partial = {sources[0], sources[1]};
  ReadCompleteDeltaSourceAlone(&partial);  // still filling: all stay
  EXPECT_EQ(partial.size(), 2u);
  ReadCompleteDeltaSourceAlone(&sources);
  ASSERT_EQ(sources.size(), 1u);
  EXPECT_EQ(sources[0].address, "delta");
}

}  // namespace
}  // namespace tensorhub::client
