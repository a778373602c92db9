//===- Json.cpp - Field readers shared by the description parsers ---------===//

#include "Json.h"

#include "kvc/Support/Format.h"

#include <fstream>
#include <sstream>

namespace kvc::json_detail {

std::string fieldPath(const std::string &path, std::string_view key) {
  if (path.empty())
    return std::string(key);
  return path + "." + std::string(key);
}

StatusOr<Json> parseJson(std::string_view text) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception &e) {
    // Syntax (parse_error) or a number beyond a double (out_of_range 406).
    // e.what() is "[json.exception.parse_error.101] parse error at line ..".
    std::string message = e.what();
    std::size_t pos = message.find("] ");
    if (pos != std::string::npos)
      message = message.substr(pos + 2);
    return invalidArgument("invalid JSON: " + message);
  }
}

Status readFile(const std::string &path, std::string &out) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return notFound(path + ": cannot open file");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad())
    return dataLoss(path + ": read error");
  out = buffer.str();
  return Status::ok();
}

Status expectObject(const Json &value, const std::string &path) {
  if (value.is_object())
    return Status::ok();
  return invalidArgument((path.empty() ? std::string("document") : path) +
                         ": expected a JSON object");
}

StatusOr<const Json *> lookup(const Json &obj, const std::string &path,
                              std::string_view key, Presence presence) {
  auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null()) {
    if (presence == Presence::Optional)
      return static_cast<const Json *>(nullptr);
    return invalidArgument(fieldPath(path, key) + ": missing required field");
  }
  return &*it;
}

namespace {
/// Reads `key` as a T when `(value.*isType)()` holds.
template <typename T>
Status readField(const Json &obj, const std::string &path, std::string_view key,
                 T &out, Presence presence, bool (Json::*isType)() const,
                 const char *expected) {
  StatusOr<const Json *> field = lookup(obj, path, key, presence);
  if (!field.isOk())
    return field.status();
  if (!*field)
    return Status::ok();
  const Json &v = **field;
  if (!(v.*isType)())
    return invalidArgument(fieldPath(path, key) + ": expected " + expected +
                           ", got " + v.type_name() + " " + v.dump());
  out = v.get<T>();
  return Status::ok();
}
} // namespace

Status readInt(const Json &obj, const std::string &path, std::string_view key,
               int64_t &out, Presence presence) {
  return readField(obj, path, key, out, presence, &Json::is_number_integer,
                   "an integer");
}

Status readNumber(const Json &obj, const std::string &path,
                  std::string_view key, double &out, Presence presence) {
  return readField(obj, path, key, out, presence, &Json::is_number,
                   "a number");
}

Status readString(const Json &obj, const std::string &path,
                  std::string_view key, std::string &out, Presence presence) {
  return readField(obj, path, key, out, presence, &Json::is_string,
                   "a string");
}

Status readArray(const Json &obj, const std::string &path,
                 std::string_view key, const Json *&out, Presence presence) {
  static const Json empty = Json::array();
  StatusOr<const Json *> field = lookup(obj, path, key, presence);
  if (!field.isOk())
    return field.status();
  out = *field ? *field : &empty;
  if (!out->is_array())
    return invalidArgument(fieldPath(path, key) + ": expected an array, got " +
                           out->type_name());
  return Status::ok();
}

Status readBool(const Json &obj, const std::string &path, std::string_view key,
                bool &out, Presence presence) {
  return readField(obj, path, key, out, presence, &Json::is_boolean,
                   "a boolean");
}

Status checkPositive(double value, const std::string &path, bool allowZero) {
  if (value > 0 || (allowZero && value == 0))
    return Status::ok();
  return invalidArgument(path + ": expected a " +
                         (allowZero ? "non-negative" : "positive") +
                         " number, got " + formatNumber(value));
}

} // namespace kvc::json_detail
