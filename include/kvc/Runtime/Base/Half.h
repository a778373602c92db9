//===- Half.h - bf16 and f16 conversions ------------------------*- C++ -*-===//
//
// Storage formats of weights, KV and hidden states. Computation is fp32;
// bf16 and f16 are converted with round-to-nearest-even.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_BASE_HALF_H
#define KVC_RUNTIME_BASE_HALF_H

#include <cmath>
#include <cstdint>
#include <cstring>

namespace kvc {

inline float bf16ToFloat(uint16_t bits) {
  uint32_t word = uint32_t(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

inline uint16_t floatToBf16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  if (std::isnan(value))
    return uint16_t((word >> 16) | 0x40); // Keep it a quiet NaN.
  uint32_t rounding = 0x7FFF + ((word >> 16) & 1);
  return uint16_t((word + rounding) >> 16);
}

inline float f16ToFloat(uint16_t bits) {
  uint32_t sign = uint32_t(bits & 0x8000) << 16;
  uint32_t exponent = (bits >> 10) & 0x1F;
  uint32_t mantissa = bits & 0x3FF;
  uint32_t word;
  if (exponent == 0) {
    if (mantissa == 0) {
      word = sign;
    } else { // Subnormal: normalize.
      exponent = 127 - 15 + 1;
      while (!(mantissa & 0x400)) {
        mantissa <<= 1;
        --exponent;
      }
      word = sign | (exponent << 23) | ((mantissa & 0x3FF) << 13);
    }
  } else if (exponent == 0x1F) {
    word = sign | 0x7F800000 | (mantissa << 13);
  } else {
    word = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

inline uint16_t floatToF16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  uint32_t sign = (word >> 16) & 0x8000;
  int32_t exponent = int32_t((word >> 23) & 0xFF) - 127 + 15;
  uint32_t mantissa = word & 0x7FFFFF;
  if (((word >> 23) & 0xFF) == 0xFF) // Inf or NaN.
    return uint16_t(sign | 0x7C00 | (mantissa ? 0x200 : 0));
  if (exponent >= 0x1F)
    return uint16_t(sign | 0x7C00);
  if (exponent <= 0) { // Subnormal or zero.
    if (exponent < -10)
      return uint16_t(sign);
    mantissa |= 0x800000;
    uint32_t shift = uint32_t(14 - exponent);
    uint32_t half = mantissa >> shift;
    uint32_t rest = mantissa & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1)))
      ++half;
    return uint16_t(sign | half);
  }
  uint32_t half = sign | (uint32_t(exponent) << 10) | (mantissa >> 13);
  uint32_t rest = mantissa & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1)))
    ++half; // May carry into the exponent, which is correct.
  return uint16_t(half);
}

} // namespace kvc

#endif // KVC_RUNTIME_BASE_HALF_H
