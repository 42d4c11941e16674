// String helpers that smooth over Debian's Abseil build, whose
// absl::string_view is its own type (ABSL_OPTION_USE_STD_STRING_VIEW = 0) and
// which predates AbslStringify.
//
//   slicesched::StrCat(...)  absl::StrCat that also takes std::string_view
//                            and anything with a ToString() (ids, units)
//   ToStd / ToAbsl           convert between the two string_view types
#pragma once

#include <string>
#include <string_view>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace slicesched {

inline std::string_view ToStd(absl::string_view s) { return std::string_view(s.data(), s.size()); }
inline absl::string_view ToAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

namespace strings_internal {

template <typename T>
concept HasToString = requires(const T& t) {
  { t.ToString() } -> std::convertible_to<std::string>;
};

template <typename T>
decltype(auto) AsAlphaNum(const T& v) {
  if constexpr (std::is_same_v<T, std::string_view>) {
    return ToAbsl(v);
  } else if constexpr (HasToString<T>) {
    return v.ToString();
  } else {
    return (v);
  }
}

}  // namespace strings_internal

template <typename... Args>
std::string StrCat(const Args&... args) {
  return absl::StrCat(strings_internal::AsAlphaNum(args)...);
}

}  // namespace slicesched
