// The public resharding helpers (include/tensorhub/reshard.h): boxes, and
// how Hugging Face names are split across TP and EP ranks.
#include <algorithm>
#include <charconv>
#include <optional>

#include "tensorhub/reshard.h"

namespace tensorhub {
namespace {

std::vector<std::string_view> SplitDots(std::string_view name) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    const size_t dot = name.find('.', start);
    out.push_back(name.substr(start, dot - start));
    if (dot == std::string_view::npos) return out;
    start = dot + 1;
  }
}

// The module a parameter belongs to and the parameter's own name:
// "model.layers.0.self_attn.q_proj.weight" -> ("q_proj", "weight").
std::pair<std::string_view, std::string_view> ModuleAndParam(
    std::string_view name) {
  const std::vector<std::string_view> parts = SplitDots(name);
  if (parts.size() < 2) return {"", parts.back()};
  return {parts[parts.size() - 2], parts.back()};
}

bool OneOf(std::string_view s, std::initializer_list<std::string_view> set) {
  return std::find(set.begin(), set.end(), s) != set.end();
}

// The expert index of `*.experts.<i>.*`, if the name has one.
std::optional<uint64_t> ExpertIndex(std::string_view name) {
  const std::vector<std::string_view> parts = SplitDots(name);
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (parts[i] != "experts") continue;
    uint64_t v = 0;
    const std::string_view s = parts[i + 1];
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && p == s.data() + s.size()) return v;
  }
  return std::nullopt;
}

Box WithRange(std::span<const uint64_t> shape, size_t dim, uint64_t begin,
              uint64_t end) {
  Box b = Box::Whole(shape);
  b.offset[dim] = begin;
  b.extent[dim] = end - begin;
  return b;
}

Status Bad(std::string_view name, const std::string& why) {
  return InvalidArgument("tensor '" + std::string(name) + "': " + why);
}

// Rows of whole heads for q/k/v with head counts given; nullopt when the
// caller gave no head counts (plain near-equal rows then).
Result<std::optional<std::pair<uint64_t, uint64_t>>> HeadRows(
    std::string_view name, std::string_view module, uint64_t rows,
    uint32_t rank, uint32_t tp, const ModelDims& dims) {
  const bool kv = module == "k_proj" || module == "v_proj";
  const uint64_t heads =
      kv ? dims.num_key_value_heads : dims.num_attention_heads;
  if (heads == 0 || !OneOf(module, {"q_proj", "k_proj", "v_proj"})) {
    return std::optional<std::pair<uint64_t, uint64_t>>();
  }
  if (rows % heads != 0) {
    return Bad(name, std::to_string(rows) + " rows are not " +
                         std::to_string(heads) + " heads");
  }
  const uint64_t head_dim = rows / heads;
  if (dims.head_dim != 0 && dims.head_dim != head_dim) {
    return Bad(name, "rows / heads = " + std::to_string(head_dim) +
                         " but head_dim is " + std::to_string(dims.head_dim));
  }
  if (kv && tp > heads) {
    // vLLM replicates each kv head over tp / num_kv_heads ranks.
    if (tp % heads != 0) {
      return Bad(name, "TP " + std::to_string(tp) + " is not a multiple of " +
                           std::to_string(heads) + " kv heads");
    }
    const uint64_t head = rank / (tp / heads);
    return std::optional<std::pair<uint64_t, uint64_t>>(
        {head * head_dim, (head + 1) * head_dim});
  }
  if (heads % tp != 0) {
    return Bad(name, std::to_string(heads) + " heads do not split over TP " +
                         std::to_string(tp));
  }
  const uint64_t per = heads / tp;
  return std::optional<std::pair<uint64_t, uint64_t>>(
      {rank * per * head_dim, (rank + 1) * per * head_dim});
}

}  // namespace

Box Box::Whole(std::span<const uint64_t> shape) {
  Box b;
  b.offset.assign(shape.size(), 0);
  b.extent.assign(shape.begin(), shape.end());
  return b;
}

uint64_t Box::Elements() const {
  uint64_t n = 1;
  for (uint64_t e : extent) {
    if (e == 0) return 0;
    if (__builtin_mul_overflow(n, e, &n)) n = UINT64_MAX;
  }
  return n;
}

std::string BoxToString(const Box& box) {
  std::string out = "[";
  for (size_t d = 0; d < box.extent.size(); ++d) {
    const uint64_t off = d < box.offset.size() ? box.offset[d] : 0;
    out += (d ? ", " : "") + std::to_string(off) + ":" +
           std::to_string(off + box.extent[d]);
  }
  return out + "]";
}

std::string_view ShardKindName(ShardKind kind) {
  switch (kind) {
    case ShardKind::kReplicated:
      return "replicated";
    case ShardKind::kColumn:
      return "column";
    case ShardKind::kRow:
      return "row";
    case ShardKind::kVocab:
      return "vocab";
  }
  return "?";
}

std::pair<uint64_t, uint64_t> SplitRange(uint64_t size, uint32_t parts,
                                         uint32_t i) {
  if (parts == 0 || i >= parts) return {size, size};
  const uint64_t base = size / parts, extra = size % parts;
  const uint64_t begin = i * base + std::min<uint64_t>(i, extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

ShardKind ClassifyHfTensor(std::string_view name) {
  const auto [module, param] = ModuleAndParam(name);
  if (OneOf(module, {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "w1",
                     "w3"})) {
    return ShardKind::kColumn;
  }
  if (OneOf(module, {"o_proj", "down_proj", "w2"})) {
    return param == "weight" ? ShardKind::kRow : ShardKind::kReplicated;
  }
  if ((module == "embed_tokens" || module == "lm_head") && param == "weight") {
    return ShardKind::kVocab;
  }
  return ShardKind::kReplicated;
}

Result<Box> TpRankBox(std::string_view name, std::span<const uint64_t> shape,
                      uint32_t rank, uint32_t tp, const ModelDims& dims) {
  if (tp == 0 || rank >= tp) {
    return Bad(name, "rank " + std::to_string(rank) + " is not in TP " +
                         std::to_string(tp));
  }
  const ShardKind kind = ClassifyHfTensor(name);
  if (kind == ShardKind::kReplicated || tp == 1) return Box::Whole(shape);
  const size_t dim = kind == ShardKind::kRow ? 1 : 0;
  if (shape.size() <= dim) {
    return Bad(name, "a " + std::string(ShardKindName(kind)) +
                         "-parallel tensor needs at least " +
                         std::to_string(dim + 1) + " dimensions");
  }
  if (kind == ShardKind::kVocab) {
    // VocabParallelEmbedding / ParallelLMHead: padded to a multiple of 64.
    const uint64_t padded = (shape[0] + 63) / 64 * 64;
    if (padded % tp != 0) {
      return Bad(name, "vocabulary padded to " + std::to_string(padded) +
                           " does not split over TP " + std::to_string(tp));
    }
    const uint64_t per = padded / tp;
    const uint64_t begin = std::min(shape[0], rank * per);
    const uint64_t end = std::min(shape[0], (rank + 1) * per);
    return WithRange(shape, 0, begin, end);
  }
  if (kind == ShardKind::kColumn) {
    TH_ASSIGN_OR_RETURN(auto heads, HeadRows(name, ModuleAndParam(name).first,
                                             shape[0], rank, tp, dims));
    if (heads.has_value()) {
      return WithRange(shape, 0, heads->first, heads->second);
    }
  }
  const auto [begin, end] = SplitRange(shape[dim], tp, rank);
  return WithRange(shape, dim, begin, end);
}

Result<Box> EpRankBox(std::string_view name, std::span<const uint64_t> shape,
                      uint32_t ep_rank, uint32_t ep, const ModelDims& dims) {
  if (ep == 0 || ep_rank >= ep) {
    return Bad(name, "rank " + std::to_string(ep_rank) + " is not in EP " +
                         std::to_string(ep));
  }
  const bool expert = name.find(".experts.") != std::string_view::npos ||
                      name.starts_with("experts.");
  if (!expert) return Box::Whole(shape);
  if (dims.num_experts == 0) {
    return Bad(name, "an expert tensor needs ModelDims::num_experts");
  }
  const uint64_t first = dims.num_experts * ep_rank / ep;
  const uint64_t last = dims.num_experts * (ep_rank + 1) / ep;
  if (std::optional<uint64_t> i = ExpertIndex(name)) {
    if (*i >= dims.num_experts) {
      return Bad(name, "expert " + std::to_string(*i) + " of " +
                           std::to_string(dims.num_experts));
    }
    if (*i >= first && *i < last) return Box::Whole(shape);
    Box empty = Box::Whole(shape);
    std::fill(empty.extent.begin(), empty.extent.end(), 0);
    if (empty.extent.empty()) return Bad(name, "a 0-dim expert tensor");
    return empty;
  }
  if (shape.empty() || shape[0] != dims.num_experts) {
    return Bad(name, "a fused expert tensor needs dim 0 = num_experts (" +
                         std::to_string(dims.num_experts) + ")");
  }
  return WithRange(shape, 0, first, last);
}

std::vector<Box> FsdpShards(std::span<const uint64_t> shape, uint32_t k) {
  std::vector<Box> out;
  for (uint32_t r = 0; r < k; ++r) {
    if (shape.empty()) {
      // A scalar goes whole to rank 0; the others get an empty box.
      out.push_back(r == 0 ? Box{} : Box{{0}, {0}});
      continue;
    }
    const auto [begin, end] = SplitRange(shape[0], k, r);
    out.push_back(WithRange(shape, 0, begin, end));
  }
  return out;
}

Result<std::vector<Box>> TpShards(std::span<const uint64_t> shape, uint32_t dim,
                                  uint32_t k) {
  if (dim >= shape.size()) {
    return InvalidArgument("TP shards along dim " + std::to_string(dim) +
                           " of a " + std::to_string(shape.size()) +
                           "-dim tensor");
  }
  if (k == 0) return InvalidArgument("TP shards: k must be at least 1");
  std::vector<Box> out;
  for (uint32_t r = 0; r < k; ++r) {
    const auto [begin, end] = SplitRange(shape[dim], k, r);
    out.push_back(WithRange(shape, dim, begin, end));
  }
  return out;
}

}  // namespace tensorhub
