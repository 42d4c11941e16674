// Status helpers shared by every component.
//
// No exceptions cross a component boundary: functions that can fail return
// absl::Status or absl::StatusOr<T>. The two macros below propagate errors
// without boilerplate:
//
//   SLICESCHED_RETURN_IF_ERROR(DoThing());
//   SLICESCHED_ASSIGN_OR_RETURN(auto value, ComputeValue());
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace slicesched {

using absl::Status;
using absl::StatusOr;

// Returns `status` with `context` prepended to its message (code kept).
inline absl::Status Annotate(const absl::Status& status,
                             absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(context, ": ", status.message()));
}

}  // namespace slicesched

#define SLICESCHED_STATUS_CONCAT_INNER_(x, y) x##y
#define SLICESCHED_STATUS_CONCAT_(x, y) SLICESCHED_STATUS_CONCAT_INNER_(x, y)

#define SLICESCHED_RETURN_IF_ERROR(expr)                          \
  do {                                                            \
    ::absl::Status slicesched_status_ = (expr);                   \
    if (!slicesched_status_.ok()) return slicesched_status_;      \
  } while (false)

#define SLICESCHED_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                      \
  if (!tmp.ok()) return std::move(tmp).status();          \
  lhs = std::move(tmp).value()

#define SLICESCHED_ASSIGN_OR_RETURN(lhs, expr)                              \
  SLICESCHED_ASSIGN_OR_RETURN_IMPL_(                                        \
      SLICESCHED_STATUS_CONCAT_(slicesched_statusor_, __LINE__), lhs, expr)

// Aborts with the status message when `expr` is not OK. For invariants only.
#define SLICESCHED_CHECK_OK(expr)                                       \
  do {                                                                  \
    ::absl::Status slicesched_check_status_ = (expr);                   \
    ABSL_INTERNAL_CHECK(slicesched_check_status_.ok(),                  \
                        std::string(slicesched_check_status_.ToString())); \
  } while (false)
