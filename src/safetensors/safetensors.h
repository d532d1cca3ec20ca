// Reading and writing safetensors files.
//
// Format (https://github.com/huggingface/safetensors): an 8-byte
// little-endian u64 N, then N bytes of UTF-8 JSON (may end in spaces), then
// the data section. The JSON is an object mapping each tensor name to
// {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, offsets
// relative to the first byte of the data section, plus an optional
// "__metadata__" object of string -> string.
//
// The parser faces files from users: it never reads outside the given buffer,
// bounds the header size, JSON nesting and tensor rank, and reports every
// problem as INVALID_ARGUMENT. Like the reference implementation it requires
// the tensors, sorted by offset, to tile the data section exactly.
//
// Thread safety: the free functions are pure. A MappedSafetensorsFile may be
// read from any number of threads; a SafetensorsFileWriter belongs to one
// thread at a time (tensor bytes may be written from many threads, but
// Commit() must not race with those writes).
#ifndef TENSORHUB_SAFETENSORS_SAFETENSORS_H_
#define TENSORHUB_SAFETENSORS_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tensorhub/status.h"
#include "tensorhub/types.h"

namespace tensorhub {

// Limits enforced when parsing and building headers.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100ull << 20;  // N
inline constexpr size_t kSafetensorsMaxRank = 16;
inline constexpr int kSafetensorsMaxJsonDepth = 64;

struct SafetensorsEntry {
  TensorSpec spec;
  uint64_t begin = 0;  // offsets into the data section; end - begin bytes
  uint64_t end = 0;
  bool operator==(const SafetensorsEntry&) const = default;
};

struct SafetensorsHeader {
  // Sorted by begin offset (ties keep the file's order); names are unique.
  std::vector<SafetensorsEntry> tensors;
  // "__metadata__" in the file's order; keys are unique.
  std::vector<std::pair<std::string, std::string>> metadata;
  uint64_t data_start = 0;  // 8 + N: file offset of the data section
};

// Parses and validates a header. `bytes[0, size)` holds at least the first
// 8 + N bytes of the file (it may hold the whole file); `file_bytes` is the
// total file size, used to check offsets against the data section. The
// result does not point into `bytes`.
Result<SafetensorsHeader> ParseSafetensorsHeader(const uint8_t* bytes,
                                                 size_t size,
                                                 uint64_t file_bytes);

// Serializes a header for `specs`, laid out contiguously in the given order
// (the first tensor at data offset 0). Returns the first data_start bytes of
// the file: the 8-byte length, then the JSON padded with spaces so that
// data_start is a multiple of 8. Fails on duplicate or reserved names, rank
// above kSafetensorsMaxRank, byte size overflow, duplicate metadata keys or
// strings that are not valid UTF-8.
Result<std::string> BuildSafetensorsHeader(
    const std::vector<TensorSpec>& specs,
    const std::vector<std::pair<std::string, std::string>>& metadata);

// A read-only, memory-mapped safetensors file. Owns the mapping (unmapped in
// the destructor); movable, not copyable. The file must not be truncated
// while mapped: reading a page past the new end raises SIGBUS.
class MappedSafetensorsFile {
 public:
  // Errors: NOT_FOUND (no such file), INVALID_ARGUMENT (not a regular file,
  // or a malformed safetensors file), others for OS failures.
  static Result<MappedSafetensorsFile> Open(const std::string& path);

  MappedSafetensorsFile(MappedSafetensorsFile&& other) noexcept;
  MappedSafetensorsFile& operator=(MappedSafetensorsFile&& other) noexcept;
  MappedSafetensorsFile(const MappedSafetensorsFile&) = delete;
  MappedSafetensorsFile& operator=(const MappedSafetensorsFile&) = delete;
  ~MappedSafetensorsFile();

  const SafetensorsHeader& header() const { return header_; }
  // One ref per tensor, in header order, pointing into the mapping; valid
  // while this object lives. The mapping is PROT_READ: the pointers are
  // non-const only because TensorRef is; writing through them faults.
  std::vector<TensorRef> tensors() const;
  uint64_t file_bytes() const { return file_bytes_; }

 private:
  MappedSafetensorsFile() = default;
  void Reset();

  void* base_ = nullptr;  // nullptr when moved from
  uint64_t file_bytes_ = 0;
  SafetensorsHeader header_;
};

// What Commit() does with the mapping once the file is in place.
enum class AfterCommit {
  kUnmap,
  // Keep it until the writer is destroyed: tensors() stays valid, so the
  // bytes can still be served (read) from memory after the file is in
  // place. The mapping is the committed file's pages: writes through it
  // change the file.
  kKeepMapped,
};

// A file being written: created as `path + ".partial"` at its final size and
// mapped MAP_SHARED, so a fetch writes tensor bytes straight into the page
// cache. Commit() flushes, renames it to `path` and (by default) unmaps it;
// destroying the writer without a successful Commit() removes the partial
// file. One writer per path at a time (a second one truncates the first
// one's partial file).
class SafetensorsFileWriter {
 public:
  // Errors: INVALID_ARGUMENT (bad specs, see BuildSafetensorsHeader),
  // RESOURCE_EXHAUSTED (no space), NOT_FOUND (no such directory), others for
  // OS failures.
  static Result<SafetensorsFileWriter> Create(
      const std::string& path, const std::vector<TensorSpec>& specs,
      const std::vector<std::pair<std::string, std::string>>& metadata);

  // Writes `raw_header` (the first data_start bytes of a safetensors file,
  // exactly as another file had them) verbatim, so that a file can be
  // reproduced byte for byte. `data_bytes` is the data section's size; the
  // header is validated against it. tensors() follows the header's offset
  // order.
  static Result<SafetensorsFileWriter> CreateFromRawHeader(
      const std::string& path, const std::string& raw_header,
      uint64_t data_bytes);

  SafetensorsFileWriter(SafetensorsFileWriter&& other) noexcept;
  SafetensorsFileWriter& operator=(SafetensorsFileWriter&& other) noexcept;
  SafetensorsFileWriter(const SafetensorsFileWriter&) = delete;
  SafetensorsFileWriter& operator=(const SafetensorsFileWriter&) = delete;
  ~SafetensorsFileWriter();

  // Destinations inside the mapping, in spec order. Valid until Commit()
  // (with kKeepMapped: until destruction) or destruction; empty once
  // unmapped.
  std::vector<TensorRef> tensors();
  uint64_t file_bytes() const { return file_bytes_; }

  // msync, fsync, unmap (unless kKeepMapped), rename to `path`, fsync the
  // directory. Calling it again after it ran (successfully or not) is
  // FAILED_PRECONDITION.
  Status Commit(AfterCommit after = AfterCommit::kUnmap);

 private:
  SafetensorsFileWriter() = default;
  static Result<SafetensorsFileWriter> CreateWithHeader(
      const std::string& path, const std::string& header,
      const std::vector<TensorSpec>& specs, std::vector<uint64_t> begins,
      uint64_t data_bytes);
  // Unmaps, closes and (if not committed) unlinks the partial file.
  void Abandon();

  std::string path_;
  std::string partial_path_;
  int fd_ = -1;
  void* base_ = nullptr;
  uint64_t file_bytes_ = 0;
  uint64_t data_start_ = 0;
  std::vector<TensorSpec> specs_;
  std::vector<uint64_t> begins_;  // data offset of each spec
  bool commit_attempted_ = false;
  bool committed_ = false;
};

}  // namespace tensorhub

#endif  // TENSORHUB_SAFETENSORS_SAFETENSORS_H_
