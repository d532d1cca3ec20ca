#include "common/convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "tensorhub/check.h"
#include "tensorhub/reshard.h"

namespace tensorhub {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

bool IsFloat16Or32(DType d) {
  return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32;
}

float LoadF32(DType from, const uint8_t* p) {
  switch (from) {
    case DType::kBF16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return Bf16ToF32(b);
    }
    case DType::kF16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return F16ToF32(b);
    }
    default: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
  }
}

}  // namespace

float Bf16ToF32(uint16_t bits) { return FromBits(uint32_t{bits} << 16); }

// F16 to F32, exactly (subnormals normalized), as c10's
// fp16_ieee_to_fp32_value.
float F16ToF32(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) return FromBits(sign | 0x7F800000u | (mant << 13));
  if (exp != 0) return FromBits(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return FromBits(sign);
  // Subnormal: value = mant * 2^-24.
  const float v = static_cast<float>(mant) * 0x1p-24f;
  return sign ? -v : v;
}

// c10::BFloat16's round_to_nearest_even.
uint16_t F32ToBf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  const uint32_t u = Bits(f);
  const uint32_t bias = ((u >> 16) & 1) + 0x7FFF;
  return static_cast<uint16_t>((u + bias) >> 16);
}

// c10's fp16_ieee_from_fp32_value: round to nearest even, overflow to inf,
// NaN to 0x7E00 with the sign.
uint16_t F32ToF16(float f) {
  const float scale_to_inf = 0x1.0p+112f;
  const float scale_to_zero = 0x1.0p-110f;
  float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;
  const uint32_t w = Bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = FromBits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = Bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) |
                               (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

// c10's fp8e4m3fn_from_fp32_value, saturating as torch's cast does (2.13
// CPU: a magnitude that rounds past 448, inf included, becomes +-448).
uint8_t F32ToF8E4M3(float f) {
  constexpr uint32_t kFp8Max = uint32_t{1087} << 20;  // 480.0f: NaN from here
  constexpr uint32_t kDenormMask = uint32_t{141} << 23;
  uint32_t bits = Bits(f);
  const uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  uint8_t result;
  if (bits > 0x7F800000u) {
    result = 0x7F;  // NaN stays NaN
  } else if (bits >= kFp8Max) {
    result = 0x7E;  // past 448 (inf included): saturates, as torch's cast
  } else if (bits < (uint32_t{121} << 23)) {
    // Below 2^-6, the smallest normal: the FPU's own rounding of an add.
    bits = Bits(FromBits(bits) + FromBits(kDenormMask));
    result = static_cast<uint8_t>(bits - kDenormMask);
  } else {
    const uint32_t mant_odd = (bits >> 20) & 1;
    bits += (uint32_t(7 - 127) << 23) + 0x7FFFF;
    bits += mant_odd;
    result = static_cast<uint8_t>(bits >> 20);
    if (result == 0x7F) result = 0x7E;  // (464, 480) rounds to 480: saturates
  }
  return static_cast<uint8_t>(result | (sign >> 24));
}

float F8E4M3ToF32(uint8_t b) {
  const uint32_t sign = uint32_t{b & 0x80u} << 24;
  const uint32_t exp = (b >> 3) & 0xF;
  const uint32_t mant = b & 0x7;
  if (exp == 0xF && mant == 0x7) return FromBits(sign | 0x7FC00000u);
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 0x1p-9f;
    return sign ? -v : v;
  }
  return FromBits(sign | ((exp + 120) << 23) | (mant << 20));
}

bool NeedsScale(DType to) { return to == DType::kF8E4M3; }

Status CheckConversion(DType from, DType to, std::string_view what) {
  if (from == to) return Status::Ok();
  if (IsFloat16Or32(from) && (IsFloat16Or32(to) || to == DType::kF8E4M3)) {
    return Status::Ok();
  }
  return InvalidArgument(std::string(what) + ": cannot convert " +
                         std::string(DTypeName(from)) + " to " +
                         std::string(DTypeName(to)) +
                         " (conversions: BF16, F16 and F32 to each other "
                         "and to F8_E4M3)");
}

float Fp8Scale(float amax) { return std::max(amax, 1e-12f) / 448.0f; }

void ConvertElements(DType from, DType to, const uint8_t* src, uint8_t* dst,
                     uint64_t count, float scale) {
  if (from == to) {
    std::memmove(dst, src, count * DTypeBytes(from));
    return;
  }
  TH_CHECK(CheckConversion(from, to, "convert").ok());
  const size_t in = DTypeBytes(from), out = DTypeBytes(to);
  // Elementwise, front to back: in place only when sizes are equal.
  for (uint64_t i = 0; i < count; ++i) {
    const float f = LoadF32(from, src + i * in);
    uint8_t* d = dst + i * out;
    switch (to) {
      case DType::kF32:
        std::memcpy(d, &f, 4);
        break;
      case DType::kBF16: {
        const uint16_t b = F32ToBf16(f);
        std::memcpy(d, &b, 2);
        break;
      }
      case DType::kF16: {
        const uint16_t h = F32ToF16(f);
        std::memcpy(d, &h, 2);
        break;
      }
      default:  // F8_E4M3
        *d = F32ToF8E4M3(f / scale);
        break;
    }
  }
}

Status ConvertDType(DType from, DType to, const void* src, void* dst,
                    uint64_t count, float scale) {
  TH_RETURN_IF_ERROR(CheckConversion(from, to, "convert"));
  ConvertElements(from, to, static_cast<const uint8_t*>(src),
                  static_cast<uint8_t*>(dst), count, scale);
  return Status::Ok();
}

float Fp8ScaleForAmax(float amax) { return Fp8Scale(amax); }

float AbsMax(DType dtype, const uint8_t* data, uint64_t count) {
  float m = 0;
  const size_t in = DTypeBytes(dtype);
  for (uint64_t i = 0; i < count; ++i) {
    const float a = std::fabs(LoadF32(dtype, data + i * in));
    if (a > m) m = a;  // false for NaN
  }
  return m;
}

}  // namespace tensorhub
