#include "common/checksum.h"

#include <chrono>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "tensorhub/check.h"

namespace tensorhub {
namespace internal {
uint64_t Xxh3Avx2(const void* data, size_t bytes);
void Xxh3Avx2Reset(void* state);
void Xxh3Avx2Update(void* state, const void* data, size_t bytes);
uint64_t Xxh3Avx2Digest(const void* state);
size_t Xxh3Avx2StateBytes();
}  // namespace internal

namespace {

// Chosen once: the AVX2 build where the CPU has AVX2, else the library's.
bool UseAvx2() {
#if defined(__x86_64__) && defined(TH_HAVE_AVX2_TU)
  static const bool use =
      __builtin_cpu_supports("avx2") &&
      internal::Xxh3Avx2StateBytes() == sizeof(XXH3_state_t);
  return use;
#else
  return false;
#endif
}

}  // namespace

uint64_t Xxh3(const void* data, size_t bytes) {
#ifdef TH_HAVE_AVX2_TU
  if (UseAvx2()) return internal::Xxh3Avx2(data, bytes);
#endif
  return XXH3_64bits(data, bytes);
}

uint64_t Xxh3Pieces(std::span<const iovec> pieces) {
  if (pieces.size() == 1) return Xxh3(pieces[0].iov_base, pieces[0].iov_len);
  Xxh3Stream stream;
  for (const iovec& p : pieces) stream.Update(p.iov_base, p.iov_len);
  return stream.Digest();
}

Xxh3Stream::Xxh3Stream(bool timed) : state_(XXH3_createState()), timed_(timed) {
  TH_CHECK(state_ != nullptr);
#ifdef TH_HAVE_AVX2_TU
  if (UseAvx2()) {
    internal::Xxh3Avx2Reset(state_);
    return;
  }
#endif
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

Xxh3Stream::~Xxh3Stream() {
  XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}

void Xxh3Stream::Update(const void* data, size_t bytes) {
  if (!timed_) return UpdateUntimed(data, bytes);
  const auto t0 = std::chrono::steady_clock::now();
  UpdateUntimed(data, bytes);
  update_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now() - t0)
                    .count();
}

void Xxh3Stream::UpdateUntimed(const void* data, size_t bytes) {
#ifdef TH_HAVE_AVX2_TU
  if (UseAvx2()) return internal::Xxh3Avx2Update(state_, data, bytes);
#endif
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
}

uint64_t Xxh3Stream::Digest() const {
#ifdef TH_HAVE_AVX2_TU
  if (UseAvx2()) return internal::Xxh3Avx2Digest(state_);
#endif
  return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_));
}

}  // namespace tensorhub
