//===- Json.h - Field readers shared by the description parsers -*- C++ -*-===//
//
// Private to lib/Runtime (the description and bundle parsers). Each reader
// names the offending field by its JSON path ("tiers[1].read_gbs") so that a
// bad file gets an actionable error.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_LIB_RUNTIME_DESC_JSON_H
#define KVC_LIB_RUNTIME_DESC_JSON_H

#include "kvc/Runtime/Base/Status.h"
#include "kvc/Support/EnumNames.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace kvc::json_detail {

using Json = nlohmann::json;

/// Whether a field must be present.
enum class Presence { Required, Optional };

/// "a.b" or "b" when `path` is empty.
std::string fieldPath(const std::string &path, std::string_view key);

/// Parses `text`; errors read "invalid JSON: parse error at line ...".
StatusOr<Json> parseJson(std::string_view text);
/// Reads a whole file into `out`.
Status readFile(const std::string &path, std::string &out);

/// Checks that `value` is an object.
Status expectObject(const Json &value, const std::string &path);

/// Finds `key` in `obj`; null when missing (or JSON null) and optional.
StatusOr<const Json *> lookup(const Json &obj, const std::string &path,
                              std::string_view key, Presence presence);

/// Readers: a missing or null optional field leaves `out` unchanged.
Status readInt(const Json &obj, const std::string &path, std::string_view key,
               int64_t &out, Presence presence);
Status readNumber(const Json &obj, const std::string &path,
                  std::string_view key, double &out, Presence presence);
Status readString(const Json &obj, const std::string &path,
                  std::string_view key, std::string &out, Presence presence);
/// Reads an array; a missing optional one reads as an empty array.
Status readArray(const Json &obj, const std::string &path,
                 std::string_view key, const Json *&out, Presence presence);
Status readBool(const Json &obj, const std::string &path, std::string_view key,
                bool &out, Presence presence);

/// Reads a required string field naming one of the `count` enumerators
/// `nameOf` names (the vocabulary's, kvc/Support/Vocabulary.h); an unknown
/// name is an error that lists the known ones.
template <typename E>
Status readName(const Json &obj, const std::string &path, std::string_view key,
                const char *(*nameOf)(E), int count, E &out) {
  std::string name;
  KVC_RETURN_IF_ERROR(readString(obj, path, key, name, Presence::Required));
  if (std::optional<E> value = enumFromName(nameOf, count, name)) {
    out = *value;
    return Status::ok();
  }
  std::string expected;
  for (int i = 0; i < count; ++i)
    expected.append(i ? ", " : "").append(nameOf(E(i)));
  return invalidArgument(fieldPath(path, key) + ": unknown value \"" + name +
                         "\" (expected one of " + expected + ")");
}

/// Fails unless `value > 0` (`value >= 0` when `allowZero`).
Status checkPositive(double value, const std::string &path,
                     bool allowZero = false);

} // namespace kvc::json_detail

#endif // KVC_LIB_RUNTIME_DESC_JSON_H
