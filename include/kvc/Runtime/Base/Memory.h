//===- Memory.h - Resident memory of the process ----------------*- C++ -*-===//
//
// The process's resident set from Linux's /proc/self/status, and its peak
// reset through /proc/self/clear_refs, so that one phase (a restore) can be
// measured on its own; the memory available to it from /proc/meminfo.
// Elsewhere every figure reads 0.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_BASE_MEMORY_H
#define KVC_RUNTIME_BASE_MEMORY_H

#include <cstdint>
#include <fstream>
#include <string>

namespace kvc {

/// A `Vm...:` line of /proc/self/status, in bytes.
inline int64_t procStatusBytes(const std::string &key) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind(key + ":", 0) == 0)
      return std::stoll(line.substr(key.size() + 1)) * 1024; // In kB.
  return 0;
}

inline int64_t residentBytes() { return procStatusBytes("VmRSS"); }
inline int64_t peakResidentBytes() { return procStatusBytes("VmHWM"); }

/// Memory the system can give a process without swapping (Linux's
/// MemAvailable, /proc/meminfo), in bytes; 0 where unknown.
inline int64_t availableMemoryBytes() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);)
    if (line.rfind("MemAvailable:", 0) == 0)
      return std::stoll(line.substr(13)) * 1024; // In kB.
  return 0;
}

/// Starts the peak over from the current resident set.
inline void resetPeakResident() {
  std::ofstream("/proc/self/clear_refs") << "5";
}

} // namespace kvc

#endif // KVC_RUNTIME_BASE_MEMORY_H
