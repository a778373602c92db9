//===- Status.cpp - Errors as values for the kvc runtime ------------------===//

#include "kvc/Runtime/Base/Status.h"

namespace kvc {

const char *statusCodeName(StatusCode code) {
  switch (code) {
  case StatusCode::Ok:
    return "ok";
  case StatusCode::InvalidArgument:
    return "invalid_argument";
  case StatusCode::NotFound:
    return "not_found";
  case StatusCode::DataLoss:
    return "data_loss";
  case StatusCode::FailedPrecondition:
    return "failed_precondition";
  case StatusCode::Unavailable:
    return "unavailable";
  case StatusCode::Unimplemented:
    return "unimplemented";
  case StatusCode::Internal:
    return "internal";
  }
  return "unknown";
}

std::string Status::toString() const {
  if (isOk())
    return "ok";
  return std::string(statusCodeName(code_)) + ": " + message_;
}

Status Status::withContext(const std::string &context) const {
  if (isOk())
    return *this;
  return Status(code_, context + ": " + message_, detail_);
}

} // namespace kvc
