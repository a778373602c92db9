//===- Format.cpp - Number formatting for messages and files --------------===//

#include "kvc/Support/Format.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>

namespace kvc {

std::string formatNumber(double value) {
  if (value == std::trunc(value) && std::fabs(value) < 1e15)
    return std::to_string(static_cast<int64_t>(value));
  char buffer[32];
  std::to_chars_result result =
      std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

std::string formatSignificant(double value, int digits) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.*g", digits, value);
  return buffer;
}

} // namespace kvc
