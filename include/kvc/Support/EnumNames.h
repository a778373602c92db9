//===- EnumNames.h - Enumerators from their names ---------------*- C++ -*-===//

#ifndef KVC_SUPPORT_ENUMNAMES_H
#define KVC_SUPPORT_ENUMNAMES_H

#include <optional>
#include <string_view>

namespace kvc {

/// The enumerator of `E` (whose enumerators are 0 .. count-1) that `nameOf`
/// names `name`, or nothing.
template <typename E>
std::optional<E> enumFromName(const char *(*nameOf)(E), int count,
                              std::string_view name) {
  for (int i = 0; i < count; ++i)
    if (name == nameOf(static_cast<E>(i)))
      return static_cast<E>(i);
  return std::nullopt;
}

} // namespace kvc

#endif // KVC_SUPPORT_ENUMNAMES_H
