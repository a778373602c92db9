//===- KernelChips.h - The GPU architectures kvc generates for --*- C++ -*-===//
//
// One list, shared by the target description (a GPU target's chip), the
// dialect's verifier and the plan bundle's kernel table.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_SUPPORT_KERNELCHIPS_H
#define KVC_SUPPORT_KERNELCHIPS_H

#include <algorithm>
#include <iterator>
#include <string_view>

namespace kvc {

/// The architectures isKernelChip accepts, for messages.
inline constexpr const char *kKernelChips =
    "sm_80, sm_86, sm_89, sm_90 or sm_90a";

/// Whether `chip` is a GPU architecture kvc generates kernels for.
inline bool isKernelChip(std::string_view chip) {
  static constexpr std::string_view kChips[] = {"sm_80", "sm_86", "sm_89",
                                                "sm_90", "sm_90a"};
  return std::find(std::begin(kChips), std::end(kChips), chip) !=
         std::end(kChips);
}

} // namespace kvc

#endif // KVC_SUPPORT_KERNELCHIPS_H
