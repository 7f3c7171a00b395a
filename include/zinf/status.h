// Status and StatusOr<T>: how every fallible zinf call reports failure.
//
// zinf does not throw. A call that can fail returns a [[nodiscard]] Status (or StatusOr<T>);
// its message names the thing, the bad value and what was expected, e.g.
//   "aio.queue_depth must be in [1, 4096], got 0".
// Exceptions from dependencies are caught at zinf's boundary and turned into a Status.
//
// Thread-safety: Status and StatusOr are values; distinct objects may be used concurrently.
#ifndef ZINF_STATUS_H_
#define ZINF_STATUS_H_

#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "zinf/export.h"

namespace zinf {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,     // the caller passed something wrong (config, argument, path)
  kFailedPrecondition = 2,  // the call is wrong in the current state (closed device, freed tensor)
  kResourceExhausted = 3,   // a budget, a pool, memory or disk space ran out
  kUnavailable = 4,         // a feature or peer is not there (no GPU, io_uring refused, dead rank)
  kIoError = 5,             // the operating system failed a read, write or open
  kDataLoss = 6,            // stored data is corrupt or truncated (checksum mismatch)
  kCancelled = 7,           // the operation was cancelled before it completed
  kDeadlineExceeded = 8,    // a timeout expired
  kInternal = 9,            // an invariant of zinf itself broke: a bug
};

// Name of the code, e.g. "InvalidArgument".
ZINF_EXPORT std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] ZINF_EXPORT Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "IoError: writing swap file /nvme/zinf.0 at offset 4096: No space left on device".
  std::string ToString() const;

  // Returns a copy whose message is "context: message" (unchanged when OK). Used to add what
  // the caller was doing as an error travels up.
  Status WithContext(std::string_view context) const&;
  Status WithContext(std::string_view context) &&;

  // Explicitly drops a status whose failure the caller has decided not to act on.
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Prints ToString(); lets tests and logs stream a Status.
ZINF_EXPORT std::ostream& operator<<(std::ostream& os, const Status& status);

inline Status OkStatus() { return Status(); }
ZINF_EXPORT Status InvalidArgument(std::string message);
ZINF_EXPORT Status FailedPrecondition(std::string message);
ZINF_EXPORT Status ResourceExhausted(std::string message);
ZINF_EXPORT Status Unavailable(std::string message);
ZINF_EXPORT Status IoError(std::string message);
ZINF_EXPORT Status DataLoss(std::string message);
ZINF_EXPORT Status Cancelled(std::string message);
ZINF_EXPORT Status DeadlineExceeded(std::string message);
ZINF_EXPORT Status Internal(std::string message);

// An IoError (or ResourceExhausted for ENOSPC/ENOMEM, InvalidArgument for EINVAL) for an errno
// value: "<what>: <strerror(err)>".
ZINF_EXPORT Status ErrnoStatus(int err, std::string_view what);

namespace internal {
// Reports a broken internal invariant (a zinf bug, never user input) and aborts.
[[noreturn]] ZINF_EXPORT void DieBadStatusAccess(const Status& status);
}  // namespace internal

// Either a T or the non-OK Status saying why there is none.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  // Implicit from an error status: `return InvalidArgument(...)`. An OK status here is a bug and
  // becomes kInternal.
  StatusOr(Status status)  // NOLINT(runtime/explicit)
      : status_(status.ok() ? Status(StatusCode::kInternal, "StatusOr built from an OK Status")
                            : std::move(status)) {}
  // Implicit from a value: `return value;`.
  template <typename U = T, typename = std::enable_if_t<std::is_constructible_v<T, U&&> &&
                                                        !std::is_same_v<std::decay_t<U>, Status> &&
                                                        !std::is_same_v<std::decay_t<U>, StatusOr>>>
  StatusOr(U&& value) : value_(std::forward<U>(value)) {}  // NOLINT(runtime/explicit)

  bool ok() const { return value_.has_value(); }
  const Status& status() const& { return status_; }
  Status status() && { return std::move(status_); }

  // The value. Calling these on an error is a bug in the caller: it aborts with the status.
  T& value() & {
    Check();
    return *value_;
  }
  const T& value() const& {
    Check();
    return *value_;
  }
  T&& value() && {
    Check();
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void Check() const {
    if (!value_) internal::DieBadStatusAccess(status_);
  }
  Status status_;
  std::optional<T> value_;
};

}  // namespace zinf

#define ZINF_STATUS_CONCAT_INNER_(a, b) a##b
#define ZINF_STATUS_CONCAT_(a, b) ZINF_STATUS_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function if `expr` is not OK.
#define ZINF_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::zinf::Status zinf_status_ = (expr);        \
    if (!zinf_status_.ok()) return zinf_status_; \
  } while (false)

// Like ZINF_RETURN_IF_ERROR, with "context: " prefixed to the message.
#define ZINF_RETURN_IF_ERROR_CTX(expr, context)                                  \
  do {                                                                           \
    ::zinf::Status zinf_status_ = (expr);                                        \
    if (!zinf_status_.ok()) return std::move(zinf_status_).WithContext(context); \
  } while (false)

// `ZINF_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from the value or returns the error.
#define ZINF_ASSIGN_OR_RETURN(lhs, expr) \
  ZINF_ASSIGN_OR_RETURN_IMPL_(ZINF_STATUS_CONCAT_(zinf_statusor_, __LINE__), lhs, expr)
#define ZINF_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return std::move(tmp).status();    \
  lhs = std::move(tmp).value()

#endif  // ZINF_STATUS_H_
