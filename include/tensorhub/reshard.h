// Resharding: boxes of logical tensors, and where a model-parallel rank's
// slice of each standard Hugging Face tensor lies.
//
// A version may hold a logical tensor (name, dtype, global shape) as several
// pieces, one per trainer rank, each a box of the global tensor (FSDP: rows
// along dim 0; TP: a slice along any dimension). A reader may fetch any box
// of a logical tensor, whatever the pieces' layout (Client::FetchSlices).
// Everything here is pure computation: no I/O, safe from any thread.
#ifndef TENSORHUB_RESHARD_H_
#define TENSORHUB_RESHARD_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensorhub/status.h"
#include "tensorhub/types.h"

namespace tensorhub {

// A box of a tensor: per dimension, the first index and how many indices.
// Its bytes are laid out row-major over `extent` (the last dimension
// fastest), like a contiguous tensor of shape `extent`.
struct Box {
  std::vector<uint64_t> offset;
  std::vector<uint64_t> extent;

  // The whole of a tensor of this shape.
  static Box Whole(std::span<const uint64_t> shape);
  size_t rank() const { return extent.size(); }
  // Product of the extents (1 for a 0-dim box); saturates at UINT64_MAX.
  uint64_t Elements() const;
  bool operator==(const Box&) const = default;
};

// What a trainer rank publishes of a logical tensor: the tensor's global
// shape and where its box starts (the box's extents are the published
// tensor's shape). PublishOptions::pieces, by tensor name.
struct TensorPiece {
  std::vector<uint64_t> global_shape;
  std::vector<uint64_t> offset;
};

// A destination of Client::FetchSlices: the box `box` of logical tensor
// `tensor.spec.name`, into `tensor.data` laid out row-major over
// box.extent (tensor.spec.shape must equal box.extent). tensor.spec.dtype
// may differ from the published dtype: BF16, F16 and F32 convert to each
// other and to F8_E4M3 (see ConvertDType); F8_E4M3 then needs
// `fp8_scales`: one (per tensor) or box.extent[0] (per output channel, for
// 2+ dimensions), as Fp8ScaleForAmax computes them from the amax the
// caller knows (the publisher's, e.g. from its metadata).
struct TensorSlice {
  TensorRef tensor;
  Box box;
  std::vector<float> fp8_scales;
};

// "[0:4, 8:16]" (begin:end per dimension).
std::string BoxToString(const Box& box);

// How a tensor of a TP=k engine is split across its ranks.
enum class ShardKind : uint8_t {
  kReplicated,  // every rank holds all of it (norms, row-parallel biases)
  kColumn,      // split along dim 0 (q/k/v/gate/up weights and biases)
  kRow,         // split along dim 1 (o/down weights)
  kVocab,       // split along dim 0, the vocabulary (embed_tokens, lm_head)
};
std::string_view ShardKindName(ShardKind kind);

// The sizes a layout helper needs beyond a tensor's own shape (from the
// model's config.json). Zero means "not given": then k/v heads are split
// as plain rows, and experts are found by name only.
struct ModelDims {
  uint64_t num_attention_heads = 0;
  uint64_t num_key_value_heads = 0;
  uint64_t head_dim = 0;  // 0: hidden_size / num_attention_heads
  uint64_t num_experts = 0;
};

// How the standard Hugging Face names of Llama, Qwen2/Qwen3 and
// Mixtral-style MoE (and Qwen2-MoE/Qwen3-MoE experts) are split:
//   *.q_proj|k_proj|v_proj|gate_proj|up_proj|w1|w3 .weight and .bias: kColumn
//   *.o_proj|down_proj|w2 .weight: kRow; their .bias: kReplicated
//   *.embed_tokens.weight, lm_head.weight: kVocab
//   everything else (norms, q_norm/k_norm, the MoE router `gate`, rotary
//   buffers): kReplicated.
// MoE experts (`*.experts.<i>.w1` ...) are split by TP like the projection
// they are; across EP ranks see EpRankBox.
ShardKind ClassifyHfTensor(std::string_view name);

// The box of the global tensor `name` of shape `shape` that rank `rank` of
// a TP=`tp` engine holds, the way vLLM splits it:
//   - kColumn/kVocab/kRow: dim 0 (dim 1 for kRow) cut into tp near-equal
//     ranges (the first size % tp ranks one longer: odd sizes allowed);
//   - k_proj/v_proj with GQA (ModelDims heads given): whole kv heads per
//     rank; when tp > num_key_value_heads each kv head is replicated over
//     tp / num_key_value_heads ranks (rank r holds head
//     r * num_kv_heads / tp), as vLLM does; tp must then be a multiple;
//   - q_proj with heads given: whole heads per rank (num_heads % tp == 0);
//   - kReplicated: the whole tensor.
// INVALID_ARGUMENT names the tensor when the split is impossible (rank out
// of range, heads that do not divide).
Result<Box> TpRankBox(std::string_view name, std::span<const uint64_t> shape,
                      uint32_t rank, uint32_t tp, const ModelDims& dims = {});

// MoE experts across `ep` ranks: the expert index of a per-expert tensor
// (`*.experts.<i>.*`) decides whether rank `ep_rank` holds it (experts
// num_experts * r / ep up to num_experts * (r + 1) / ep); a fused expert
// tensor (dim 0 = num_experts) gets its range of dim 0. Returns an empty
// (zero-extent) box for a tensor the rank does not hold. Non-expert
// tensors: TpRankBox with tp = 1 (the whole tensor).
Result<Box> EpRankBox(std::string_view name, std::span<const uint64_t> shape,
                      uint32_t ep_rank, uint32_t ep, const ModelDims& dims);

// Trainer side: the k pieces a tensor of `shape` is published as.
//   FSDP: flat shards along dim 0, near-equal (a rank may get 0 rows when
//   shape[0] < k; such a rank publishes nothing of it).
//   TP: shards along `dim`, near-equal.
std::vector<Box> FsdpShards(std::span<const uint64_t> shape, uint32_t k);
Result<std::vector<Box>> TpShards(std::span<const uint64_t> shape, uint32_t dim,
                                  uint32_t k);

// Near-equal split of `size` into `parts`: the [begin, end) of part `i`
// (the first size % parts parts are one longer).
std::pair<uint64_t, uint64_t> SplitRange(uint64_t size, uint32_t parts,
                                         uint32_t i);

// ------------------------------------------------- dtype conversion
//
// What a fetch applies to bytes as they land when a destination asks for
// another float type than the one published: BF16, F16 and F32 to each
// other, and BF16/F16/F32 to F8_E4M3 (torch.float8_e4m3fn) with a scale.
// Each result equals torch's own cast bit for bit (a NaN stays a NaN; torch
// itself writes different NaN encodings on different paths):
//   BF16/F16/F32 -> BF16/F16/F32: x.to(dtype) (round to nearest even, via
//     F32, which is exact);
//   -> F8_E4M3: (x.float() / scale).to(torch.float8_e4m3fn): the division
//     in F32, then round to nearest even; a |value| that rounds past 448,
//     and inf, saturate to +-448 (as torch 2.13's cast does); NaN stays
//     NaN.
// The scale, per tensor or per output channel (row of dim 0):
//   scale = max(amax, 1e-12) / 448 in F32 (Fp8ScaleForAmax), amax being
//   max |x| over the whole logical tensor or over each of its rows.

// Converts `count` elements; INVALID_ARGUMENT for any other pair of dtypes.
// `scale` is used only for F8_E4M3. src and dst must not overlap.
Status ConvertDType(DType from, DType to, const void* src, void* dst,
                    uint64_t count, float scale = 1.0f);
float Fp8ScaleForAmax(float amax);

}  // namespace tensorhub

#endif  // TENSORHUB_RESHARD_H_
