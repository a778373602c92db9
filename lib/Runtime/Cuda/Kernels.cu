//===- Kernels.cu - The CUDA backend's own kernels ------------------------===//
//
// Plain CUDA C++, one thread per element (or 16-byte piece) in grid-stride
// loops, except RMSNorm (a block per row) and attention (a block per query
// row and head: four warps walk the keys 32 at a time with an online
// softmax, each lane owning one key of a tile for the scores and
// head_dim / 32 output columns for the values, and merge their partial sums
// at the end, so shared memory does not grow with the context).
//
// RoPE and the bf16 rounding use round-to-nearest intrinsics, so rotations
// give what the CPU model's (compiled without fused multiply-adds) do.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace kvc::cuda {

namespace {

constexpr int kThreads = 256;

/// Blocks for `work` grid-stride iterations.
unsigned gridFor(int64_t work) {
  return unsigned(
      std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, 65535));
}

__device__ int64_t rowOf(const RowLayout &r, int64_t t) {
  return r.blocks ? int64_t(r.blocks[t / r.blockSize]) * r.stride +
                        t % r.blockSize * r.kvDim
                  : (t - r.origin) * r.kvDim;
}

__device__ float bf16Bits(uint16_t bits) {
  return __bfloat162float(__ushort_as_bfloat16(bits));
}
__device__ uint16_t toBf16Bits(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

__device__ void put(void *out, int64_t i, float x, bool bf16) {
  if (bf16)
    static_cast<uint16_t *>(out)[i] = toBf16Bits(x);
  else
    static_cast<float *>(out)[i] = x;
}

/// The sum and the largest of a value over a warp, in every lane.
__device__ float warpSum(float x) {
  for (int offset = 16; offset > 0; offset /= 2)
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
__device__ float warpMax(float x) {
  for (int offset = 16; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

#define KVC_GRID_STRIDE(i, total)                                              \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;             \
       i < (total); i += int64_t(gridDim.x) * blockDim.x)

/// W elements per access: 8 (16 bytes) where every row allows it, else 1.
template <int W>
__global__ void copyRowsKernel(RowLayout from, RowLayout to, int64_t first,
                               int64_t n) {
  using Piece = std::conditional_t<W == 8, uint4, uint16_t>;
  const int64_t perRow = from.kvDim / W;
  KVC_GRID_STRIDE(i, n * perRow) {
    const int64_t t = first + i / perRow, c = i % perRow * W;
    const int64_t src = rowOf(from, t) + c, dst = rowOf(to, t) + c;
    *reinterpret_cast<Piece *>(to.keys + dst) =
        *reinterpret_cast<const Piece *>(from.keys + src);
    *reinterpret_cast<Piece *>(to.values + dst) =
        *reinterpret_cast<const Piece *>(from.values + src);
  }
}

__global__ void readRowsKernel(RowLayout from, int64_t first, int64_t n,
                               float *k, float *v) {
  KVC_GRID_STRIDE(i, n * from.kvDim) {
    const int64_t t = i / from.kvDim, c = i % from.kvDim;
    const int64_t src = rowOf(from, first + t) + c;
    k[i] = bf16Bits(from.keys[src]);
    v[i] = bf16Bits(from.values[src]);
  }
}

__global__ void widenKernel(const uint16_t *in, bool f16, int64_t n,
                            float *out) {
  KVC_GRID_STRIDE(i, n) {
    out[i] = f16 ? __half2float(__ushort_as_half(in[i])) : bf16Bits(in[i]);
  }
}

__global__ void narrowKernel(const float *in, int64_t n, uint16_t *out) {
  KVC_GRID_STRIDE(i, n) { out[i] = toBf16Bits(in[i]); }
}

__global__ void rmsNormKernel(const float *x, const float *weight, int64_t h,
                              float eps, void *out, bool bf16Out) {
  __shared__ float partial[kThreads / 32];
  const float *row = x + int64_t(blockIdx.x) * h;
  float sum = 0;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x)
    sum += row[j] * row[j];
  sum = warpSum(sum);
  if (threadIdx.x % 32 == 0)
    partial[threadIdx.x / 32] = sum;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < int(blockDim.x / 32); ++w)
    total += partial[w];
  const float scale = 1.0f / sqrtf(total / float(h) + eps);
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x)
    put(out, int64_t(blockIdx.x) * h + j, (row[j] * scale) * weight[j],
        bf16Out);
}

__global__ void embedKernel(const int32_t *tokens, int64_t n,
                            const float *table, int64_t h, float *x) {
  KVC_GRID_STRIDE(i, n * h) {
    x[i] = table[int64_t(tokens[i / h]) * h + i % h];
  }
}

/// a * c - b * s and b * c + a * s, each product rounded on its own.
__device__ void rotate(float &a, float &b, float c, float s) {
  const float x = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  const float y = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  a = x;
  b = y;
}

__global__ void ropeKernel(float *x, int64_t n, int64_t rowStride,
                           int64_t heads, int64_t headDim,
                           const float *cosSin) {
  const int64_t half = headDim / 2;
  KVC_GRID_STRIDE(i, n * heads * half) {
    const int64_t t = i / (heads * half), hd = i / half % heads, j = i % half;
    const float *table = cosSin + t * headDim;
    float *head = x + t * rowStride + hd * headDim;
    rotate(head[j], head[j + half], table[j], table[half + j]);
  }
}

__global__ void storeKVKernel(const float *y, int64_t n, int64_t rowStride,
                              int64_t kColumn, int64_t vColumn, int64_t kvHeads,
                              int64_t headDim, const float *cosSin,
                              RowLayout to, int64_t first) {
  const int64_t half = headDim / 2;
  KVC_GRID_STRIDE(i, n * kvHeads * half) {
    const int64_t t = i / (kvHeads * half), hd = i / half % kvHeads,
                  j = i % half;
    const float *table = cosSin + t * headDim;
    const float *row = y + t * rowStride + hd * headDim;
    float a = row[kColumn + j], b = row[kColumn + j + half];
    rotate(a, b, table[j], table[half + j]);
    const int64_t dst = rowOf(to, first + t) + hd * headDim + j;
    to.keys[dst] = toBf16Bits(a);
    to.keys[dst + half] = toBf16Bits(b);
    to.values[dst] = toBf16Bits(row[vColumn + j]);
    to.values[dst + half] = toBf16Bits(row[vColumn + j + half]);
  }
}

constexpr int kAttentionWarps = 4;
constexpr int kMaxHeadDim = 256;

__global__ void attentionKernel(const float *q, int64_t qStride,
                                RowLayout cache, int64_t position,
                                int64_t heads, int64_t kvHeads, int64_t headDim,
                                void *out, bool bf16Out) {
  __shared__ float query[kMaxHeadDim];
  __shared__ float partMax[kAttentionWarps], partSum[kAttentionWarps];
  __shared__ float warpAcc[kAttentionWarps][kMaxHeadDim];
  const int64_t t = blockIdx.x, head = blockIdx.y;
  const int64_t kvHead = head / (heads / kvHeads);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const float scale = 1.0f / sqrtf(float(headDim));
  for (int64_t d = threadIdx.x; d < headDim; d += blockDim.x)
    query[d] = q[t * qStride + head * headDim + d];
  __syncthreads();

  const int64_t keys = position + t + 1;
  const int columns = int((headDim + 31) / 32);
  float max = -INFINITY, sum = 0, acc[kMaxHeadDim / 32] = {};
  for (int64_t tile = warp; tile * 32 < keys; tile += kAttentionWarps) {
    const int64_t key = tile * 32 + lane;
    const bool valid = key < keys;
    const int64_t row = (valid ? rowOf(cache, key) : 0) + kvHead * headDim;
    float score = -INFINITY;
    if (valid) {
      float dot = 0;
      for (int64_t d = 0; d < headDim; ++d)
        dot += query[d] * bf16Bits(cache.keys[row + d]);
      score = dot * scale;
    }
    const float peak = fmaxf(warpMax(score), max);
    const float correction = max == -INFINITY ? 0.0f : expf(max - peak);
    const float p = valid ? expf(score - peak) : 0.0f;
    sum = sum * correction + warpSum(p);
    for (int c = 0; c < columns; ++c)
      acc[c] *= correction;
    for (int j = 0; j < 32 && tile * 32 + j < keys; ++j) {
      const float weight = __shfl_sync(0xffffffffu, p, j);
      const int64_t at = __shfl_sync(0xffffffffu, row, j);
      for (int c = 0; c < columns; ++c) {
        const int64_t d = lane + 32 * c;
        if (d < headDim)
          acc[c] += weight * bf16Bits(cache.values[at + d]);
      }
    }
    max = peak;
  }
  for (int c = 0; c < columns; ++c)
    if (lane + 32 * c < headDim)
      warpAcc[warp][lane + 32 * c] = acc[c];
  if (lane == 0) {
    partMax[warp] = max;
    partSum[warp] = sum;
  }
  __syncthreads();
  float peak = -INFINITY;
  for (int w = 0; w < kAttentionWarps; ++w)
    peak = fmaxf(peak, partMax[w]);
  for (int64_t d = threadIdx.x; d < headDim; d += blockDim.x) {
    float num = 0, den = 0;
    for (int w = 0; w < kAttentionWarps; ++w) {
      if (partMax[w] == -INFINITY)
        continue;
      const float factor = expf(partMax[w] - peak);
      num += warpAcc[w][d] * factor;
      den += partSum[w] * factor;
    }
    put(out, (t * heads + head) * headDim + d, num / den, bf16Out);
  }
}

__global__ void swigluKernel(const float *gateUp, int64_t n, int64_t f,
                             void *out, bool bf16Out) {
  KVC_GRID_STRIDE(i, n * f) {
    const int64_t t = i / f, j = i % f;
    const float g = gateUp[t * 2 * f + j], u = gateUp[t * 2 * f + f + j];
    put(out, i, g / (1.0f + expf(-g)) * u, bf16Out);
  }
}

bool aligned16(const void *p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

/// Whether every row of `r` starts 16-byte aligned.
bool rowsAligned(const RowLayout &r) {
  return r.kvDim % 8 == 0 && (!r.blocks || r.stride % 8 == 0) &&
         aligned16(r.keys) && aligned16(r.values);
}

} // namespace

cudaError_t copyRows(RowLayout from, RowLayout to, int64_t first, int64_t n,
                     cudaStream_t stream) {
  if (n <= 0)
    return cudaSuccess;
  if (rowsAligned(from) && rowsAligned(to))
    copyRowsKernel<8><<<gridFor(n * from.kvDim / 8), kThreads, 0, stream>>>(
        from, to, first, n);
  else
    copyRowsKernel<1>
        <<<gridFor(n * from.kvDim), kThreads, 0, stream>>>(from, to, first, n);
  return cudaGetLastError();
}

cudaError_t readRows(RowLayout from, int64_t first, int64_t n, float *k,
                     float *v, cudaStream_t stream) {
  if (n <= 0)
    return cudaSuccess;
  readRowsKernel<<<gridFor(n * from.kvDim), kThreads, 0, stream>>>(from, first,
                                                                   n, k, v);
  return cudaGetLastError();
}

cudaError_t widen(const uint16_t *in, bool f16, int64_t n, float *out,
                  cudaStream_t stream) {
  widenKernel<<<gridFor(n), kThreads, 0, stream>>>(in, f16, n, out);
  return cudaGetLastError();
}

cudaError_t narrow(const float *in, int64_t n, uint16_t *out,
                   cudaStream_t stream) {
  narrowKernel<<<gridFor(n), kThreads, 0, stream>>>(in, n, out);
  return cudaGetLastError();
}

cudaError_t rmsNorm(const float *x, const float *weight, int64_t n, int64_t h,
                    float eps, void *out, bool bf16Out, cudaStream_t stream) {
  if (n <= 0)
    return cudaSuccess;
  rmsNormKernel<<<unsigned(n), kThreads, 0, stream>>>(x, weight, h, eps, out,
                                                      bf16Out);
  return cudaGetLastError();
}

cudaError_t embed(const int32_t *tokens, int64_t n, const float *table,
                  int64_t h, float *x, cudaStream_t stream) {
  embedKernel<<<gridFor(n * h), kThreads, 0, stream>>>(tokens, n, table, h, x);
  return cudaGetLastError();
}

cudaError_t rope(float *x, int64_t n, int64_t rowStride, int64_t heads,
                 int64_t headDim, const float *cosSin, cudaStream_t stream) {
  ropeKernel<<<gridFor(n * heads * headDim / 2), kThreads, 0, stream>>>(
      x, n, rowStride, heads, headDim, cosSin);
  return cudaGetLastError();
}

cudaError_t storeKV(const float *y, int64_t n, int64_t rowStride,
                    int64_t kColumn, int64_t vColumn, int64_t kvHeads,
                    int64_t headDim, const float *cosSin, RowLayout to,
                    int64_t first, cudaStream_t stream) {
  storeKVKernel<<<gridFor(n * kvHeads * headDim / 2), kThreads, 0, stream>>>(
      y, n, rowStride, kColumn, vColumn, kvHeads, headDim, cosSin, to, first);
  return cudaGetLastError();
}

cudaError_t attention(const float *q, int64_t qStride, RowLayout cache,
                      int64_t position, int64_t n, int64_t heads,
                      int64_t kvHeads, int64_t headDim, void *out, bool bf16Out,
                      cudaStream_t stream) {
  if (headDim > kMaxHeadDim || heads % kvHeads != 0)
    return cudaErrorInvalidValue;
  if (n <= 0)
    return cudaSuccess;
  attentionKernel<<<dim3(unsigned(n), unsigned(heads)), 32 * kAttentionWarps, 0,
                    stream>>>(q, qStride, cache, position, heads, kvHeads,
                              headDim, out, bf16Out);
  return cudaGetLastError();
}

cudaError_t swiglu(const float *gateUp, int64_t n, int64_t f, void *out,
                   bool bf16Out, cudaStream_t stream) {
  swigluKernel<<<gridFor(n * f), kThreads, 0, stream>>>(gateUp, n, f, out,
                                                        bf16Out);
  return cudaGetLastError();
}

} // namespace kvc::cuda
