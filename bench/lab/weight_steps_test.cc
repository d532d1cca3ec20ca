#include "weight_steps.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/convert.h"

namespace tensorhub::lab {
namespace {

std::vector<uint8_t> Bf16(const WeightSteps& s) {
  std::vector<uint8_t> out(s.Bf16Bytes());
  s.CastBf16(out);
  return out;
}

TEST(WeightSteps, SameSeedSameVersionsOtherSeedOthers) {
  WeightStepsOptions o;
  o.elements = 10000;
  WeightSteps a(o), b(o);
  o.seed = 2;
  WeightSteps c(o);
  for (int i = 0; i < 3; ++i) {
    a.Step(1e-5f);
    b.Step(1e-5f);
    c.Step(1e-5f);
  }
  EXPECT_EQ(Bf16(a), Bf16(b));
  EXPECT_NE(Bf16(a), Bf16(c));
}

TEST(WeightSteps, FirstStepMovesEveryWeightByTheLearningRate) {
  // Adam's first step is lr * g / |g| (bias-corrected moments): every
  // master weight moves by lr, whatever its gradient.
  WeightStepsOptions o;
  o.elements = 4096;
  WeightSteps s(o);
  const std::vector<float> w0 = s.master();
  s.Step(1e-3f);
  for (size_t i = 0; i < w0.size(); ++i) {
    ASSERT_NEAR(std::fabs(s.master()[i] - w0[i]), 1e-3, 1e-5) << i;
  }
}

TEST(WeightSteps, ChangedFractionComesFromTheArithmetic) {
  // Learning rate 0 changes nothing; a larger rate changes more bf16
  // elements; at 1e-6 after warm-up, a few percent at most (bf16 spacing
  // near 0.02 is ~1e-4: most updates do not cross a rounding boundary).
  auto changed = [](float lr) {
    WeightStepsOptions o;
    o.elements = 1 << 16;
    WeightSteps s(o);
    for (int i = 0; i < 5; ++i) s.Step(lr);
    const auto before = Bf16(s);
    s.Step(lr);
    const auto after = Bf16(s);
    return ChangedFraction(before.data(), after.data(), before.size(), 2);
  };
  EXPECT_EQ(changed(0.0f), 0.0);
  const double small = changed(1e-6f), large = changed(1e-5f);
  EXPECT_GT(small, 0.001);
  EXPECT_LT(small, 0.05);
  EXPECT_GT(large, 2 * small);
}

TEST(WeightSteps, Fp8IsTheMasterQuantizedWithABlockScale) {
  WeightStepsOptions o;
  o.elements = 3 * 1000 + 7;
  o.fp8_block_elements = 1000;
  WeightSteps s(o);
  s.Step(1e-4f);
  std::vector<uint8_t> out(s.Fp8Bytes());
  ASSERT_EQ(s.Fp8Blocks(), 4u);
  s.CastFp8(out);
  for (uint64_t b = 0; b < s.Fp8Blocks(); ++b) {
    float scale;
    std::memcpy(&scale, out.data() + s.elements() + 4 * b, 4);
    float amax = 0;
    for (uint64_t i = b * 1000;
         i < std::min<uint64_t>(s.elements(), (b + 1) * 1000); ++i) {
      amax = std::max(amax, std::fabs(s.master()[i]));
    }
    EXPECT_EQ(scale, Fp8Scale(amax));
    for (uint64_t i = b * 1000;
         i < std::min<uint64_t>(s.elements(), (b + 1) * 1000); ++i) {
      EXPECT_EQ(out[i], F32ToF8E4M3(s.master()[i] / scale)) << i;
    }
  }
}

TEST(WeightSteps, ChangedFractionCountsElements) {
  const uint8_t a[] = {1, 2, 3, 4, 5};
  const uint8_t b[] = {1, 2, 3, 9, 6};
  EXPECT_DOUBLE_EQ(ChangedFraction(a, b, 5, 2), 2.0 / 3);  // {3,4} and {5}
  EXPECT_DOUBLE_EQ(ChangedFraction(a, b, 5, 1), 2.0 / 5);
  EXPECT_DOUBLE_EQ(ChangedFraction(a, a, 5, 4), 0.0);
}

}  // namespace
}  // namespace tensorhub::lab
