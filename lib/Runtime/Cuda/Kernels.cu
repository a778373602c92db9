//===- Kernels.cu - The CUDA backend's own kernels ------------------------===//
//
// Plain CUDA C++, one thread per element (or 16-byte piece) in grid-stride
// loops, except RMSNorm (a block per row) and attention. Attention has two
// kernels: the tiled one (tensor cores, below) for 16-bit models, and an fp32
// one that keeps the CPU model's arithmetic (a block per query row and
// head: four warps walk the keys 32 at a time with an online softmax, each
// lane owning one key of a tile for the scores and head_dim / 32 output
// columns for the values, and merge their partial sums at the end). In
// neither does shared memory grow with the context.
//
// RoPE and the bf16 rounding use round-to-nearest intrinsics, so rotations
// give what the CPU model's (compiled without fused multiply-adds) do.
// Paged caches hold bf16 or f16 (RowLayout::f16): rows are read to fp32
// and rounded back to the cache's type, and a finite value that f16 cannot
// hold is recorded (RowLayout::outOfRange) as the CPU's cache refuses it.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

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

/// A 16-bit float (f16 when `f16`, else bf16) as fp32.
__device__ float widened16(uint16_t bits, bool f16) {
  return f16 ? __half2float(__ushort_as_half(bits)) : bf16Bits(bits);
}
/// An element of `r`'s rows as fp32.
__device__ float load(const RowLayout &r, uint16_t bits) {
  return widened16(bits, r.f16);
}
/// `x` rounded to `r`'s element type (nearest even); a finite value beyond
/// f16's range is recorded in r.outOfRange (it becomes an infinity).
__device__ uint16_t store(const RowLayout &r, float x) {
  if (!r.f16)
    return toBf16Bits(x);
  const __half h = __float2half_rn(x);
  if (__hisinf(h) && isfinite(x) && r.outOfRange)
    *r.outOfRange = 1u; // Any writer's 1 will do.
  return __half_as_ushort(h);
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

/// The same between rows of different element types, element by element.
__global__ void convertRowsKernel(RowLayout from, RowLayout to, int64_t first,
                                  int64_t n) {
  KVC_GRID_STRIDE(i, n * from.kvDim) {
    const int64_t t = first + i / from.kvDim, c = i % from.kvDim;
    const int64_t src = rowOf(from, t) + c, dst = rowOf(to, t) + c;
    to.keys[dst] = store(to, load(from, from.keys[src]));
    to.values[dst] = store(to, load(from, from.values[src]));
  }
}

__global__ void readRowsKernel(RowLayout from, int64_t first, int64_t n,
                               float *k, float *v) {
  KVC_GRID_STRIDE(i, n * from.kvDim) {
    const int64_t t = i / from.kvDim, c = i % from.kvDim;
    const int64_t src = rowOf(from, first + t) + c;
    k[i] = load(from, from.keys[src]);
    v[i] = load(from, from.values[src]);
  }
}

__global__ void widenKernel(const uint16_t *in, bool f16, int64_t n,
                            float *out) {
  KVC_GRID_STRIDE(i, n) { out[i] = widened16(in[i], f16); }
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

__global__ void addBiasKernel(float *rows, int64_t n, int64_t rowStride,
                              const float *bias, int64_t width) {
  KVC_GRID_STRIDE(i, n * width) {
    rows[i / width * rowStride + i % width] += bias[i % width];
  }
}

// A warp per head of a row (kThreads / 32 heads a block).
__global__ void headNormKernel(float *rows, int64_t n, int64_t rowStride,
                               int64_t heads, int64_t headDim,
                               const float *weight, float eps) {
  const int64_t head = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (head >= n * heads)
    return;
  const int lane = threadIdx.x % 32;
  float *x = rows + head / heads * rowStride + head % heads * headDim;
  float sum = 0;
  for (int64_t j = lane; j < headDim; j += 32)
    sum += x[j] * x[j];
  sum = warpSum(sum);
  const float scale = 1.0f / sqrtf(sum / float(headDim) + eps);
  for (int64_t j = lane; j < headDim; j += 32)
    x[j] = (x[j] * scale) * weight[j];
}

__global__ void embedKernel(const int32_t *tokens, int64_t n,
                            const float *table, int64_t h, float *x) {
  KVC_GRID_STRIDE(i, n * h) {
    x[i] = table[int64_t(tokens[i / h]) * h + i % h];
  }
}

__global__ void embedBf16Kernel(const int32_t *tokens, int64_t n,
                                const uint16_t *table, int64_t h, float *x) {
  KVC_GRID_STRIDE(i, n * h) {
    x[i] = bf16Bits(table[int64_t(tokens[i / h]) * h + i % h]);
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
    to.keys[dst] = store(to, a);
    to.keys[dst + half] = store(to, b);
    to.values[dst] = store(to, row[vColumn + j]);
    to.values[dst + half] = store(to, row[vColumn + j + half]);
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
        dot += query[d] * load(cache, cache.keys[row + d]);
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
          acc[c] += weight * load(cache, cache.values[at + d]);
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

// The tiled attention kernel: a block per 64 query rows of one head, four
// warps of 16 rows each. K and V stream through shared memory 64 keys at a
// time (16-byte loads through the block table); S = Q K^T and O += P V run
// on the tensor cores (WMMA, inputs of the cache's type: bf16 or f16, fp32
// accumulators); each warp's
// online softmax works on its rows of S in shared memory, two lanes a row,
// and rescales its rows of O there before the P V product accumulates into
// them. Nothing grows with the context but the number of key tiles; blocks
// of the last query rows, which see the most keys, start first.
namespace tiled {

constexpr int kRows = 64, kKeys = 64, kWarps = 4;
constexpr int kScoreLd = kKeys + 4;  ///< fp32 S rows (bank spread).
constexpr int kWeightLd = kKeys + 8; ///< bf16 P rows.

template <int D> struct Layout {
  static constexpr int kMatrixLd = D + 8; ///< bf16 Q, K, V rows.
  static constexpr int kOutLd = D + 4;    ///< fp32 O rows.
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + size_t(kRows) * kMatrixLd * 2;
  static constexpr size_t kV = kK + size_t(kKeys) * kMatrixLd * 2;
  static constexpr size_t kS = kV + size_t(kKeys) * kMatrixLd * 2;
  static constexpr size_t kP = kS + size_t(kRows) * kScoreLd * 4;
  static constexpr size_t kO = kP + size_t(kRows) * kWeightLd * 2;
  static constexpr size_t kBytes = kO + size_t(kRows) * kOutLd * 4;
};

/// T (the cache's __nv_bfloat16 or __half) from fp32, nearest even, and
/// back.
template <typename T> __device__ T narrowTo(float x);
template <> __device__ __nv_bfloat16 narrowTo(float x) {
  return __float2bfloat16_rn(x);
}
template <> __device__ __half narrowTo(float x) { return __float2half_rn(x); }
__device__ float widened(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ float widened(__half x) { return __half2float(x); }

template <int D, typename T>
__global__ void __launch_bounds__(kWarps * 32)
    attentionKernel(const float *q, int64_t qStride, RowLayout cache,
                    int64_t position, int64_t n, int64_t heads, int64_t kvHeads,
                    void *out, bool bf16Out) {
  using namespace nvcuda;
  using L = Layout<D>;
  extern __shared__ __align__(128) char shared[];
  auto *qs = reinterpret_cast<T *>(shared + L::kQ);
  auto *ks = reinterpret_cast<T *>(shared + L::kK);
  auto *vs = reinterpret_cast<T *>(shared + L::kV);
  auto *ss = reinterpret_cast<float *>(shared + L::kS);
  auto *ps = reinterpret_cast<T *>(shared + L::kP);
  auto *os = reinterpret_cast<float *>(shared + L::kO);
  constexpr int ld = L::kMatrixLd;

  const int64_t q0 = (int64_t(gridDim.x) - 1 - blockIdx.x) * kRows;
  const int64_t head = blockIdx.y, kvHead = head / (heads / kvHeads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // Q (as T) and O = 0; rows past the chunk are zeros.
  for (int i = threadIdx.x; i < kRows * D; i += blockDim.x) {
    const int r = i / D, c = i % D;
    const int64_t t = q0 + r;
    qs[r * ld + c] = narrowTo<T>(t < n ? q[t * qStride + head * D + c] : 0.0f);
    os[r * L::kOutLd + c] = 0.0f;
  }
  __syncthreads();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> qf[D / 16];
  for (int k = 0; k < D / 16; ++k)
    wmma::load_matrix_sync(qf[k], qs + warp * 16 * ld + k * 16, ld);

  // Lanes 2r and 2r+1 own row r of the warp's 16, half of its columns each.
  const int row = warp * 16 + lane / 2, half = lane % 2;
  const int64_t query = q0 + row;
  const int64_t lastKey = query < n ? position + query : -1;
  const float scale = 1.4426950408889634f / sqrtf(float(D)); // log2(e)/sqrt(D)
  float peak = -INFINITY, total = 0.0f;

  const int64_t blockLastKey = position + (q0 + kRows < n ? q0 + kRows : n) - 1;
  for (int64_t k0 = 0; k0 <= blockLastKey; k0 += kKeys) {
    __syncthreads(); // Every warp is done with the previous K and V.
    for (int i = threadIdx.x; i < kKeys * D / 8; i += blockDim.x) {
      const int key = i / (D / 8), c = i % (D / 8) * 8;
      uint4 kPiece = make_uint4(0, 0, 0, 0), vPiece = kPiece;
      if (k0 + key <= blockLastKey) {
        const int64_t at = rowOf(cache, k0 + key) + kvHead * D + c;
        kPiece = *reinterpret_cast<const uint4 *>(cache.keys + at);
        vPiece = *reinterpret_cast<const uint4 *>(cache.values + at);
      }
      *reinterpret_cast<uint4 *>(ks + key * ld + c) = kPiece;
      *reinterpret_cast<uint4 *>(vs + key * ld + c) = vPiece;
    }
    __syncthreads();

    // S = Q K^T for the warp's 16 rows.
    for (int j = 0; j < kKeys / 16; ++j) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> sf;
      wmma::fill_fragment(sf, 0.0f);
      for (int k = 0; k < D / 16; ++k) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> kf;
        wmma::load_matrix_sync(kf, ks + j * 16 * ld + k * 16, ld);
        wmma::mma_sync(sf, qf[k], kf, sf);
      }
      wmma::store_matrix_sync(ss + warp * 16 * kScoreLd + j * 16, sf, kScoreLd,
                              wmma::mem_row_major);
    }
    __syncwarp();

    // The online softmax of the row's 64 scores (in log2 units).
    const float *scores = ss + row * kScoreLd + half * 32;
    float tileMax = -INFINITY;
    for (int c = 0; c < 32; ++c)
      if (k0 + half * 32 + c <= lastKey)
        tileMax = fmaxf(tileMax, scores[c] * scale);
    tileMax = fmaxf(tileMax, __shfl_xor_sync(0xffffffffu, tileMax, 1));
    const float next = fmaxf(peak, tileMax);
    const float correction = next == -INFINITY ? 1.0f : exp2f(peak - next);
    T *weights = ps + row * kWeightLd + half * 32;
    float sum = 0.0f;
    for (int c = 0; c < 32; ++c) {
      const bool valid = k0 + half * 32 + c <= lastKey;
      const T p = narrowTo<T>(valid ? exp2f(scores[c] * scale - next) : 0.0f);
      weights[c] = p;
      sum += widened(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    total = total * correction + sum;
    peak = next;
    float *acc = os + row * L::kOutLd + half * (D / 2);
    for (int c = 0; c < D / 2; ++c)
      acc[c] *= correction;
    __syncwarp();

    // O += P V for the warp's rows.
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>
        pf[kKeys / 16];
    for (int k = 0; k < kKeys / 16; ++k)
      wmma::load_matrix_sync(pf[k], ps + warp * 16 * kWeightLd + k * 16,
                             kWeightLd);
    for (int j = 0; j < D / 16; ++j) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> of;
      float *tile = os + warp * 16 * L::kOutLd + j * 16;
      wmma::load_matrix_sync(of, tile, L::kOutLd, wmma::mem_row_major);
      for (int k = 0; k < kKeys / 16; ++k) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> vf;
        wmma::load_matrix_sync(vf, vs + k * 16 * ld + j * 16, ld);
        wmma::mma_sync(of, pf[k], vf, of);
      }
      wmma::store_matrix_sync(tile, of, L::kOutLd, wmma::mem_row_major);
    }
    __syncwarp();
  }

  if (query < n) {
    const float *acc = os + row * L::kOutLd + half * (D / 2);
    const int64_t at = (query * heads + head) * D + half * (D / 2);
    for (int c = 0; c < D / 2; ++c)
      put(out, at + c, acc[c] / total, bf16Out);
  }
}

template <int D, typename T>
cudaError_t launchAs(const float *q, int64_t qStride, RowLayout cache,
                     int64_t position, int64_t n, int64_t heads,
                     int64_t kvHeads, void *out, bool bf16Out,
                     cudaStream_t stream) {
  const size_t bytes = Layout<D>::kBytes;
  cudaError_t error = cudaFuncSetAttribute(
      attentionKernel<D, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      int(bytes));
  if (error != cudaSuccess)
    return error;
  const dim3 grid(unsigned((n + kRows - 1) / kRows), unsigned(heads));
  attentionKernel<D, T><<<grid, kWarps * 32, bytes, stream>>>(
      q, qStride, cache, position, n, heads, kvHeads, out, bf16Out);
  return cudaGetLastError();
}

/// Over the cache's element type.
template <int D>
cudaError_t launch(const float *q, int64_t qStride, RowLayout cache,
                   int64_t position, int64_t n, int64_t heads, int64_t kvHeads,
                   void *out, bool bf16Out, cudaStream_t stream) {
  return cache.f16
             ? launchAs<D, __half>(q, qStride, cache, position, n, heads,
                                   kvHeads, out, bf16Out, stream)
             : launchAs<D, __nv_bfloat16>(q, qStride, cache, position, n, heads,
                                          kvHeads, out, bf16Out, stream);
}

} // namespace tiled

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
  if (from.f16 != to.f16)
    convertRowsKernel<<<gridFor(n * from.kvDim), kThreads, 0, stream>>>(
        from, to, first, n);
  else if (rowsAligned(from) && rowsAligned(to))
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

cudaError_t addBias(float *rows, int64_t n, int64_t rowStride,
                    const float *bias, int64_t width, cudaStream_t stream) {
  if (n <= 0 || width <= 0)
    return cudaSuccess;
  addBiasKernel<<<gridFor(n * width), kThreads, 0, stream>>>(rows, n, rowStride,
                                                             bias, width);
  return cudaGetLastError();
}

cudaError_t headNorm(float *rows, int64_t n, int64_t rowStride, int64_t heads,
                     int64_t headDim, const float *weight, float eps,
                     cudaStream_t stream) {
  if (n <= 0 || heads <= 0)
    return cudaSuccess;
  constexpr int64_t kHeads = kThreads / 32;
  headNormKernel<<<unsigned((n * heads + kHeads - 1) / kHeads), kThreads, 0,
                   stream>>>(rows, n, rowStride, heads, headDim, weight, eps);
  return cudaGetLastError();
}

cudaError_t embed(const int32_t *tokens, int64_t n, const float *table,
                  int64_t h, float *x, cudaStream_t stream) {
  embedKernel<<<gridFor(n * h), kThreads, 0, stream>>>(tokens, n, table, h, x);
  return cudaGetLastError();
}

cudaError_t embedBf16(const int32_t *tokens, int64_t n, const uint16_t *table,
                      int64_t h, float *x, cudaStream_t stream) {
  embedBf16Kernel<<<gridFor(n * h), kThreads, 0, stream>>>(tokens, n, table, h,
                                                           x);
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
                      bool tensorCores, cudaStream_t stream) {
  if (headDim > kMaxHeadDim || heads % kvHeads != 0)
    return cudaErrorInvalidValue;
  if (n <= 0)
    return cudaSuccess;
  if (tensorCores && rowsAligned(cache)) {
    switch (headDim) {
    case 32:
      return tiled::launch<32>(q, qStride, cache, position, n, heads, kvHeads,
                               out, bf16Out, stream);
    case 64:
      return tiled::launch<64>(q, qStride, cache, position, n, heads, kvHeads,
                               out, bf16Out, stream);
    case 128:
      return tiled::launch<128>(q, qStride, cache, position, n, heads, kvHeads,
                                out, bf16Out, stream);
    default:
      break;
    }
  }
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
