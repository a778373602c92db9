//===- AffineBf16.h - Dequantizing codes to bf16 on the CPU -----*- C++ -*-===//
//
// Private to lib/Runtime/Codec: the kernels that turn quantized codes into
// bf16 values (minimum + scale * code) for a restore's host decode, each in
// a portable form and, on x86-64, AVX2 and AVX-512 forms chosen by what the
// CPU has (AffineBf16.cpp).
//
//===----------------------------------------------------------------------===//

#ifndef KVC_LIB_RUNTIME_CODEC_AFFINEBF16_H
#define KVC_LIB_RUNTIME_CODEC_AFFINEBF16_H

#include <cstdint>
#include <cstring>

namespace kvc::codec_detail {

/// bf16 of `x`, round to nearest even (finite inputs), branch-free so loops
/// vectorize.
inline uint16_t toBf16(float x) {
  uint32_t w;
  std::memcpy(&w, &x, 4);
  return uint16_t((w + 0x7FFF + ((w >> 16) & 1)) >> 16);
}

/// Unpacks `count` values of `Bits` bits starting at value index `first`.
template <int Bits>
void unpack(const uint8_t *packed, int64_t first, int64_t count, uint8_t *q) {
  constexpr int perByte = 8 / Bits;
  constexpr uint32_t mask = (1u << Bits) - 1;
  for (int64_t c = 0; c < count; ++c)
    q[c] = (packed[(first + c) / perByte] >> (((first + c) % perByte) * Bits)) &
           mask;
}

/// The scales and minimums of a run of values: one pair per value (K,
/// quantized per channel) or one per `group` consecutive values (V, per
/// token).
struct Affine {
  const float *scale, *minimum;
  int64_t group; // 0: per value.
  int64_t param(int64_t i) const { return group ? i / group : i; }
};

using AffineFn = void (*)(const uint8_t *, int64_t, const Affine &, uint16_t *);

/// The fastest affine kernel this CPU runs: AVX-512, AVX2 or portable.
template <int Bits, bool PerValue> AffineFn affineToBf16();

} // namespace kvc::codec_detail

#endif // KVC_LIB_RUNTIME_CODEC_AFFINEBF16_H
