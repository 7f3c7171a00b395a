// Logging backend: one spdlog logger on stderr, or the program's sink; level from
// ZINF_LOG_LEVEL.
#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace zinf::log {
namespace {

Level LevelFromEnv() {
  const char* env = std::getenv("ZINF_LOG_LEVEL");
  if (env == nullptr) return Level::kInfo;
  const std::string v(env);
  if (v == "trace") return Level::kTrace;
  if (v == "debug") return Level::kDebug;
  if (v == "info") return Level::kInfo;
  if (v == "warn" || v == "warning") return Level::kWarn;
  if (v == "error") return Level::kError;
  if (v == "off") return Level::kOff;
  std::fprintf(stderr,
               "[zinf] [warn] ZINF_LOG_LEVEL=%s is not one of "
               "trace|debug|info|warn|error|off; using info\n",
               env);
  return Level::kInfo;
}

std::atomic<Level>& CurrentLevel() {
  static std::atomic<Level> level{LevelFromEnv()};
  return level;
}

spdlog::logger& Logger() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = std::make_shared<spdlog::logger>(
        "zinf", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    l->set_pattern("[zinf] [%l] %v");
    l->set_level(spdlog::level::trace);  // filtering happens in Enabled()
    return l;
  }();
  return *logger;
}

spdlog::level::level_enum ToSpdlog(Level level) {
  switch (level) {
    case Level::kTrace:
      return spdlog::level::trace;
    case Level::kDebug:
      return spdlog::level::debug;
    case Level::kInfo:
      return spdlog::level::info;
    case Level::kWarn:
      return spdlog::level::warn;
    case Level::kError:
      return spdlog::level::err;
    case Level::kOff:
      return spdlog::level::off;
  }
  return spdlog::level::info;
}

// The program's sink, if any. Each line copies the pointer under the lock and calls the sink
// outside it, so a slow sink delays no other thread's line and may itself log.
struct SinkSlot {
  std::mutex mu;
  std::shared_ptr<const LogSink> sink;
};

SinkSlot& Sink() {
  static SinkSlot* slot = new SinkSlot();  // never destroyed: threads may log during exit
  return *slot;
}

}  // namespace

bool Enabled(Level level) {
  return level != Level::kOff && level >= CurrentLevel().load(std::memory_order_relaxed);
}

void Write(Level level, std::string_view message) {
  std::shared_ptr<const LogSink> sink;
  {
    SinkSlot& slot = Sink();
    std::lock_guard<std::mutex> lock(slot.mu);
    sink = slot.sink;
  }
  if (sink != nullptr) {
    (*sink)(level, message);
  } else {
    Logger().log(ToSpdlog(level), message);
  }
}

void SetLevel(Level level) { CurrentLevel().store(level, std::memory_order_relaxed); }

}  // namespace zinf::log

namespace zinf {

void SetLogSink(LogSink sink) {
  auto next = sink ? std::make_shared<const LogSink>(std::move(sink)) : nullptr;
  log::SinkSlot& slot = log::Sink();
  std::lock_guard<std::mutex> lock(slot.mu);
  slot.sink = std::move(next);
}

void SetLogLevel(LogLevel level) { log::SetLevel(level); }

LogLevel GetLogLevel() { return log::CurrentLevel().load(std::memory_order_relaxed); }

}  // namespace zinf
