//===- Float8.h - FP8 E4M3 codes --------------------------------*- C++ -*-===//
//
// The codes of FP8 quantization (the codec registry's "fp8"): OCP's E4M3
// "fn" variant, as CUDA's __nv_fp8_e4m3 and torch.float8_e4m3fn, converted
// with round-to-nearest-even and saturation.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_BASE_FLOAT8_H
#define KVC_RUNTIME_BASE_FLOAT8_H

#include <cmath>
#include <cstdint>
#include <cstring>

namespace kvc {

/// The largest E4M3 value.
constexpr float kE4m3Max = 448.0f;

/// The value of an FP8 E4M3 code, OCP's "fn" variant as CUDA's __nv_fp8_e4m3
/// and torch.float8_e4m3fn: a sign, 4 exponent bits biased by 7, 3 mantissa
/// bits; subnormals below 2^-6, no infinities, S.1111.111 the only NaN, 448
/// the largest value.
inline float e4m3ToFloat(uint8_t code) {
  const uint32_t sign = uint32_t(code & 0x80) << 24;
  const uint32_t exponent = (code >> 3) & 0xF, mantissa = code & 7;
  uint32_t word;
  if ((code & 0x7F) == 0x7F) {
    word = sign | 0x7FC00000;
  } else if (exponent == 0) { // Subnormal: multiples of 2^-9.
    const float magnitude = float(mantissa) * 0x1p-9f;
    std::memcpy(&word, &magnitude, sizeof(word));
    word |= sign;
  } else {
    word = sign | ((exponent + 127 - 7) << 23) | (mantissa << 20);
  }
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

/// The E4M3 code nearest `value` (ties to even), saturated to +-448 as
/// CUDA's __NV_SATFINITE conversion; NaN gives the NaN code.
inline uint8_t floatToE4m3(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  const uint8_t sign = uint8_t((word >> 24) & 0x80);
  if (std::isnan(value))
    return uint8_t(sign | 0x7F);
  const float magnitude = std::fabs(value);
  if (magnitude >= kE4m3Max)
    return uint8_t(sign | 0x7E);
  if (magnitude < 0x1p-6f) // Subnormal: 2^-9 steps, 8 of them the smallest normal.
    return uint8_t(sign | uint8_t(std::nearbyint(magnitude * 512.0f)));
  const uint32_t exponent = ((word >> 23) & 0xFF) - 127 + 7; // 1 .. 15
  const uint32_t mantissa = word & 0x7FFFFF;
  // Round 23 mantissa bits to 3; a carry moves into the exponent.
  const uint32_t rounded = (mantissa + 0x7FFFF + ((mantissa >> 20) & 1)) >> 20;
  return uint8_t(sign | ((exponent << 3) + rounded));
}

} // namespace kvc

#endif // KVC_RUNTIME_BASE_FLOAT8_H
