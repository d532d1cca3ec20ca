#include "demo_model.h"

#include <sys/uio.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/checksum.h"

namespace tensorhub::cli {

std::vector<TensorSpec> QwenLayout(double scale) {
  const uint64_t hidden = 896, inter = 4864, kv = 128;
  const uint64_t vocab =
      std::max<uint64_t>(1024, static_cast<uint64_t>(151936 * scale));
  const int layers = std::max(1, static_cast<int>(24 * scale + 0.5));
  std::vector<TensorSpec> out;
  auto add = [&](std::string name, std::vector<uint64_t> shape) {
    out.push_back(TensorSpec{std::move(name), DType::kBF16, std::move(shape)});
  };
  add("model.embed_tokens.weight", {vocab, hidden});
  for (int l = 0; l < layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {hidden});
    add(p + "self_attn.q_proj.weight", {hidden, hidden});
    add(p + "self_attn.q_proj.bias", {hidden});
    add(p + "self_attn.k_proj.weight", {kv, hidden});
    add(p + "self_attn.k_proj.bias", {kv});
    add(p + "self_attn.v_proj.weight", {kv, hidden});
    add(p + "self_attn.v_proj.bias", {kv});
    add(p + "self_attn.o_proj.weight", {hidden, hidden});
    add(p + "post_attention_layernorm.weight", {hidden});
    add(p + "mlp.gate_proj.weight", {inter, hidden});
    add(p + "mlp.up_proj.weight", {inter, hidden});
    add(p + "mlp.down_proj.weight", {hidden, inter});
  }
  add("model.norm.weight", {hidden});
  return out;
}

const char* HostMemoryName(HostMemory memory) {
  return memory == HostMemory::kPlain ? "plain" : "huge-pages";
}

SyntheticModel::SyntheticModel(std::vector<TensorSpec> specs,
                               HostMemory memory) {
  std::vector<uint64_t> offsets;
  for (const TensorSpec& s : specs) {
    offsets.push_back(total_bytes_);
    // Keep every tensor 8-byte aligned (bf16 sizes here are even anyway).
    total_bytes_ += (*s.ByteSize() + 7) / 8 * 8;
  }
  uint8_t* base = nullptr;
  if (memory == HostMemory::kHugePages) {
    auto buffer = HostBuffer::Allocate(total_bytes_ + 8);
    if (!buffer.ok()) {
      std::fprintf(stderr, "synthetic model: %s\n",
                   buffer.status().ToString().c_str());
      std::abort();
    }
    buffer_ = std::move(*buffer);
    base = buffer_.data();
  } else {
    plain_.reset(new uint64_t[total_bytes_ / 8 + 1]);
    base = reinterpret_cast<uint8_t*>(plain_.get());
    // Touch every page now, so first-use page faults do not land in a
    // timing (a HostBuffer comes zeroed and faulted in already).
    std::memset(base, 0, total_bytes_);
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    uint64_t bytes = *specs[i].ByteSize();
    refs_.push_back(
        TensorRef{specs[i], base + offsets[i], bytes, MemoryLocation::Host()});
  }
}

void SyntheticModel::Fill(uint64_t version) {
  for (size_t i = 0; i < refs_.size(); ++i) {
    // xorshift64*, seeded per (version, tensor).
    uint64_t x =
        (version * 0x9E3779B97F4A7C15ull) ^ (i + 1) * 0xBF58476D1CE4E5B9ull;
    if (x == 0) x = 1;
    auto* w = static_cast<uint64_t*>(refs_[i].data);
    uint64_t words = refs_[i].bytes / 8;
    for (uint64_t k = 0; k < words; ++k) {
      x ^= x >> 12;
      x ^= x << 25;
      x ^= x >> 27;
      w[k] = x * 0x2545F4914F6CDD1Dull;
    }
    auto* tail = static_cast<uint8_t*>(refs_[i].data) + words * 8;
    for (uint64_t k = words * 8; k < refs_[i].bytes; ++k)
      *tail++ = static_cast<uint8_t>(x >> (k % 8));
  }
}

uint64_t SyntheticModel::Digest() const {
  std::vector<iovec> pieces;
  for (const TensorRef& t : refs_) pieces.push_back({t.data, t.bytes});
  return Xxh3Pieces(pieces);
}

}  // namespace tensorhub::cli
