#include "delta/delta_codec.h"

#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "delta/le_bytes.h"
#include "tensorhub/check.h"

namespace tensorhub::delta {
namespace {

using le::GetU32;
using le::GetU64;
using le::PutU32;
using le::PutU64;

constexpr size_t kMaxVarintBytes = 10;

bool ValidWidth(uint32_t w) { return w == 1 || w == 2 || w == 4 || w == 8; }

uint64_t WidthMask(uint32_t w) {
  return w == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * w)) - 1;
}

// Writes `v` as a LEB128 varint at `p` (at most 10 bytes); returns the end.
uint8_t* PutVarint(uint8_t* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}

// Reads one LEB128 varint of at most 10 bytes (and no bits past 64) from
// [*p, end); false on a truncated or overlong one.
bool GetVarint(const uint8_t** p, const uint8_t* end, uint64_t* v) {
  uint64_t r = 0;
  for (size_t i = 0; i < kMaxVarintBytes; ++i) {
    if (*p == end) return false;
    const uint8_t b = *(*p)++;
    if (i == kMaxVarintBytes - 1 && b > 1) return false;  // past 64 bits
    r |= uint64_t{b & 0x7Fu} << (7 * i);
    if ((b & 0x80) == 0) {
      *v = r;
      return true;
    }
  }
  return false;
}

// The difference v - b modulo 2^(8w) as a signed number, zigzag-coded.
uint64_t ZigzagDiff(uint64_t b, uint64_t v, uint32_t w) {
  const uint64_t d = (v - b) & WidthMask(w);
  const unsigned shift = 64 - 8 * w;
  const int64_t s = static_cast<int64_t>(d << shift) >> shift;  // sign-extend
  return (static_cast<uint64_t>(s) << 1) ^ static_cast<uint64_t>(s >> 63);
}
uint64_t Unzigzag(uint64_t z) { return (z >> 1) ^ (~(z & 1) + 1); }

uint64_t TotalBytes(std::span<const iovec> pieces) {
  uint64_t n = 0;
  for (const iovec& p : pieces) n += p.iov_len;
  return n;
}

// Base and destination walked in step, one byte position for both.
class Walker {
 public:
  Walker(std::span<const iovec> base, std::span<const iovec> dest)
      : base_(base), dest_(dest) {}

  // Copies the next `len` bytes of the base to the destination (nothing to
  // copy where they are the same memory: in place).
  void Copy(uint64_t len) {
    while (len > 0) {
      Settle();
      const uint64_t n = std::min<uint64_t>(
          {len, base_[bi_].iov_len - bo_, dest_[di_].iov_len - do_});
      const uint8_t* src =
          static_cast<const uint8_t*>(base_[bi_].iov_base) + bo_;
      uint8_t* dst = static_cast<uint8_t*>(dest_[di_].iov_base) + do_;
      if (src != dst) std::memcpy(dst, src, n);
      bo_ += n;
      do_ += n;
      len -= n;
    }
  }

  // The next element of the base (w bytes, little-endian), and writes
  // `value` in its place in the destination.
  uint64_t ReadBase(uint32_t w) {
    uint64_t v = 0;
    size_t i = bi_, o = bo_;
    for (uint32_t k = 0; k < w; ++k) {
      while (o == base_[i].iov_len) ++i, o = 0;
      v |= uint64_t{static_cast<const uint8_t*>(base_[i].iov_base)[o++]}
           << (8 * k);
    }
    return v;
  }
  void WriteDest(uint64_t value, uint32_t w) {
    for (uint32_t k = 0; k < w; ++k) {
      while (do_ == dest_[di_].iov_len) ++di_, do_ = 0;
      static_cast<uint8_t*>(dest_[di_].iov_base)[do_++] =
          static_cast<uint8_t>(value >> (8 * k));
    }
    for (uint32_t k = 0; k < w; ++k) {
      while (bo_ == base_[bi_].iov_len) ++bi_, bo_ = 0;
      ++bo_;
    }
  }

 private:
  void Settle() {
    while (bo_ == base_[bi_].iov_len) ++bi_, bo_ = 0;
    while (do_ == dest_[di_].iov_len) ++di_, do_ = 0;
  }

  std::span<const iovec> base_, dest_;
  size_t bi_ = 0, di_ = 0;
  uint64_t bo_ = 0, do_ = 0;
};

}  // namespace

struct Codec::State {
  ZSTD_CCtx* cctx = nullptr;
  ZSTD_DCtx* dctx = nullptr;
  std::vector<uint8_t> base_gather, version_gather;
  std::vector<uint8_t> gaps, diffs;  // sized for the worst case kept
  std::vector<uint8_t> streams;
  ~State() {
    ZSTD_freeCCtx(cctx);
    ZSTD_freeDCtx(dctx);
  }
};

Codec::Codec(int zstd_level)
    : state_(std::make_unique<State>()), zstd_level_(zstd_level) {
  state_->cctx = ZSTD_createCCtx();
  state_->dctx = ZSTD_createDCtx();
  TH_CHECK(state_->cctx != nullptr && state_->dctx != nullptr);
}

Codec::~Codec() = default;

namespace {

// `pieces` as one run: the piece itself when there is one, else gathered
// into `scratch`.
const uint8_t* Contiguous(std::span<const iovec> pieces, uint64_t bytes,
                          std::vector<uint8_t>* scratch) {
  if (pieces.size() == 1)
    return static_cast<const uint8_t*>(pieces[0].iov_base);
  scratch->resize(bytes);
  uint64_t at = 0;
  for (const iovec& p : pieces) {
    if (p.iov_len > 0) std::memcpy(scratch->data() + at, p.iov_base, p.iov_len);
    at += p.iov_len;
  }
  return scratch->data();
}

}  // namespace

Result<bool> Codec::Encode(std::span<const iovec> base,
                           std::span<const iovec> version, uint32_t elem_bytes,
                           std::string* out) {
  const uint64_t n = TotalBytes(base);
  if (TotalBytes(version) != n) {
    return InvalidArgument("delta: the base chunk has " + std::to_string(n) +
                           " bytes, the version's " +
                           std::to_string(TotalBytes(version)));
  }
  if (n > kMaxChunkDeltaBytes) {
    return InvalidArgument("delta: a chunk of " + std::to_string(n) +
                           " bytes is larger than a chunk may be");
  }
  if (!ValidWidth(elem_bytes)) {
    return InvalidArgument("delta: element width " +
                           std::to_string(elem_bytes) +
                           " is not 1, 2, 4 or 8 bytes");
  }
  const uint32_t w = n % elem_bytes == 0 ? elem_bytes : 1;
  State& st = *state_;
  const uint8_t* b = n == 0 ? nullptr : Contiguous(base, n, &st.base_gather);
  const uint8_t* v =
      n == 0 ? nullptr : Contiguous(version, n, &st.version_gather);
  // Streams longer than half the chunk are no delta: room for that plus
  // one change's worth of varints, written without bounds checks.
  const uint64_t limit = n / 2;
  st.gaps.resize(limit + kMaxVarintBytes);
  st.diffs.resize(limit + kMaxVarintBytes);
  uint8_t* gp = st.gaps.data();
  uint8_t* dp = st.diffs.data();
  const uint8_t* const gaps0 = gp;
  const uint8_t* const diffs0 = dp;
  auto streams = [&] {
    return static_cast<uint64_t>((gp - gaps0) + (dp - diffs0));
  };
  uint64_t changed = 0, next = 0;  // next: the element after the last change
  auto change = [&](uint64_t e) {
    uint64_t be = 0, ve = 0;
    std::memcpy(&be, b + e * w, w);
    std::memcpy(&ve, v + e * w, w);
    if (be == ve) return;
    gp = PutVarint(gp, e - next);
    dp = PutVarint(dp, ZigzagDiff(be, ve, w));
    next = e + 1;
    ++changed;
  };
  // Eight bytes at a time where they are equal (most of them), element by
  // element where they are not.
  const uint64_t words = n / 8;
  const uint64_t per_word = 8 / w;
  for (uint64_t i = 0; i < words; ++i) {
    if (GetU64(b + 8 * i) == GetU64(v + 8 * i)) continue;
    for (uint64_t e = i * per_word; e < (i + 1) * per_word; ++e) {
      change(e);
      if (streams() > limit) return false;
    }
  }
  for (uint64_t e = words * per_word; e < n / w; ++e) {
    change(e);
    if (streams() > limit) return false;
  }
  const uint64_t gap_bytes = static_cast<uint64_t>(gp - gaps0);
  const uint64_t diff_bytes = static_cast<uint64_t>(dp - diffs0);

  out->reserve(out->size() + kChunkDeltaHeaderBytes +
               ZSTD_compressBound(gap_bytes + diff_bytes));
  PutU32(out, kChunkDeltaMagic);
  out->push_back(static_cast<char>(kChunkDeltaFormatSparse));
  out->push_back(static_cast<char>(w));
  out->append(2, '\0');
  PutU64(out, n);
  PutU64(out, changed);
  PutU32(out, static_cast<uint32_t>(gap_bytes));
  PutU32(out, static_cast<uint32_t>(diff_bytes));
  if (changed == 0) return true;
  st.streams.resize(gap_bytes + diff_bytes);
  std::memcpy(st.streams.data(), st.gaps.data(), gap_bytes);
  std::memcpy(st.streams.data() + gap_bytes, st.diffs.data(), diff_bytes);
  const size_t at = out->size();
  out->resize(at + ZSTD_compressBound(st.streams.size()));
  const size_t z =
      ZSTD_compressCCtx(st.cctx, out->data() + at, out->size() - at,
                        st.streams.data(), st.streams.size(), zstd_level_);
  TH_CHECK(!ZSTD_isError(z));  // the output is compressBound long
  out->resize(at + z);
  return true;
}

Result<ChunkDeltaHeader> DecodeChunkDeltaHeader(
    std::span<const uint8_t> delta) {
  if (delta.size() < kChunkDeltaHeaderBytes) {
    return DataLoss("delta: " + std::to_string(delta.size()) +
                    " bytes, shorter than a chunk delta's header");
  }
  const uint8_t* p = delta.data();
  if (GetU32(p) != kChunkDeltaMagic) return DataLoss("delta: bad magic");
  if (p[4] != kChunkDeltaFormatSparse) {
    return DataLoss("delta: unknown format " + std::to_string(p[4]));
  }
  ChunkDeltaHeader h;
  h.elem_bytes = p[5];
  if (!ValidWidth(h.elem_bytes)) {
    return DataLoss("delta: element width " + std::to_string(h.elem_bytes));
  }
  if (p[6] != 0 || p[7] != 0) return DataLoss("delta: reserved bytes not 0");
  h.chunk_bytes = GetU64(p + 8);
  h.changed = GetU64(p + 16);
  h.gap_bytes = GetU32(p + 24);
  h.diff_bytes = GetU32(p + 28);
  if (h.chunk_bytes > kMaxChunkDeltaBytes ||
      h.chunk_bytes % h.elem_bytes != 0) {
    return DataLoss("delta: chunk of " + std::to_string(h.chunk_bytes) +
                    " bytes in elements of " + std::to_string(h.elem_bytes));
  }
  const uint64_t streams = uint64_t{h.gap_bytes} + h.diff_bytes;
  // Each change takes at least one byte in each stream; the encoder makes
  // no delta whose streams exceed half the chunk.
  if (h.changed > h.chunk_bytes / h.elem_bytes || h.gap_bytes < h.changed ||
      h.diff_bytes < h.changed || streams > h.chunk_bytes / 2 ||
      (h.changed == 0) != (streams == 0) ||
      (h.changed == 0) != (delta.size() == kChunkDeltaHeaderBytes)) {
    return DataLoss("delta: " + std::to_string(h.changed) +
                    " changed elements in streams of " +
                    std::to_string(h.gap_bytes) + " + " +
                    std::to_string(h.diff_bytes) + " bytes, chunk of " +
                    std::to_string(h.chunk_bytes));
  }
  return h;
}

Status Codec::Apply(std::span<const uint8_t> delta, std::span<const iovec> base,
                    std::span<const iovec> dest) {
  TH_ASSIGN_OR_RETURN(const ChunkDeltaHeader h, DecodeChunkDeltaHeader(delta));
  const uint64_t n = TotalBytes(dest);
  if (TotalBytes(base) != n) {
    return InvalidArgument("delta: the base has " +
                           std::to_string(TotalBytes(base)) +
                           " bytes, the destination " + std::to_string(n));
  }
  if (h.chunk_bytes != n) {
    return DataLoss("delta: made for a chunk of " +
                    std::to_string(h.chunk_bytes) +
                    " bytes, the destination has " + std::to_string(n));
  }
  State& st = *state_;
  const uint64_t streams = uint64_t{h.gap_bytes} + h.diff_bytes;
  st.streams.resize(streams);
  if (h.changed > 0) {
    const size_t got =
        ZSTD_decompressDCtx(st.dctx, st.streams.data(), streams,
                            delta.data() + kChunkDeltaHeaderBytes,
                            delta.size() - kChunkDeltaHeaderBytes);
    if (ZSTD_isError(got) || got != streams) {
      return DataLoss(
          std::string("delta: the compressed streams do not decode: ") +
          (ZSTD_isError(got) ? ZSTD_getErrorName(got) : "a different length"));
    }
  }
  const uint32_t w = h.elem_bytes;
  const uint64_t elems = h.chunk_bytes / w;
  const uint8_t* gaps = st.streams.data();
  const uint8_t* gaps_end = gaps + h.gap_bytes;
  const uint8_t* diffs = gaps_end;
  const uint8_t* diffs_end = diffs + h.diff_bytes;
  // First pass: every change decodes, in bounds, with nothing left over;
  // only then is the destination written (a refused delta changes nothing).
  {
    const uint8_t* g = gaps;
    const uint8_t* d = diffs;
    uint64_t next = 0;
    for (uint64_t k = 0; k < h.changed; ++k) {
      uint64_t gap, z;
      if (!GetVarint(&g, gaps_end, &gap) || !GetVarint(&d, diffs_end, &z)) {
        return DataLoss("delta: change " + std::to_string(k) + " is truncated");
      }
      if (gap >= elems - next) {
        return DataLoss("delta: change " + std::to_string(k) +
                        " lies past the chunk's " + std::to_string(elems) +
                        " elements");
      }
      if (w < 8 && (z >> (8 * w)) != 0) {
        return DataLoss("delta: change " + std::to_string(k) +
                        " is wider than its element");
      }
      next += gap + 1;
    }
    if (g != gaps_end || d != diffs_end) {
      return DataLoss("delta: bytes left over after the last change");
    }
  }
  const uint8_t* g = gaps;
  const uint8_t* d = diffs;
  uint64_t next = 0;
  if (base.size() == 1 && dest.size() == 1) {
    // One run each (the usual chunk): copy the base whole, then patch the
    // changed elements in place.
    const uint8_t* b = static_cast<const uint8_t*>(base[0].iov_base);
    uint8_t* out = static_cast<uint8_t*>(dest[0].iov_base);
    if (out != b) std::memcpy(out, b, h.chunk_bytes);
    const uint64_t mask = WidthMask(w);
    for (uint64_t k = 0; k < h.changed; ++k) {
      uint64_t gap = 0, z = 0;
      GetVarint(&g, gaps_end, &gap);
      GetVarint(&d, diffs_end, &z);
      next += gap;
      uint64_t e = 0;
      std::memcpy(&e, out + next * w, w);
      e = (e + Unzigzag(z)) & mask;
      std::memcpy(out + next * w, &e, w);
      ++next;
    }
    return Status::Ok();
  }
  Walker walk(base, dest);
  for (uint64_t k = 0; k < h.changed; ++k) {
    uint64_t gap = 0, z = 0;
    GetVarint(&g, gaps_end, &gap);
    GetVarint(&d, diffs_end, &z);
    walk.Copy(gap * w);
    const uint64_t b = walk.ReadBase(w);
    walk.WriteDest((b + Unzigzag(z)) & WidthMask(w), w);
    next += gap + 1;
  }
  walk.Copy((elems - next) * w);
  return Status::Ok();
}

}  // namespace tensorhub::delta
