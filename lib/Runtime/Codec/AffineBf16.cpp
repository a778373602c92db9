//===- AffineBf16.cpp - Dequantizing codes to bf16 on the CPU -------------===//

#include "AffineBf16.h"

#include <algorithm>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvc::codec_detail {

namespace {

/// out[i] = bf16(minimum + scale * q[i]) for i in [from, to), q[i] being the
/// i-th value of `Bits` bits packed low bits first from `packed`.
template <int Bits>
void affineToBf16Range(const uint8_t *packed, int64_t from, int64_t to,
                       const Affine &p, uint16_t *out) {
  uint8_t q[16];
  for (int64_t i = from; i < to; i += 16) {
    int64_t count = std::min<int64_t>(16, to - i);
    unpack<Bits>(packed, i, count, q);
    for (int64_t c = 0; c < count; ++c) {
      int64_t k = p.param(i + c);
      out[i + c] = toBf16(p.minimum[k] + p.scale[k] * float(q[c]));
    }
  }
}

/// The same over [0, n): the kernel where the CPU lacks AVX2 and FMA.
template <int Bits, bool PerValue>
void affineToBf16Portable(const uint8_t *packed, int64_t n, const Affine &p,
                          uint16_t *out) {
  affineToBf16Range<Bits>(packed, 0, n, p, out);
}

#if defined(__x86_64__)
/// The 16 values of `Bits` bits that start at `packed`, one per byte, in
/// order (SSE2, always present).
template <int Bits> inline __m128i load16(const uint8_t *packed) {
  if constexpr (Bits == 8)
    return _mm_loadu_si128(reinterpret_cast<const __m128i *>(packed));
  if constexpr (Bits == 4) {
    __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(packed));
    const __m128i low = _mm_set1_epi8(0x0F);
    return _mm_unpacklo_epi8(_mm_and_si128(v, low),
                             _mm_and_si128(_mm_srli_epi16(v, 4), low));
  }
  // Bits == 2: value k of byte j sits at bits 2k..2k+1.
  uint32_t word;
  std::memcpy(&word, packed, 4);
  __m128i v = _mm_cvtsi32_si128(int(word));
  const __m128i low = _mm_set1_epi8(0x03);
  __m128i v0 = _mm_and_si128(v, low);
  __m128i v1 = _mm_and_si128(_mm_srli_epi16(v, 2), low);
  __m128i v2 = _mm_and_si128(_mm_srli_epi16(v, 4), low);
  __m128i v3 = _mm_and_si128(_mm_srli_epi16(v, 6), low);
  return _mm_unpacklo_epi16(_mm_unpacklo_epi8(v0, v1),
                            _mm_unpacklo_epi8(v2, v3));
}

/// The vector kernels walk the run a group at a time (the whole run when
/// parameters are per value), 16 values per step, and leave each group's
/// last few values to the portable loop. Values must start on a byte, and so
/// must every group.

/// bf16 bits of 8 floats, round to nearest even, in 32-bit lanes.
__attribute__((target("avx2,fma"))) inline __m256i roundToBf16(__m256 x) {
  __m256i w = _mm256_castps_si256(x);
  __m256i lsb =
      _mm256_and_si256(_mm256_srli_epi32(w, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(
      _mm256_add_epi32(w, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)),
      16);
}

template <int Bits, bool PerValue>
__attribute__((target("avx2,fma"))) void
affineToBf16Avx2(const uint8_t *packed, int64_t n, const Affine &p,
                 uint16_t *out) {
  const int64_t group = PerValue ? n : p.group;
  for (int64_t g0 = 0, k = 0; g0 < n; g0 += group, ++k) {
    const int64_t end = std::min(n, g0 + group);
    const __m256 scale = _mm256_set1_ps(p.scale[k]),
                 minimum = _mm256_set1_ps(p.minimum[k]);
    int64_t i = g0;
    for (; i + 16 <= end; i += 16) {
      __m128i bytes = load16<Bits>(packed + i * Bits / 8);
      __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
      __m256 hi =
          _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)));
      if (PerValue) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(p.scale + i), lo,
                             _mm256_loadu_ps(p.minimum + i));
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(p.scale + i + 8), hi,
                             _mm256_loadu_ps(p.minimum + i + 8));
      } else {
        lo = _mm256_fmadd_ps(scale, lo, minimum);
        hi = _mm256_fmadd_ps(scale, hi, minimum);
      }
      // Pack two halves of 8 x 32 bits into 16 x 16 bits, in order.
      __m256i bf16 = _mm256_packus_epi32(roundToBf16(lo), roundToBf16(hi));
      bf16 = _mm256_permute4x64_epi64(bf16, 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + i), bf16);
    }
    affineToBf16Range<Bits>(packed, i, end, p, out);
  }
}

bool hasAvx2() {
  static const bool yes =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized in their own code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
/// The same with 16 lanes.
template <int Bits, bool PerValue>
__attribute__((target("avx512f"))) void
affineToBf16Avx512(const uint8_t *packed, int64_t n, const Affine &p,
                   uint16_t *out) {
  const __m512i bias = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1);
  const int64_t group = PerValue ? n : p.group;
  for (int64_t g0 = 0, k = 0; g0 < n; g0 += group, ++k) {
    const int64_t end = std::min(n, g0 + group);
    const __m512 scale = _mm512_set1_ps(p.scale[k]),
                 minimum = _mm512_set1_ps(p.minimum[k]);
    int64_t i = g0;
    for (; i + 16 <= end; i += 16) {
      __m512 x = _mm512_cvtepi32_ps(
          _mm512_cvtepu8_epi32(load16<Bits>(packed + i * Bits / 8)));
      x = PerValue ? _mm512_fmadd_ps(_mm512_loadu_ps(p.scale + i), x,
                                     _mm512_loadu_ps(p.minimum + i))
                   : _mm512_fmadd_ps(scale, x, minimum);
      __m512i w = _mm512_castps_si512(x);
      __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(w, 16), one);
      __m512i bf16 = _mm512_srli_epi32(
          _mm512_add_epi32(w, _mm512_add_epi32(bias, lsb)), 16);
      _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + i),
                          _mm512_cvtepi32_epi16(bf16));
    }
    affineToBf16Range<Bits>(packed, i, end, p, out);
  }
}

#pragma GCC diagnostic pop

bool hasAvx512() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}
#endif

} // namespace

/// The best affine kernel for this CPU, chosen once.
template <int Bits, bool PerValue> AffineFn affineToBf16() {
#if defined(__x86_64__)
  if (hasAvx512())
    return affineToBf16Avx512<Bits, PerValue>;
  if (hasAvx2())
    return affineToBf16Avx2<Bits, PerValue>;
#endif
  return affineToBf16Portable<Bits, PerValue>;
}

template AffineFn affineToBf16<2, false>();
template AffineFn affineToBf16<2, true>();
template AffineFn affineToBf16<4, false>();
template AffineFn affineToBf16<4, true>();
template AffineFn affineToBf16<8, false>();
template AffineFn affineToBf16<8, true>();

} // namespace kvc::codec_detail
