// The project's one error type is absl::Status / absl::StatusOr. These macros return early on
// error; CUDA and libfabric codes are converted where they are called (see their modules).
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KVRAIL_CONCAT_INNER_(a, b) a##b
#define KVRAIL_CONCAT_(a, b) KVRAIL_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define KVRAIL_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    const ::absl::Status kvrail_status_ = (expr);    \
    if (!kvrail_status_.ok()) return kvrail_status_; \
  } while (0)

// `lhs` receives the value of a StatusOr expression, or the enclosing function returns its status.
#define KVRAIL_ASSIGN_OR_RETURN(lhs, expr) \
  KVRAIL_ASSIGN_OR_RETURN_IMPL_(KVRAIL_CONCAT_(kvrail_statusor_, __LINE__), lhs, expr)

#define KVRAIL_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()
