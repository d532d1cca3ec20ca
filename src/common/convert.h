// Float conversions applied to bytes as they land in a reader's memory:
// BF16, F16 and F32 to each other, and BF16/F16/F32 to F8_E4M3 (torch's
// float8_e4m3fn) with a scale.
//
// Every result equals torch's own cast bit for bit, NaN excepted (a NaN
// stays a NaN; torch itself writes different NaN encodings on different
// paths: 1.13 writes 0xFFFF for F32 -> BF16 and 0x7FC0 for F16 -> BF16):
//   - to F32: exact;
//   - F32 -> BF16 and F32 -> F16: round to nearest, ties to even; F16
//     overflows to +-inf (F16's own rule); BF16/F16 -> F16/BF16 go through
//     F32 (exact) and round once;
//   - to F8_E4M3: q = e4m3fn(float(x) / scale), the division in F32, then
//     torch's rounding: nearest, ties to even; a magnitude that rounds
//     past 448 (anything above 464 after the division) and inf saturate
//     to +-448 (0x7E with the sign), as torch 2.13's cast does
//     (float8_e4m3fn has no inf); NaN stays NaN (0x7F with the sign).
// The scale torch users compute, and the one TensorHub uses (Fp8Scale):
//   scale = max(amax, 1e-12) / 448   (F32), amax = max |x| over the tensor
//   (per tensor) or over each output channel, i.e. each row of dim 0 (per
//   channel); torch: `(x.float() / scale).to(torch.float8_e4m3fn)`, with
//   scale of shape [rows, 1] per channel.
// Pure functions; no allocation.
#ifndef TENSORHUB_COMMON_CONVERT_H_
#define TENSORHUB_COMMON_CONVERT_H_

#include <cstdint>
#include <string_view>

#include "tensorhub/status.h"
#include "tensorhub/types.h"

namespace tensorhub {

// OK if `from` can be converted to `to` on the way in (the same dtype
// always can); else INVALID_ARGUMENT naming both and `what`.
Status CheckConversion(DType from, DType to, std::string_view what);
bool NeedsScale(DType to);

// The F32 scale for an absolute maximum, as documented above.
float Fp8Scale(float amax);

// Converts `count` elements at `src` (of `from`) to `to` at `dst`. `scale`
// is used only when `to` is F8_E4M3. The ranges must not overlap unless
// src == dst and the element sizes are equal. Requires CheckConversion.
void ConvertElements(DType from, DType to, const uint8_t* src, uint8_t* dst,
                     uint64_t count, float scale = 1.0f);

// The largest |x| over `count` elements of a float dtype (NaN ignored; an
// inf gives inf). 0 for count 0.
float AbsMax(DType dtype, const uint8_t* data, uint64_t count);

// Scalar conversions, exposed for tests.
float Bf16ToF32(uint16_t bits);
float F16ToF32(uint16_t bits);
uint16_t F32ToBf16(float f);
uint16_t F32ToF16(float f);
uint8_t F32ToF8E4M3(float f);
float F8E4M3ToF32(uint8_t bits);

}  // namespace tensorhub

#endif  // TENSORHUB_COMMON_CONVERT_H_
