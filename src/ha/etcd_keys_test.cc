#include "ha/etcd_keys.h"

#include <gtest/gtest.h>

namespace tensorhub::ha {
namespace {

using hub::DurableChange;
using hub::DurableState;
using Kind = DurableChange::Kind;

const std::string kPrefix = "/th/";

// Writes `changes` to a map as etcd would, then reads the map back.
DurableState RoundTrip(const std::vector<DurableChange>& changes) {
  std::map<std::string, std::string> store;
  for (const DurableChange& c : changes) {
    KeyWrite w = EncodeChange(kPrefix, c);
    EXPECT_EQ(w.key.rfind(kPrefix, 0), 0u) << w.key;
    if (w.value.has_value()) {
      store[w.key] = *w.value;
    } else {
      store.erase(w.key);
    }
  }
  DurableState out;
  for (const auto& [k, v] : store) {
    Status s = DecodeInto(kPrefix, k, v, out);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  return out;
}

TEST(EtcdKeys, EscapingIsReversibleAndLeavesNoSlash) {
  for (std::string s :
       {std::string("plain"), std::string("a/b"), std::string("100%/x%2F"),
        std::string("sp ace\x01\xff"), std::string()}) {
    std::string e = EscapeKeyPart(s);
    EXPECT_EQ(e.find('/'), std::string::npos) << e;
    Result<std::string> back = UnescapeKeyPart(e);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, s);
  }
  EXPECT_FALSE(UnescapeKeyPart("bad%2").ok());
  EXPECT_FALSE(UnescapeKeyPart("bad%zz").ok());
}

TEST(EtcdKeys, ChangesRoundTripToTheStateTheyDescribe) {
  hub::GroupRecord rec;
  rec.forgot_below = 3;
  rec.steps[3] = Version(7);
  rec.steps[4] = Version(9);
  std::vector<DurableChange> changes = {
      {Kind::kHighest, "org/model", Version(5), {}, {}},
      {Kind::kHighest, "org/model", Version(6), {}, {}},
      {Kind::kPin, "org/model", Version(5), {}, {}},
      {Kind::kPin, "org/model", Version(6), {}, {}},
      {Kind::kUnpin, "org/model", Version(5), {}, {}},
      {Kind::kGroup, "org/model", {}, "inst/0", rec},
      {Kind::kGroup, "m2", {}, "g", rec},
      {Kind::kGroupGone, "m2", {}, "g", {}},
  };
  DurableState expected;
  for (const DurableChange& c : changes) ApplyDurableChange(c, expected);
  DurableState got = RoundTrip(changes);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(got.highest.at("org/model"), Version(6));
  EXPECT_EQ(got.pins.size(), 1u);
  EXPECT_EQ(got.groups.size(), 1u);
  EXPECT_EQ(got.groups.at({"org/model", "inst/0"}), rec);
}

TEST(EtcdKeys, OtherKeysAreSkippedAndMalformedOnesNamed) {
  DurableState s;
  EXPECT_TRUE(DecodeInto(kPrefix, LeaderKey(kPrefix), "h:1", s).ok());
  EXPECT_TRUE(DecodeInto(kPrefix, SecretIdKey(kPrefix), "ab", s).ok());
  EXPECT_TRUE(DecodeInto(kPrefix, "/other/highest/m", "x", s).ok());
  EXPECT_TRUE(DecodeInto(kPrefix, kPrefix + "future-kind/x", "?", s).ok());
  EXPECT_EQ(s, DurableState{});
  Status bad = DecodeInto(kPrefix, kPrefix + "highest/m", "12x", s);
  EXPECT_EQ(bad.code(), StatusCode::kDataLoss);
  EXPECT_NE(bad.message().find(kPrefix + "highest/m"), std::string::npos)
      << bad.message();
  EXPECT_FALSE(DecodeInto(kPrefix, kPrefix + "pin/m", "", s).ok());
  EXPECT_FALSE(DecodeInto(kPrefix, kPrefix + "group/m/g", "1 2-3", s).ok());
}

TEST(EtcdKeys, SecretIdentityTellsSecretsApartWithoutHoldingThem) {
  EXPECT_EQ(SecretIdentity("s3cret"), SecretIdentity("s3cret"));
  EXPECT_NE(SecretIdentity("s3cret"), SecretIdentity("s3cret2"));
  EXPECT_NE(SecretIdentity(""), SecretIdentity("x"));
  EXPECT_EQ(SecretIdentity("s3cret").find("s3cret"), std::string::npos);
  EXPECT_EQ(SecretIdentity("").size(), 64u);
}

// Known answers: hubs of different builds share one etcd prefix and compare
// the identity each wrote, so its encoding must never change. Computed
// independently: printf 'tensorhub hub-set secret v1\0s3cret' | sha256sum
TEST(EtcdKeys, SecretIdentityKnownAnswers) {
  EXPECT_EQ(SecretIdentity("s3cret"),
            "1eb34a241ae0cfcdc18fd22a6e37ed984b82927fb9e14ba298b08622bd08cc48");
  EXPECT_EQ(SecretIdentity(""),
            "1f11c102df0ab1623f85a8575bd44b76a89dc5e8cb0293d412dfdf8fe94481d7");
}

}  // namespace
}  // namespace tensorhub::ha
