// Logging setup.
//
// Components log through spdlog's default logger (spdlog::info(...) etc.).
// Binaries call SetupLogging() once at startup, before starting threads that
// log; libraries never configure logging themselves.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "spdlog/common.h"

namespace slicesched {

// Parses a log level name: trace, debug, info, warn (or warning), error,
// critical, off; case-insensitive. Unknown names give InvalidArgumentError
// naming the text.
absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(
    absl::string_view level);

// Replaces spdlog's default logger with one that writes to stderr (coloured
// when stderr is a terminal) at `level`, using `pattern` (spdlog pattern
// syntax) or, when empty, "[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] [%t] %v".
// On error nothing is changed. Not safe to call while other threads log.
absl::Status SetupLogging(absl::string_view level,
                          absl::string_view pattern = {});

}  // namespace slicesched
