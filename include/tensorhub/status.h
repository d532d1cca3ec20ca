// Status and Result<T>: the only way TensorHub reports failure.
//
// No exceptions cross the library boundary. Every fallible call returns a
// Status or a Result<T>; both are [[nodiscard]]. The codes are a small,
// canonical set (after absl::StatusCode); each says what the caller should do.
#ifndef TENSORHUB_STATUS_H_
#define TENSORHUB_STATUS_H_

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "tensorhub/check.h"

namespace tensorhub {

enum class StatusCode : int {
  kOk = 0,
  // The caller passed something wrong (shape mismatch, malformed file, bad
  // version number). Retrying the same call will fail the same way.
  kInvalidArgument = 3,
  // A deadline passed before the work finished. Retry with a longer deadline
  // or give up.
  kDeadlineExceeded = 4,
  // The model, version, worker or registration does not exist.
  kNotFound = 5,
  // The thing being created exists already (e.g. a rank published twice).
  kAlreadyExists = 6,
  // A shared secret was wrong or missing, or a TLS certificate was missing
  // or not trusted (by either end).
  kPermissionDenied = 7,
  // A bound was hit (too many connections, reads in flight, bytes).
  kResourceExhausted = 8,
  // The system is not in a state where the call can succeed, e.g. fetching a
  // version that is not committed yet, or publishing a version number that
  // is not greater than the last. Retry only after the state changed.
  kFailedPrecondition = 9,
  // The operation was cut short: the version was aborted or the registration
  // was revoked while it ran.
  kAborted = 10,
  // A bug or a broken invariant inside TensorHub.
  kInternal = 13,
  // Nobody can serve the request now (hub unreachable, no live holder of a
  // committed version). Retry later, possibly elsewhere.
  kUnavailable = 14,
  // Bytes were damaged: a checksum did not match.
  kDataLoss = 15,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "NOT_FOUND: model 'x' has no version 7"
  std::string ToString() const;

  // Returns a copy whose message is "context: message".
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return Status(StatusCode::kInvalidArgument, std::move(m));
}
inline Status DeadlineExceeded(std::string m) {
  return Status(StatusCode::kDeadlineExceeded, std::move(m));
}
inline Status NotFound(std::string m) {
  return Status(StatusCode::kNotFound, std::move(m));
}
inline Status AlreadyExists(std::string m) {
  return Status(StatusCode::kAlreadyExists, std::move(m));
}
inline Status PermissionDenied(std::string m) {
  return Status(StatusCode::kPermissionDenied, std::move(m));
}
inline Status ResourceExhausted(std::string m) {
  return Status(StatusCode::kResourceExhausted, std::move(m));
}
inline Status FailedPrecondition(std::string m) {
  return Status(StatusCode::kFailedPrecondition, std::move(m));
}
inline Status Aborted(std::string m) {
  return Status(StatusCode::kAborted, std::move(m));
}
inline Status Internal(std::string m) {
  return Status(StatusCode::kInternal, std::move(m));
}
inline Status Unavailable(std::string m) {
  return Status(StatusCode::kUnavailable, std::move(m));
}
inline Status DataLoss(std::string m) {
  return Status(StatusCode::kDataLoss, std::move(m));
}

// A value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit on purpose
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    // A Result built from an OK status would have no value.
    TH_CHECK(!status_.ok());
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  T& value() & {
    CheckHasValue();
    return *value_;
  }
  const T& value() const& {
    CheckHasValue();
    return *value_;
  }
  T&& value() && {
    CheckHasValue();
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  // Taking the value of an error is a bug in the caller: it names the error.
  void CheckHasValue() const {
    if (__builtin_expect(!ok(), 0)) {
      check_internal::Fail(__FILE__, __LINE__,
                           "Result::value() on an error:", status_.message());
    }
  }

  Status status_;
  std::optional<T> value_;
};

}  // namespace tensorhub

#define TH_CONCAT_INNER_(a, b) a##b
#define TH_CONCAT_(a, b) TH_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function if it is not OK.
#define TH_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::tensorhub::Status th_status_ = (expr); \
    if (!th_status_.ok()) return th_status_; \
  } while (0)

// TH_ASSIGN_OR_RETURN(auto x, MakeX()); returns the status on failure.
#define TH_ASSIGN_OR_RETURN(lhs, expr) \
  TH_ASSIGN_OR_RETURN_IMPL_(TH_CONCAT_(th_result_, __LINE__), lhs, expr)
#define TH_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

#endif  // TENSORHUB_STATUS_H_
