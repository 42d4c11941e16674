// Bounds checks of options (command flags, library options' Validate()),
// with one wording for every command:
//
//   "<prefix><name> must be <bounds>, got '<value>'"
//
// e.g. "--window must be at least 1, got '0'". slicesim maps such an
// InvalidArgument to its usage exit code (tools/slicesim.cc, Rejected).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "absl/status/status.h"
#include "slicesched/common/strings.h"

namespace slicesched {

// The error for `value` of option `name` outside `bounds` ("in 1..8",
// "at least 0", "> 0", "fcfs or equal", ...).
template <typename T>
absl::Status OptionOutOfRange(std::string_view name, std::string_view bounds, const T& value,
                              std::string_view prefix = {}) {
  return absl::InvalidArgumentError(StrCat(prefix, name, " must be ", bounds, ", got '", value, "'"));
}

// One integer option and its minimum.
struct AtLeast {
  std::string_view name;
  int64_t min;
  int64_t value;
};

// The first of `checks` whose value is below its minimum, as
// OptionOutOfRange(name, "at least <min>", value, prefix); OK if none.
inline absl::Status CheckAtLeast(std::initializer_list<AtLeast> checks, std::string_view prefix = {}) {
  for (const AtLeast& c : checks) {
    if (c.value < c.min) return OptionOutOfRange(c.name, StrCat("at least ", c.min), c.value, prefix);
  }
  return absl::OkStatus();
}

}  // namespace slicesched
