//===- Tolerance.h - How tests compare floating-point tensors ---*- C++ -*-===//
//
// What kvc guarantees about its numbers is relative to the magnitude of the
// tensor, row or head a value belongs to (as restoreError and the verifier
// state it), never per element: two GEMMs that sum in another order (another
// OpenBLAS kernel, another chunking) move a value near zero by as much as
// they move the largest one. Tests therefore compare a whole span: the
// largest |got - want| over it against the largest |want| over it.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_UNITTESTS_RUNTIME_TOLERANCE_H
#define KVC_UNITTESTS_RUNTIME_TOLERANCE_H

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace kvc::test {

/// The largest |got[i] - want[i]| over `n` values, relative to the largest
/// |want[i]|. A span of zeros compares absolutely; a non-finite value on
/// either side is an infinite error (no comparison with NaN hides it).
inline double relativeMaxError(const float *got, const float *want, size_t n) {
  double error = 0, peak = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i]))
      return std::numeric_limits<double>::infinity();
    error = std::max(error, double(std::fabs(got[i] - want[i])));
    peak = std::max(peak, double(std::fabs(want[i])));
  }
  return peak > 0 ? error / peak : error;
}

/// The same over two whole tensors; tensors of different sizes are an
/// infinite error.
inline double relativeMaxError(const std::vector<float> &got,
                               const std::vector<float> &want) {
  if (got.size() != want.size())
    return std::numeric_limits<double>::infinity();
  return relativeMaxError(got.data(), want.data(), got.size());
}

/// One step of bf16 (7 stored mantissa bits) relative to the largest value
/// of a span: the most two computations of one value that round to bf16
/// from slightly different fp32 sums can differ by.
constexpr double kOneBf16Step = 1.0 / 128;

} // namespace kvc::test

#endif // KVC_UNITTESTS_RUNTIME_TOLERANCE_H
