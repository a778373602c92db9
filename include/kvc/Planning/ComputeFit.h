//===- ComputeFit.h - Compute rates fitted to measured prefills -*- C++ -*-===//
//
// The cost model prices a prefill of m tokens after p through L layers as
//
//   t(p, m) = L * linear * (m + half) / dense + L * attention(p, m) / attn
//
// (linear FLOPs at `dense` FLOP/s scaled by the GEMM efficiency
// m / (m + half), causal attention at its own rate). Calibration times
// prefills on the machine and needs the three rates under which the model
// reproduces them. For a fixed `half` the model is linear in 1 / dense and
// 1 / attn, so the fit scans `half` and solves a 2x2 least-squares problem on
// relative error for each, keeping the best: every sample constrains both
// rates at once, instead of attention coming from one difference of two
// timings and the dense rate from chunk times with that guess subtracted
// (which mispriced a 256-token chunk by 12% on the development VM: a
// 512-token chunk, whose own attention is half its time, was fitted as if
// it had none).
//
//===----------------------------------------------------------------------===//

#ifndef KVC_PLANNING_COMPUTEFIT_H
#define KVC_PLANNING_COMPUTEFIT_H

#include "kvc/Planning/CostModel.h"

#include <vector>

namespace kvc::planning {

/// One timed prefill of `tokens` tokens after the first `position`, through
/// every layer of the model.
struct PrefillSample {
  int64_t position = 0;
  int64_t tokens = 0;
  double seconds = 0;
};

/// Rates under which the cost model prices a set of samples best.
struct ComputeFit {
  double denseFlops = 0;     ///< GEMM FLOP/s at full efficiency.
  double halfTokens = 0;     ///< Chunk size at half of it.
  double attentionFlops = 0; ///< Attention FLOP/s; 0: priced as GEMMs.
  double worstError = 0;     ///< max |fitted / measured - 1| over samples.

  /// Writes the fit into `compute` in the target's units (keeping its
  /// restore_share, which the rates are net of). A CPU's dense rate is
  /// what its gemm_peak_fraction makes of the fit. A GPU's dense_tflops is
  /// its chip's peak: kept, with the fraction raised to what the fit
  /// reached where that is above it (cuBLAS near its peak), and a fit above
  /// the peak itself refused (FailedPrecondition: a timing that cannot be).
  Status applyTo(ComputeDesc &compute) const;
};

/// Fits `samples` (at least two, every one positive) with the FLOP counts of
/// `cost` (its rates are not used). Where the samples cannot separate
/// attention from the GEMMs (a short context, or attention timed as free),
/// attention is priced as GEMMs and `attentionFlops` is 0.
ComputeFit fitComputeRates(const CostModel &cost,
                           const std::vector<PrefillSample> &samples);

} // namespace kvc::planning

#endif // KVC_PLANNING_COMPUTEFIT_H
