// A Hugging Face checkpoint directory as one TensorHub version.
//
// A checkpoint directory holds safetensors shards (model.safetensors, or
// model-0000K-of-0000N.safetensors with model.safetensors.index.json) and
// small files: config.json, generation_config.json, tokenizer files. The
// shards' tensors are published as one version; the shards' headers and the
// small files travel in the version's metadata under kHfCheckpointKey, so a
// fetch rebuilds the directory (every shard byte for byte).
//
// The metadata value is a sequence of records, each
//   KIND '\t' NAME '\t' LENGTH [ '\t' DATA_BYTES ] '\n' CONTENT
// with LENGTH bytes of CONTENT. KIND "H": a shard's header JSON (the bytes
// after its 8-byte length prefix) and the size of its data section; "F": a
// small file that is valid UTF-8, verbatim; "B": any other small file,
// base64. Metadata travels as protobuf strings, which must be UTF-8.
//
// Limits: a small file is at most kHfMaxSmallFileBytes and all of them
// together at most kHfMaxSmallFilesBytes (tokenizer.json of large models is
// several MB); larger ones are refused with a message naming them. Weights
// in other formats (*.bin, *.pt, *.pth, *.gguf, ...) are refused too: the
// version would not be what the directory holds.
//
// Thread safety: the functions are pure apart from the file system reads and
// writes they name.
#ifndef TENSORHUB_SAFETENSORS_HF_CHECKPOINT_H_
#define TENSORHUB_SAFETENSORS_HF_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tensorhub/status.h"

namespace tensorhub {

inline constexpr char kHfCheckpointKey[] = "hf.checkpoint";
inline constexpr uint64_t kHfMaxSmallFileBytes = 10ull << 20;
inline constexpr uint64_t kHfMaxSmallFilesBytes = 12ull << 20;
inline constexpr size_t kHfMaxShards = 4096;

struct HfShard {
  std::string name;         // file name inside the directory
  std::string header_json;  // bytes 8 .. data_start of the file
  uint64_t data_bytes = 0;  // size of its data section
};

struct HfFile {
  std::string name;
  std::string content;
};

struct HfCheckpoint {
  std::vector<HfShard> shards;  // sorted by name
  std::vector<HfFile> files;    // sorted by name
};

// Lists DIR: its *.safetensors shards (names only; headers are filled by the
// caller, who maps the files) and reads its small files. Errors:
// INVALID_ARGUMENT (no shards, a shard missing from the index, an oversized
// small file, weights in another format, odd file names), NOT_FOUND (no such
// directory), others for OS failures.
Result<HfCheckpoint> ScanHfCheckpointDir(const std::string& dir);

// The metadata value for `ckpt`, and back. Decode validates every record
// (names, lengths, base64) and returns INVALID_ARGUMENT on malformed input:
// the value comes from the network.
std::string EncodeHfCheckpoint(const HfCheckpoint& ckpt);
Result<HfCheckpoint> DecodeHfCheckpoint(const std::string& value);

// Writes `content` to DIR/NAME atomically (NAME.partial, fsync, rename).
Status WriteFileAtomically(const std::string& path, const std::string& content);

}  // namespace tensorhub

#endif  // TENSORHUB_SAFETENSORS_HF_CHECKPOINT_H_
