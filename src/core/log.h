// Logging for zinf's own code (private; not part of the public API).
//
// ZINF_LOG_LEVEL=trace|debug|info|warn|error|off sets the level (default: info).
// Messages go to stderr as "[zinf] [warn] ...", through spdlog, or to the sink a program set
// (zinf/log_sink.h). The format strings are checked at compile time by fmt.
//
// Thread-safe.
#ifndef ZINF_CORE_LOG_H_
#define ZINF_CORE_LOG_H_

#include <fmt/core.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>

#include "zinf/log_sink.h"
#include "zinf/status.h"

namespace zinf::log {

using Level = LogLevel;

bool Enabled(Level level);
void Write(Level level, std::string_view message);
// Overrides ZINF_LOG_LEVEL (tools use it for --verbose / --quiet).
void SetLevel(Level level);

template <typename... Args>
void Log(Level level, fmt::format_string<Args...> format, Args&&... args) {
  if (Enabled(level)) Write(level, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void Debug(fmt::format_string<Args...> f, Args&&... a) {
  Log(Level::kDebug, f, std::forward<Args>(a)...);
}
template <typename... Args>
void Info(fmt::format_string<Args...> f, Args&&... a) {
  Log(Level::kInfo, f, std::forward<Args>(a)...);
}
template <typename... Args>
void Warn(fmt::format_string<Args...> f, Args&&... a) {
  Log(Level::kWarn, f, std::forward<Args>(a)...);
}
template <typename... Args>
void Error(fmt::format_string<Args...> f, Args&&... a) {
  Log(Level::kError, f, std::forward<Args>(a)...);
}

}  // namespace zinf::log

// Lets log lines and error messages format a Status directly: log::Warn("... {}", status).
template <>
struct fmt::formatter<zinf::Status> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  // Copies the text itself: fmt's own formatting functions are templates that Debian's libfmt
  // exports under gcc's mangling, which clang's differs from, so the fuzz build (clang) could
  // not link a program whose code formats a Status.
  template <typename FormatContext>
  auto format(const zinf::Status& status, FormatContext& ctx) const {
    const std::string text = status.ToString();
    return std::copy(text.begin(), text.end(), ctx.out());
  }
};

#endif  // ZINF_CORE_LOG_H_
