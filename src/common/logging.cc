// Implementation of the logging setup (see logging.h).

#include "slicesched/common/logging.h"

#include <memory>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace slicesched {
namespace {

constexpr const char kDefaultPattern[] =
    "[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] [%t] %v";

}  // namespace

absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(
    absl::string_view level) {
  const std::string name = absl::AsciiStrToLower(level);
  if (name == "trace") return spdlog::level::trace;
  if (name == "debug") return spdlog::level::debug;
  if (name == "info") return spdlog::level::info;
  if (name == "warn" || name == "warning") return spdlog::level::warn;
  if (name == "error") return spdlog::level::err;
  if (name == "critical") return spdlog::level::critical;
  if (name == "off") return spdlog::level::off;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown log level '", level,
      "' (expected trace, debug, info, warn, error, critical or off)"));
}

absl::Status SetupLogging(absl::string_view level, absl::string_view pattern) {
  absl::StatusOr<spdlog::level::level_enum> parsed = ParseLogLevel(level);
  if (!parsed.ok()) return parsed.status();

  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("slicesched", std::move(sink));
  logger->set_level(*parsed);
  logger->set_pattern(pattern.empty() ? std::string(kDefaultPattern)
                                      : std::string(pattern));
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(std::move(logger));
  return absl::OkStatus();
}

}  // namespace slicesched
