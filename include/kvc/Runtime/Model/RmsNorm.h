//===- RmsNorm.h - RMSNorm in one summation order ---------------*- C++ -*-===//
//
// RMSNorm as the model and the generated prologue kernel (KernelGen.h)
// compute it, in f32 (as Hugging Face's LlamaRMSNorm) and in one order, so
// both write the same bits whatever the machine:
//
//   a row of h values is read as P = ceil(h / 8) pieces of 8 (past h: 0);
//   L = the largest power of two <= min(32, P) lanes; lane l accumulates
//   the squares of pieces l, l + L, l + 2L, ... elementwise in 8 partial
//   sums (x * x rounded, then added; no fused multiply-add);
//   a lane's total: s_j = a_j + a_(j+4), then t_j = s_j + s_(j+2), then
//   t_0 + t_1;
//   the lanes' totals pairwise, adjacent pairs first (a warp's butterfly);
//   scale = 1 / sqrt(total / h + eps); out_j = (x_j * scale) * weight_j.
//
// On a GPU a row is L consecutive lanes of a warp; on a CPU the 8-wide
// partial sums vectorize.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_MODEL_RMSNORM_H
#define KVC_RUNTIME_MODEL_RMSNORM_H

#include <cstdint>

namespace kvc {

/// The lanes a row of `h` values is summed over.
int64_t rmsNormLanes(int64_t h);

/// Normalizes `n` rows of `h` values of `x` into `out` (which may be `x`),
/// each multiplied by `weight` (h values).
void rmsNorm(const float *x, int64_t n, int64_t h, float eps,
             const float *weight, float *out);

} // namespace kvc

#endif // KVC_RUNTIME_MODEL_RMSNORM_H
