//===- Format.h - Number formatting for messages and files ------*- C++ -*-===//

#ifndef KVC_SUPPORT_FORMAT_H
#define KVC_SUPPORT_FORMAT_H

#include <string>

namespace kvc {

/// The shortest decimal text that reads back as `value`: whole numbers as
/// integers ("500000"), others shortest round-trip ("27.6", "1e-05").
std::string formatNumber(double value);

/// `value` with at most `digits` significant digits ("94.2", "0.35").
std::string formatSignificant(double value, int digits = 3);

} // namespace kvc

#endif // KVC_SUPPORT_FORMAT_H
