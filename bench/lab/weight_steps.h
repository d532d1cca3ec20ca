// Consecutive versions of a model's weights, as an RL trainer makes them:
// fp32 master weights moved by an Adam update at a given learning rate each
// step, then cast to what is published (bf16, or FP8 E4M3 with one scale per
// block). Which elements of the published bytes change between two steps,
// and how many, comes from that arithmetic (an update smaller than half the
// bf16 spacing of a weight leaves its bf16 bits alone), not from a chosen
// percentage: ChangedFraction reports what it was.
//
// The gradient of element i at step t is bias_i + noise_{i,t}, both drawn
// from a counter-based generator keyed by (seed, i) and (seed, i, t), so a
// version is a pure function of (options, steps taken) and needs no stored
// gradient: 12 bytes per element (weights, first and second moments).
// Normal draws are Irwin-Hall sums of four uniforms (their tails end at
// 3.5 sigma; a weight's bf16 spacing, not the tail, decides what changes).
//
// Not thread-safe; Step uses the calling thread only.
#ifndef TENSORHUB_BENCH_LAB_WEIGHT_STEPS_H_
#define TENSORHUB_BENCH_LAB_WEIGHT_STEPS_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace tensorhub::lab {

struct WeightStepsOptions {
  uint64_t elements = 0;
  uint64_t seed = 1;
  // Initial weights ~ N(0, init_std): what a pretrained LLM's linear layers
  // look like to the order of magnitude.
  float init_std = 0.02f;
  // Adam(W) as torch.optim.AdamW computes it.
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  // The persistent part of each element's gradient, in units of the
  // gradient noise's standard deviation (|bias_i| ~ |N(0, grad_bias)|).
  float grad_bias = 0.3f;
  // FP8: elements per scale (a 128 x 128 block, as DeepSeek-V3's weights).
  uint64_t fp8_block_elements = 128 * 128;
};

class WeightSteps {
 public:
  explicit WeightSteps(const WeightStepsOptions& options);

  // One Adam step at learning rate `lr` on every element.
  void Step(float lr);
  uint64_t steps() const { return steps_; }
  uint64_t elements() const { return options_.elements; }
  const std::vector<float>& master() const { return w_; }

  // The published bytes of the current step. bf16: 2 bytes per element,
  // round to nearest even (as torch's .to(torch.bfloat16)).
  void CastBf16(std::span<uint8_t> out) const;
  uint64_t Bf16Bytes() const { return 2 * elements(); }
  // FP8 E4M3 (torch's float8_e4m3fn): the elements (1 byte each), then one
  // fp32 scale per block of fp8_block_elements (Fp8Scale of the block's
  // absolute maximum), as one buffer of Fp8Bytes().
  void CastFp8(std::span<uint8_t> out) const;
  uint64_t Fp8Blocks() const;
  uint64_t Fp8Bytes() const { return elements() + 4 * Fp8Blocks(); }

 private:
  float Normal(uint64_t key) const;

  const WeightStepsOptions options_;
  std::vector<float> w_, m_, v_;
  uint64_t steps_ = 0;
};

// The fraction of the `elem_bytes`-wide elements of two buffers of `bytes`
// that differ (a trailing partial element counts as one).
double ChangedFraction(const uint8_t* a, const uint8_t* b, uint64_t bytes,
                       size_t elem_bytes);

}  // namespace tensorhub::lab

#endif  // TENSORHUB_BENCH_LAB_WEIGHT_STEPS_H_
