#include "weight_steps.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/convert.h"
#include "tensorhub/check.h"

namespace tensorhub::lab {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

WeightSteps::WeightSteps(const WeightStepsOptions& options)
    : options_(options),
      w_(options.elements),
      m_(options.elements, 0.0f),
      v_(options.elements, 0.0f) {
  TH_CHECK(options.fp8_block_elements > 0);
  const uint64_t key = Mix(options_.seed ^ 0x5EEDull);
  for (uint64_t i = 0; i < w_.size(); ++i) {
    w_[i] = options_.init_std * Normal(key ^ Mix(i));
  }
}

// Irwin-Hall: four 16-bit uniforms from one 64-bit hash, centred and scaled
// to unit variance (the sum of four U(0,1) has variance 4/12).
float WeightSteps::Normal(uint64_t key) const {
  const uint64_t h = Mix(key);
  const float sum = static_cast<float>((h & 0xFFFF) + ((h >> 16) & 0xFFFF) +
                                       ((h >> 32) & 0xFFFF) + (h >> 48)) *
                    (1.0f / 65536.0f);
  return (sum - 2.0f) * 1.7320508f;  // 1 / sqrt(4/12)
}

void WeightSteps::Step(float lr) {
  ++steps_;
  const float b1 = options_.beta1, b2 = options_.beta2;
  const float bc1 = 1.0f - std::pow(b1, static_cast<float>(steps_));
  const float bc2_sqrt =
      std::sqrt(1.0f - std::pow(b2, static_cast<float>(steps_)));
  const float step_size = lr / bc1;
  const float decay = 1.0f - lr * options_.weight_decay;
  const uint64_t bias_key = Mix(options_.seed ^ 0xB1A5ull);
  const uint64_t noise_key = Mix(options_.seed ^ Mix(steps_));
  for (uint64_t i = 0; i < w_.size(); ++i) {
    const uint64_t ki = Mix(i);
    const float g =
        options_.grad_bias * Normal(bias_key ^ ki) + Normal(noise_key ^ ki);
    m_[i] = b1 * m_[i] + (1.0f - b1) * g;
    v_[i] = b2 * v_[i] + (1.0f - b2) * g * g;
    const float denom = std::sqrt(v_[i]) / bc2_sqrt + options_.eps;
    w_[i] = w_[i] * decay - step_size * m_[i] / denom;
  }
}

void WeightSteps::CastBf16(std::span<uint8_t> out) const {
  TH_CHECK(out.size() == Bf16Bytes());
  for (uint64_t i = 0; i < w_.size(); ++i) {
    const uint16_t b = F32ToBf16(w_[i]);
    std::memcpy(out.data() + 2 * i, &b, 2);
  }
}

uint64_t WeightSteps::Fp8Blocks() const {
  return (elements() + options_.fp8_block_elements - 1) /
         options_.fp8_block_elements;
}

void WeightSteps::CastFp8(std::span<uint8_t> out) const {
  TH_CHECK(out.size() == Fp8Bytes());
  const uint64_t block = options_.fp8_block_elements;
  uint8_t* scales = out.data() + elements();
  for (uint64_t b = 0; b < Fp8Blocks(); ++b) {
    const uint64_t begin = b * block;
    const uint64_t end = std::min(elements(), begin + block);
    float amax = 0;
    for (uint64_t i = begin; i < end; ++i)
      amax = std::max(amax, std::fabs(w_[i]));
    const float scale = Fp8Scale(amax);
    for (uint64_t i = begin; i < end; ++i) out[i] = F32ToF8E4M3(w_[i] / scale);
    std::memcpy(scales + 4 * b, &scale, 4);
  }
}

double ChangedFraction(const uint8_t* a, const uint8_t* b, uint64_t bytes,
                       size_t elem_bytes) {
  TH_CHECK(elem_bytes > 0);
  const uint64_t elems = (bytes + elem_bytes - 1) / elem_bytes;
  if (elems == 0) return 0;
  uint64_t changed = 0;
  for (uint64_t e = 0; e < elems; ++e) {
    const uint64_t at = e * elem_bytes;
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(elem_bytes, bytes - at));
    changed += std::memcmp(a + at, b + at, n) != 0;
  }
  return static_cast<double>(changed) / static_cast<double>(elems);
}

}  // namespace tensorhub::lab
