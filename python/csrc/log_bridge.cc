// zinf's C++ log lines into Python's `logging` (zinf/_logging.py: the "zinf" logger).
//
// Note [Log bridge]: a line may be written on any thread: the Python thread inside a zinf call
// (the GIL held, or released around a step or a collective), or one of zinf's worker threads
// (I/O, device streams, the optimizer) that the Python thread may be waiting for while it holds
// the GIL. Taking the GIL on the logging thread would deadlock in that case, and running Python
// code in the middle of a zinf call could re-enter zinf while it holds its locks. So the sink
// only queues the line and asks the interpreter (Py_AddPendingCall, which needs no GIL) to
// drain the queue on the main thread at its next bytecode boundary: the lines reach `logging`
// in the order they were written, on a Python thread, as soon as the call that wrote them has
// returned. (Python 3.11 notices a call added from another thread only when the main thread
// next takes the GIL back, which every zinf call that waits on I/O or peers does on return;
// 3.12 at once.) zinf._logging also drains when asked (flush), after each optimizer step of
// zinf.initialize's engine, and at exit, where it closes the
// bridge before the interpreter goes away: later lines go to stderr as without Python.
// A queue that is never drained (a main thread blocked for hours) keeps its newest
// kMaxQueuedLines lines and counts the others.
//
// Thread-safety: the sink is called from any thread; Drain and SetHandler with the GIL held.
#include <Python.h>
#include <pybind11/pybind11.h>

#include <cstdio>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "python/csrc/binding.h"
#include "zinf/log_sink.h"

namespace zinf::python {
namespace {

constexpr size_t kMaxQueuedLines = 10000;

struct Bridge {
  std::mutex mu;
  std::deque<std::pair<LogLevel, std::string>> lines;
  uint64_t dropped = 0;
  bool open = false;             // a handler is set: lines are queued, not printed
  bool drain_scheduled = false;  // a pending call is registered and has not run yet
  py::object handler;            // touched with the GIL held only
};

Bridge& TheBridge() {
  static Bridge* bridge = new Bridge();  // never destroyed: threads may log during exit
  return *bridge;
}

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return "trace";
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warning";
    case LogLevel::kError:
      return "error";
    case LogLevel::kOff:
      break;
  }
  return "off";
}

LogLevel LevelFromName(const std::string& name) {
  for (LogLevel level : {LogLevel::kTrace, LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn,
                         LogLevel::kError, LogLevel::kOff}) {
    if (name == LevelName(level)) return level;
  }
  throw StatusError(
      InvalidArgument("log level must be trace, debug, info, warning, error or "
                      "off, got '" +
                      name + "'"));
}

int DrainPending(void*);

void Enqueue(LogLevel level, std::string_view message) {
  Bridge& b = TheBridge();
  std::lock_guard<std::mutex> lock(b.mu);
  if (!b.open) {
    std::fprintf(stderr, "[zinf] [%s] %.*s\n", LevelName(level), static_cast<int>(message.size()),
                 message.data());
    return;
  }
  if (b.lines.size() >= kMaxQueuedLines) {
    b.lines.pop_front();
    ++b.dropped;
  }
  b.lines.emplace_back(level, std::string(message));
  // The interpreter's queue of pending calls is short (32); one of ours is enough. When it is
  // full the next line tries again, and flush() and exit drain regardless.
  if (!b.drain_scheduled && Py_AddPendingCall(&DrainPending, nullptr) == 0) {
    b.drain_scheduled = true;
  }
}

// Hands the queued lines to the handler as [(level, message)]; the GIL is held.
void Drain() {
  Bridge& b = TheBridge();
  std::deque<std::pair<LogLevel, std::string>> lines;
  uint64_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(b.mu);
    lines.swap(b.lines);
    dropped = std::exchange(b.dropped, 0);
  }
  if (!b.handler || (lines.empty() && dropped == 0)) return;
  if (dropped > 0) {
    lines.emplace_front(LogLevel::kWarn,
                        std::to_string(dropped) +
                            " earlier log line(s) dropped: the queue was not drained in time");
  }
  py::list batch;
  for (const auto& [level, text] : lines) {
    // A path in a message need not be UTF-8.
    PyObject* message =
        PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "replace");
    if (message == nullptr) throw py::error_already_set();
    batch.append(py::make_tuple(LevelName(level), py::reinterpret_steal<py::str>(message)));
  }
  py::object handler = b.handler;  // the handler may replace itself
  handler(batch);
}

int DrainPending(void*) {
  {
    Bridge& b = TheBridge();
    std::lock_guard<std::mutex> lock(b.mu);
    b.drain_scheduled = false;
  }
  try {
    Drain();
  } catch (py::error_already_set& e) {
    // An exception here would surface in whatever the main thread runs next.
    e.discard_as_unraisable("zinf's log handler");
  }
  return 0;
}

void SetHandler(py::object handler) {
  Bridge& b = TheBridge();
  const bool open = !handler.is_none();
  b.handler = open ? std::move(handler) : py::object();
  {
    std::lock_guard<std::mutex> lock(b.mu);
    b.open = open;
  }
  if (open) {
    SetLogSink(&Enqueue);
  } else {
    SetLogSink(nullptr);
  }
}

}  // namespace

void BindLogging(py::module_& m) {
  m.def("set_log_handler", &SetHandler, py::arg("handler"),
        "Routes zinf's log lines to handler([(level, message), ...]), called on a Python "
        "thread (Note [Log bridge]); None: to stderr again");
  m.def("drain_logs", &Drain, "Hands the queued log lines to the handler now");
  m.def(
      "set_log_level", [](const std::string& name) { SetLogLevel(LevelFromName(name)); },
      py::arg("level"), "Lines below it (trace|debug|info|warning|error|off) are not written");
  m.def("get_log_level", [] { return std::string(LevelName(GetLogLevel())); });
  m.def(
      "sink_from_worker_thread",
      [](const std::string& level, const std::string& message) {
        // Joined with the GIL held: the case that would deadlock if the sink took the GIL.
        const LogLevel l = LevelFromName(level);
        std::thread([&] { Enqueue(l, message); }).join();
      },
      py::arg("level"), py::arg("message"),
      "Hands a line to the bridge's sink from a new native thread, which this call joins while "
      "it holds the GIL, as a worker thread's log line reaches it (for tests)");
}

}  // namespace zinf::python
