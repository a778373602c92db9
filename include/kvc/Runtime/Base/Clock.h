//===- Clock.h - Measured time ---------------------------------*- C++ -*-===//

#ifndef KVC_RUNTIME_BASE_CLOCK_H
#define KVC_RUNTIME_BASE_CLOCK_H

#include <chrono>

namespace kvc {

/// The clock every runtime measurement uses.
using Clock = std::chrono::steady_clock;

/// Seconds from `start` to now.
inline double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

} // namespace kvc

#endif // KVC_RUNTIME_BASE_CLOCK_H
