// Status: codes, messages, context and errno mapping.
#include "zinf/status.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>

namespace zinf {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kFailedPrecondition:
      return "FailedPrecondition";
    case StatusCode::kResourceExhausted:
      return "ResourceExhausted";
    case StatusCode::kUnavailable:
      return "Unavailable";
    case StatusCode::kIoError:
      return "IoError";
    case StatusCode::kDataLoss:
      return "DataLoss";
    case StatusCode::kCancelled:
      return "Cancelled";
    case StatusCode::kDeadlineExceeded:
      return "DeadlineExceeded";
    case StatusCode::kInternal:
      return "Internal";
  }
  return "Unknown";
}

Status::Status(StatusCode code, std::string message)
    : code_(code), message_(code == StatusCode::kOk ? std::string() : std::move(message)) {}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

Status Status::WithContext(std::string_view context) const& {
  return Status(*this).WithContext(context);
}

Status Status::WithContext(std::string_view context) && {
  if (ok() || context.empty()) return std::move(*this);
  std::string m(context);
  m += ": ";
  m += message_;
  message_ = std::move(m);
  return std::move(*this);
}

std::ostream& operator<<(std::ostream& os, const Status& status) { return os << status.ToString(); }

Status InvalidArgument(std::string m) { return Status(StatusCode::kInvalidArgument, std::move(m)); }
Status FailedPrecondition(std::string m) {
  return Status(StatusCode::kFailedPrecondition, std::move(m));
}
Status ResourceExhausted(std::string m) {
  return Status(StatusCode::kResourceExhausted, std::move(m));
}
Status Unavailable(std::string m) { return Status(StatusCode::kUnavailable, std::move(m)); }
Status IoError(std::string m) { return Status(StatusCode::kIoError, std::move(m)); }
Status DataLoss(std::string m) { return Status(StatusCode::kDataLoss, std::move(m)); }
Status Cancelled(std::string m) { return Status(StatusCode::kCancelled, std::move(m)); }
Status DeadlineExceeded(std::string m) {
  return Status(StatusCode::kDeadlineExceeded, std::move(m));
}
Status Internal(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }

Status ErrnoStatus(int err, std::string_view what) {
  std::string m(what);
  m += ": ";
  m += std::strerror(err);
  switch (err) {
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
      return ResourceExhausted(std::move(m));
    case EINVAL:
      return InvalidArgument(std::move(m));
    case ENOSYS:
    case EOPNOTSUPP:
      return Unavailable(std::move(m));
    case ETIMEDOUT:
      return DeadlineExceeded(std::move(m));
    case ECANCELED:
      return Cancelled(std::move(m));
    default:
      return IoError(std::move(m));
  }
}

namespace internal {
void DieBadStatusAccess(const Status& status) {
  std::fprintf(stderr, "zinf: internal error: value of a StatusOr that holds %s\n",
               status.ToString().c_str());
  std::abort();
}
}  // namespace internal

}  // namespace zinf
