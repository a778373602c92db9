//===- Kernels.h - The CUDA backend's own kernels ---------------*- C++ -*-===//
//
// CUDA C++ kernels the backend runs where the compiler generates none (they
// stand in until it does): the steps of a Llama prefill around cuBLAS's
// GEMMs, causal attention over the paged cache, and row copies between
// paged caches and contiguous buffers. Each launcher enqueues on `stream`
// and returns the launch's error; none synchronizes.
//
// Rows of a paged cache are addressed as the runtime's PagedKVCache does:
// token t of a request lies at blocks[t / blockSize] * stride +
// t % blockSize * kvDim elements into a layer's key (value) cache. A
// RowLayout without blocks is a contiguous [tokens][kvDim] buffer whose
// first row holds token `origin`.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_LIB_RUNTIME_CUDA_KERNELS_H
#define KVC_LIB_RUNTIME_CUDA_KERNELS_H

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvc::cuda {

/// Where K and V rows live: a layer of a paged cache (blocks on the device)
/// or contiguous buffers (blocks null), and their element type.
struct RowLayout {
  uint16_t *keys = nullptr;
  uint16_t *values = nullptr;
  const int32_t *blocks = nullptr;
  int64_t blockSize = 0;
  int64_t stride = 0;
  int64_t kvDim = 0;
  int64_t origin = 0; ///< The token of a contiguous buffer's first row.
  /// f16 elements (a server's fp16 cache); else bf16.
  bool f16 = false;
  /// Set (to nonzero) by a kernel that rounds a finite value to f16's
  /// infinity writing these rows (host-mapped memory; null: not recorded).
  unsigned *outOfRange = nullptr;
};

/// Rows first.. first+n of `from` into the same rows of `to`, converted
/// when their element types differ.
cudaError_t copyRows(RowLayout from, RowLayout to, int64_t first, int64_t n,
                     cudaStream_t stream);
/// Rows first.. first+n of `from` as fp32 ([n][kvDim] each).
cudaError_t readRows(RowLayout from, int64_t first, int64_t n, float *k,
                     float *v, cudaStream_t stream);

/// `n` elements of bf16 (or f16 when `f16`) as fp32.
cudaError_t widen(const uint16_t *in, bool f16, int64_t n, float *out,
                  cudaStream_t stream);
/// `n` fp32 elements rounded to bf16 (nearest even).
cudaError_t narrow(const float *in, int64_t n, uint16_t *out,
                   cudaStream_t stream);

/// out = x / rms(x) * weight per row of `h`, fp32 in, fp32 or bf16 out.
cudaError_t rmsNorm(const float *x, const float *weight, int64_t n, int64_t h,
                    float eps, void *out, bool bf16Out, cudaStream_t stream);

/// rows[t * rowStride + j] += bias[j] for j < width and every t < n (a
/// projection's bias: Qwen2's q, k and v, `attention_bias`'s output).
cudaError_t addBias(float *rows, int64_t n, int64_t rowStride,
                    const float *bias, int64_t width, cudaStream_t stream);

/// RMSNorm in place over each of `heads` heads of `headDim` values in each
/// of `n` rows (`rowStride` floats apart, the heads from their start), with
/// one weight for every head (Qwen3's q_norm and k_norm): x / rms(x) *
/// weight, fp32.
cudaError_t headNorm(float *rows, int64_t n, int64_t rowStride, int64_t heads,
                     int64_t headDim, const float *weight, float eps,
                     cudaStream_t stream);

/// The token embedding rows of `tokens` ([n], device) into x ([n][h]).
cudaError_t embed(const int32_t *tokens, int64_t n, const float *table,
                  int64_t h, float *x, cudaStream_t stream);
/// The same from a bf16 table (a server's), widened to fp32.
cudaError_t embedBf16(const int32_t *tokens, int64_t n, const uint16_t *table,
                      int64_t h, float *x, cudaStream_t stream);

/// RoPE in place on `heads` heads of each of `n` rows (`rowStride` floats
/// apart, the heads at their start), with the rows of the model's
/// cos/sin table ([n][headDim]: cos then sin).
cudaError_t rope(float *x, int64_t n, int64_t rowStride, int64_t heads,
                 int64_t headDim, const float *cosSin, cudaStream_t stream);

/// K and V out of a projection's rows ([n][rowStride], K at column kColumn,
/// V at vColumn): RoPE on K, both rounded to `to`'s type, written to rows
/// first.. first+n of `to`.
cudaError_t storeKV(const float *y, int64_t n, int64_t rowStride,
                    int64_t kColumn, int64_t vColumn, int64_t kvHeads,
                    int64_t headDim, const float *cosSin, RowLayout to,
                    int64_t first, cudaStream_t stream);

/// Causal grouped-query attention of `n` queries at positions position..
/// (rows of `q`, `qStride` floats apart) over rows [0, position + i] of
/// `cache`: out ([n][heads * headDim]) fp32, or bf16 when `bf16Out`.
/// With `tensorCores`, for head_dim 32, 64 or 128 and 16-byte aligned rows,
/// a FlashAttention-style kernel tiled over 64 queries x 64 keys: Q and
/// the softmax weights rounded to the cache's type, scores and sums fp32.
/// Otherwise fp32 throughout, as the CPU model computes it.
cudaError_t attention(const float *q, int64_t qStride, RowLayout cache,
                      int64_t position, int64_t n, int64_t heads,
                      int64_t kvHeads, int64_t headDim, void *out, bool bf16Out,
                      bool tensorCores, cudaStream_t stream);

/// out = silu(gate) * up for rows of [gate | up] ([n][2f]), fp32 or bf16.
cudaError_t swiglu(const float *gateUp, int64_t n, int64_t f, void *out,
                   bool bf16Out, cudaStream_t stream);

} // namespace kvc::cuda

#endif // KVC_LIB_RUNTIME_CUDA_KERNELS_H
