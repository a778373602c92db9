//===- Status.h - Errors as values for the kvc runtime ----------*- C++ -*-===//
//
// The runtime reports every failure as a value: a `Status` (code + message a
// server operator can act on) or a `StatusOr<T>` holding either a value or the
// failure. Nothing in lib/Runtime throws across its API, and nothing here
// depends on LLVM or MLIR.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_BASE_STATUS_H
#define KVC_RUNTIME_BASE_STATUS_H

#include <string>
#include <utility>
#include <variant>

namespace kvc {

/// Failure classes a caller can act on (e.g. DataLoss -> recompute the chunk).
enum class StatusCode {
  Ok,
  InvalidArgument,    ///< The caller passed something malformed.
  NotFound,           ///< A file, chunk or key does not exist.
  DataLoss,           ///< Stored bytes are corrupt or truncated.
  FailedPrecondition, ///< Valid input that does not fit (wrong model, ...).
  Unavailable,        ///< A store or device cannot be reached right now.
  Unimplemented,      ///< Valid input that kvc does not support.
  Internal,           ///< A bug in kvc.
};

/// Returns a stable lower-case name for `code` ("invalid_argument", ...).
const char *statusCodeName(StatusCode code);

/// The result of an operation that returns nothing on success.
class [[nodiscard]] Status {
public:
  Status() = default;
  Status(StatusCode code, std::string message, int detail = 0)
      : code_(code), detail_(detail), message_(std::move(message)) {}

  static Status ok() { return Status(); }

  bool isOk() const { return code_ == StatusCode::Ok; }
  explicit operator bool() const { return isOk(); }
  StatusCode code() const { return code_; }
  /// A component-defined refinement of the code (e.g. kvc::ChunkFault).
  int detail() const { return detail_; }
  const std::string &message() const { return message_; }

  /// "invalid_argument: tiers[1].read_gbs: expected a positive number".
  std::string toString() const;

  /// Returns a copy whose message is prefixed with `context + ": "`.
  Status withContext(const std::string &context) const;

private:
  StatusCode code_ = StatusCode::Ok;
  int detail_ = 0;
  std::string message_;
};

inline Status invalidArgument(std::string message) {
  return Status(StatusCode::InvalidArgument, std::move(message));
}
inline Status notFound(std::string message) {
  return Status(StatusCode::NotFound, std::move(message));
}
inline Status unimplemented(std::string message) {
  return Status(StatusCode::Unimplemented, std::move(message));
}
inline Status dataLoss(std::string message) {
  return Status(StatusCode::DataLoss, std::move(message));
}
inline Status failedPrecondition(std::string message) {
  return Status(StatusCode::FailedPrecondition, std::move(message));
}
inline Status unavailable(std::string message) {
  return Status(StatusCode::Unavailable, std::move(message));
}
inline Status internalError(std::string message) {
  return Status(StatusCode::Internal, std::move(message));
}

/// Either a value or the Status that explains why there is none.
template <typename T> class [[nodiscard]] StatusOr {
public:
  StatusOr(T value) : state_(std::move(value)) {}
  /// A failure. An OK status carries no value, so it is a caller's bug and
  /// becomes an internal error (as in absl::StatusOr): a StatusOr is never
  /// "not OK" with an OK status.
  StatusOr(Status status) : state_(std::move(status)) {
    if (std::get<Status>(state_).isOk())
      state_ = Status(StatusCode::Internal,
                      "a StatusOr was given an OK status and no value");
  }

  bool isOk() const { return std::holds_alternative<T>(state_); }
  explicit operator bool() const { return isOk(); }

  const Status &status() const {
    static const Status okStatus;
    return isOk() ? okStatus : std::get<Status>(state_);
  }
  T &value() & { return std::get<T>(state_); }
  const T &value() const & { return std::get<T>(state_); }
  T &&value() && { return std::get<T>(std::move(state_)); }
  T *operator->() { return &value(); }
  const T *operator->() const { return &value(); }
  T &operator*() & { return value(); }
  const T &operator*() const & { return value(); }
  T &&operator*() && { return std::move(*this).value(); }

private:
  std::variant<Status, T> state_;
};

} // namespace kvc

/// Returns from the enclosing function when `expr` (a Status) failed.
#define KVC_RETURN_IF_ERROR(expr)                                              \
  do {                                                                         \
    ::kvc::Status kvcStatus_ = (expr);                                         \
    if (!kvcStatus_.isOk())                                                    \
      return kvcStatus_;                                                       \
  } while (false)

/// Declares `var` as the value of `expr` (a StatusOr), returning from the
/// enclosing function with its status when it failed.
#define KVC_ASSIGN_OR_RETURN(var, expr)                                        \
  auto var##Or = (expr);                                                       \
  if (!var##Or.isOk())                                                         \
    return var##Or.status();                                                   \
  auto var = std::move(*var##Or)

#endif // KVC_RUNTIME_BASE_STATUS_H
