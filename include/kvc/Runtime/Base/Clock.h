//===- Clock.h - Measured time ---------------------------------*- C++ -*-===//

#ifndef KVC_RUNTIME_BASE_CLOCK_H
#define KVC_RUNTIME_BASE_CLOCK_H

#include <algorithm>
#include <chrono>
#include <vector>

namespace kvc {

/// The clock every runtime measurement uses.
using Clock = std::chrono::steady_clock;

/// Seconds from `start` to now.
inline double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// Seconds per call of `fn`, over enough calls to take ~50 ms.
template <typename Fn> double timeIt(Fn fn) {
  int calls = 0;
  Clock::time_point start = Clock::now();
  double elapsed = 0;
  do {
    fn();
    ++calls;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < 0.05);
  return elapsed / calls;
}

/// The fastest of `repeats` runs of `fn`, in seconds (for calls too long to
/// repeat for 50 ms).
template <typename Fn> double bestOf(int repeats, Fn fn) {
  double best = 1e300;
  for (int i = 0; i < repeats; ++i) {
    Clock::time_point start = Clock::now();
    fn();
    best = std::min(
        best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

/// Keeps the calling thread busy (not asleep) for `seconds`: work whose
/// length is known, in measurements of what runs around it.
inline void spinFor(double seconds) {
  Clock::time_point start = Clock::now();
  while (secondsSince(start) < seconds) {
  }
}

/// The median of `values` (the upper of the middle two of an even count).
inline double median(std::vector<double> values) {
  auto middle = values.begin() + values.size() / 2;
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

} // namespace kvc

#endif // KVC_RUNTIME_BASE_CLOCK_H
