// libFuzzer target for the Hugging Face checkpoint metadata a reader decodes
// (safetensors/hf_checkpoint.h): it comes from the network, and names the
// files the reader then writes into its output directory. Any value must
// decode to INVALID_ARGUMENT, or to shards and files whose names stay inside
// that directory (no separators, no "." or "..", nothing empty), within the
// size limits, that encode back to a value decoding the same.
#include <cstddef>
#include <cstdint>
#include <string>

#include "safetensors/hf_checkpoint.h"

namespace {

bool SafeName(const std::string& n) {
  return !n.empty() && n != "." && n != ".." &&
         n.find('/') == std::string::npos &&
         n.find('\\') == std::string::npos && n.find('\0') == std::string::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string value(reinterpret_cast<const char*>(data), size);
  tensorhub::Result<tensorhub::HfCheckpoint> c =
      tensorhub::DecodeHfCheckpoint(value);
  if (!c.ok()) {
    if (c.status().code() != tensorhub::StatusCode::kInvalidArgument) {
      __builtin_trap();
    }
    return 0;
  }
  if (c->shards.size() > tensorhub::kHfMaxShards) __builtin_trap();
  uint64_t small = 0;
  for (const tensorhub::HfShard& s : c->shards) {
    if (!SafeName(s.name)) __builtin_trap();
  }
  for (const tensorhub::HfFile& f : c->files) {
    if (!SafeName(f.name)) __builtin_trap();
    if (f.content.size() > tensorhub::kHfMaxSmallFileBytes) __builtin_trap();
    small += f.content.size();
  }
  if (small > tensorhub::kHfMaxSmallFilesBytes) __builtin_trap();
  tensorhub::Result<tensorhub::HfCheckpoint> again =
      tensorhub::DecodeHfCheckpoint(tensorhub::EncodeHfCheckpoint(*c));
  if (!again.ok() || again->shards.size() != c->shards.size() ||
      again->files.size() != c->files.size()) {
    __builtin_trap();
  }
  for (size_t i = 0; i < c->shards.size(); ++i) {
    if (again->shards[i].name != c->shards[i].name ||
        again->shards[i].header_json != c->shards[i].header_json ||
        again->shards[i].data_bytes != c->shards[i].data_bytes) {
      __builtin_trap();
    }
  }
  for (size_t i = 0; i < c->files.size(); ++i) {
    if (again->files[i].name != c->files[i].name ||
        again->files[i].content != c->files[i].content) {
      __builtin_trap();
    }
  }
  return 0;
}
