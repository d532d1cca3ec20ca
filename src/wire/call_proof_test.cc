// The control plane's proof of the shared secret (wire/call_proof.h).
#include "wire/call_proof.h"

#include <gtest/gtest.h>

#include <cctype>
#include <string>

namespace tensorhub::wire {
namespace {

constexpr int64_t kNow = 1'790'000'000'000;

TEST(CallProofTest, AProofOfTheSecretIsAcceptedAndNamesNoSecret) {
  const std::string proof = MakeCallProof("s3cret", kNow);
  EXPECT_EQ(proof.find("s3cret"), std::string::npos);
  EXPECT_LE(proof.size(), kMaxCallProofBytes);
  ProofRefusal why = ProofRefusal::kMalformed;
  EXPECT_TRUE(CheckCallProof(proof, "s3cret", kNow + 1000, &why).ok());
  EXPECT_EQ(why, ProofRefusal::kNone);
  // Fresh nonce each time.
  EXPECT_NE(MakeCallProof("s3cret", kNow), proof);
}

TEST(CallProofTest, MissingWrongStaleAndMalformedProofsAreRefusedByKind) {
  ProofRefusal why;
  Status s = CheckCallProof("", "s", kNow, &why);
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(why, ProofRefusal::kMissing);
  EXPECT_NE(s.message().find("--accept-request-secret"), std::string::npos);

  s = CheckCallProof(MakeCallProof("other", kNow), "s", kNow, &why);
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(why, ProofRefusal::kWrongSecret);

  s = CheckCallProof(MakeCallProof("s", kNow - kMaxProofSkewMs - 1), "s", kNow,
                     &why);
  EXPECT_EQ(why, ProofRefusal::kStale) << s.ToString();
  EXPECT_NE(s.message().find("NTP"), std::string::npos);
  s = CheckCallProof(MakeCallProof("s", kNow + kMaxProofSkewMs + 1), "s", kNow,
                     &why);
  EXPECT_EQ(why, ProofRefusal::kStale);
  EXPECT_TRUE(
      CheckCallProof(MakeCallProof("s", kNow + kMaxProofSkewMs), "s", kNow)
          .ok());

  const std::string good = MakeCallProof("s", kNow);
  for (std::string bad :
       {std::string("v1"), std::string("v2") + good.substr(2),
        good.substr(0, good.size() - 1), good + "0", good + ".x",
        std::string(kMaxCallProofBytes + 1, 'a'), std::string("....")}) {
    s = CheckCallProof(bad, "s", kNow, &why);
    EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << bad;
    EXPECT_EQ(why, ProofRefusal::kMalformed) << bad;
  }
  // Upper-case hex is not what MakeCallProof writes: refused, not parsed.
  std::string upper = good;
  for (char& c : upper) c = static_cast<char>(std::toupper(c));
  upper[0] = 'v';
  EXPECT_FALSE(CheckCallProof(upper, "s", kNow, &why).ok());
  EXPECT_EQ(why, ProofRefusal::kMalformed);
  // A flipped MAC digit is a wrong secret.
  std::string flipped = good;
  flipped.back() = flipped.back() == '0' ? '1' : '0';
  EXPECT_FALSE(CheckCallProof(flipped, "s", kNow, &why).ok());
  EXPECT_EQ(why, ProofRefusal::kWrongSecret);
}

TEST(CallProofTest, SecretsEqualComparesWholeStrings) {
  EXPECT_TRUE(SecretsEqual("", ""));
  EXPECT_TRUE(SecretsEqual("abc", "abc"));
  EXPECT_FALSE(SecretsEqual("abc", "abd"));
  EXPECT_FALSE(SecretsEqual("abc", "ab"));
  EXPECT_FALSE(SecretsEqual("", "a"));
}

}  // namespace
}  // namespace tensorhub::wire
