// Where zinf's log lines go: stderr ("[zinf] [warn] ...") unless a program takes them, as the
// Python package does for its "zinf" logger. ZINF_LOG_LEVEL=trace|debug|info|warn|error|off
// sets the level lines must reach to be written (default info); SetLogLevel overrides it.
//
// Thread-safety: every function may be called from any thread. A sink is called on the thread
// that logs (any of zinf's worker threads too), possibly on several at once.
#ifndef ZINF_LOG_SINK_H_
#define ZINF_LOG_SINK_H_

#include <functional>
#include <string_view>

#include "zinf/export.h"

namespace zinf {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kOff };

// Called with each line's level and text (no prefix, no newline). It must be thread-safe, must
// not throw, and must not wait for anything zinf does (the logging thread may be one that zinf
// is waiting for): the Python package's sink queues the line and returns.
using LogSink = std::function<void(LogLevel level, std::string_view message)>;

// Sends the lines to `sink` from now on; an empty sink restores stderr. A line being written
// while the sink is replaced may still reach the previous one.
ZINF_EXPORT void SetLogSink(LogSink sink);

// Lines below `level` are not formatted or written (kOff: none are).
ZINF_EXPORT void SetLogLevel(LogLevel level);
ZINF_EXPORT LogLevel GetLogLevel();

}  // namespace zinf

#endif  // ZINF_LOG_SINK_H_
