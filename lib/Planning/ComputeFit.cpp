//===- ComputeFit.cpp - Compute rates fitted to measured prefills ---------===//

#include "kvc/Planning/ComputeFit.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace kvc::planning {

Status ComputeFit::applyTo(ComputeDesc &compute) const {
  // What the GEMMs reached with the whole device, in TFLOP/s.
  const double reached = denseFlops / (1e12 * compute.restoreShare);
  const double peak = compute.denseTflops;
  if (compute.kind == ComputeDesc::Kind::GPU && peak > 0) {
    if (reached > peak * 1.02) {
      char message[256];
      std::snprintf(message, sizeof(message),
                    "calibration: the prefills fit GEMMs at %.0f TFLOP/s, "
                    "above the device's peak of %.0f (compute.dense_tflops): "
                    "a timing that cannot be; nothing written",
                    reached, peak);
      return failedPrecondition(message);
    }
    compute.gemmPeakFraction =
        std::max(compute.gemmPeakFraction, std::min(1.0, reached / peak));
  }
  compute.denseTflops = reached / compute.gemmPeakFraction;
  compute.gemmHalfTokens = halfTokens;
  compute.attentionTflops =
      attentionFlops > 0 ? attentionFlops / (1e12 * compute.restoreShare) : 0;
  return Status::ok();
}

ComputeFit fitComputeRates(const CostModel &cost,
                           const std::vector<PrefillSample> &samples) {
  const double layers = double(cost.model().numLayers);
  const double linear = cost.linearFlopsPerTokenLayer();
  int64_t largest = 1;
  for (const PrefillSample &s : samples)
    largest = std::max(largest, s.tokens);

  ComputeFit best;
  double bestResidual = std::numeric_limits<double>::infinity();
  // Relative error of pricing sample i at a * x + b * y seconds.
  auto consider = [&](double half, double x, double y, auto terms) {
    double residual = 0, worst = 0;
    for (const PrefillSample &s : samples) {
      auto [a, b] = terms(s);
      double error = (a * x + b * y) / s.seconds - 1;
      residual += error * error;
      worst = std::max(worst, std::abs(error));
    }
    if (residual < bestResidual) {
      bestResidual = residual;
      best = {1 / x, half, y > 0 ? 1 / y : 0, worst};
    }
  };
  // The half-efficiency size is the one nonlinear parameter: scan it in
  // whole tokens up to twice the largest chunk (efficiency is then flat
  // over the samples).
  for (double half = 0; half <= 2.0 * double(largest); half += 1) {
    // Separate rates: a = linear FLOPs / efficiency, b = attention FLOPs.
    auto separate = [&](const PrefillSample &s) {
      double m = double(s.tokens);
      return std::pair(
          layers * linear * (m + half),
          layers * cost.attentionFlops(s.position, s.position + s.tokens));
    };
    // Normal equations of min sum (a/t x + b/t y - 1)^2.
    double aa = 0, ab = 0, bb = 0, a1 = 0, b1 = 0;
    for (const PrefillSample &s : samples) {
      auto [a, b] = separate(s);
      a /= s.seconds, b /= s.seconds;
      aa += a * a, ab += a * b, bb += b * b, a1 += a, b1 += b;
    }
    double det = aa * bb - ab * ab;
    if (det > 1e-12 * aa * bb) {
      double x = (a1 * bb - b1 * ab) / det, y = (aa * b1 - ab * a1) / det;
      if (x > 0 && y > 0)
        consider(half, x, y, separate);
    }
    // Attention priced as GEMMs: every FLOP at the dense rate.
    auto together = [&](const PrefillSample &s) {
      double m = double(s.tokens);
      double flops = cost.prefillFlops(s.position, s.position + s.tokens,
                                       cost.model().numLayers);
      return std::pair(flops * (m + half) / m, 0.0);
    };
    double cc = 0, c1 = 0;
    for (const PrefillSample &s : samples) {
      double c = together(s).first / s.seconds;
      cc += c * c, c1 += c;
    }
    if (c1 > 0)
      consider(half, c1 / cc, 0.0, together);
  }
  return best;
}

} // namespace kvc::planning
