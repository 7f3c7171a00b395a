// The `zinf._zinf` extension module: exception classes for zinf's status codes, and the parts
// bound in optim.cc, nvme.cc, engine.cc and log_bridge.cc.
//
// Every zinf::StatusCode has a Python exception class, all subclasses of zinf.ZinfError (a
// RuntimeError); those with a built-in meaning also derive from it, so that plain `except
// ValueError` or `except OSError` work:
//   InvalidArgument -> InvalidArgumentError(ZinfError, ValueError)
//   IoError -> IoError(ZinfError, OSError)      DeadlineExceeded -> (ZinfError, TimeoutError)
//   FailedPrecondition, ResourceExhausted, Unavailable, DataLoss, Cancelled, Internal -> ZinfError
// The message is the status's text: "DataLoss: reading tensor 'w' ...: checksum mismatch ...".
#include <Python.h>
#include <pybind11/pybind11.h>

#include <array>
#include <cstdlib>
#include <string>

#include "python/csrc/binding.h"
#include "zinf/dtype.h"
#include "zinf/input_file.h"

namespace zinf::python {

Status FromC(zinf_code_t code, char* err) {
  if (code == ZINF_OK) {
    zinf_free(err);
    return OkStatus();
  }
  std::string message = err != nullptr ? err : "no message";
  zinf_free(err);
  // The C ABI's message is "function: CodeName: text"; the exception's class names the code
  // and its text starts with the code's name already, so keep only "text".
  const std::string code_part = std::string(": ") + zinf_code_name(code) + ": ";
  if (const size_t at = message.find(code_part); at != std::string::npos) {
    message.erase(0, at + code_part.size());
  }
  // The C ABI's codes are StatusCode's numbers (c_api.h says they never change).
  return Status(static_cast<StatusCode>(code), std::move(message));
}

ElementType ElementTypeFromName(const std::string& name, const char* what) {
  if (name == "float32") return ElementType::kFp32;
  if (name == "bfloat16") return ElementType::kBf16;
  if (name == "float16") return ElementType::kFp16;
  throw StatusError(
      InvalidArgument(std::string(what) + " must be float32, bfloat16 or float16, got " + name));
}

namespace {

// Index: StatusCode's value. Filled once at import; the references live as long as the module.
std::array<PyObject*, 10> exception_classes{};

PyObject* NewException(py::module_& m, const char* name, PyObject* bases, const char* doc) {
  std::string qualified = std::string("zinf.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (cls == nullptr) throw py::error_already_set();
  m.add_object(name, py::reinterpret_borrow<py::object>(cls));
  return cls;
}

}  // namespace

}  // namespace zinf::python

PYBIND11_MODULE(_zinf, m) {
  using namespace zinf::python;
  using zinf::StatusCode;
  m.doc() = "zinf's C++ core for the zinf Python package (use zinf.optim, zinf.nvme, zinf.zero)";

  PyObject* base = NewException(m, "ZinfError", PyExc_RuntimeError,
                                "An error reported by zinf; the message names the problem.");
  auto derived = [&](const char* name, PyObject* builtin, const char* doc) {
    if (builtin == nullptr) return NewException(m, name, base, doc);
    py::tuple bases = py::make_tuple(py::handle(base), py::handle(builtin));
    return NewException(m, name, bases.ptr(), doc);
  };
  auto& cls = exception_classes;
  cls[static_cast<int>(StatusCode::kInvalidArgument)] =
      derived("InvalidArgumentError", PyExc_ValueError, "A bad argument, option or config value.");
  cls[static_cast<int>(StatusCode::kFailedPrecondition)] =
      derived("FailedPreconditionError", nullptr, "A call that is wrong in the current state.");
  cls[static_cast<int>(StatusCode::kResourceExhausted)] =
      derived("ResourceExhaustedError", nullptr, "A budget, pool, memory or disk ran out.");
  cls[static_cast<int>(StatusCode::kUnavailable)] =
      derived("UnavailableError", nullptr, "A feature or peer is not there.");
  cls[static_cast<int>(StatusCode::kIoError)] =
      derived("IoError", PyExc_OSError, "The operating system failed a read, write or open.");
  cls[static_cast<int>(StatusCode::kDataLoss)] =
      derived("DataLossError", nullptr, "Stored data is corrupt or truncated.");
  cls[static_cast<int>(StatusCode::kCancelled)] =
      derived("CancelledError", nullptr, "The operation was cancelled.");
  cls[static_cast<int>(StatusCode::kDeadlineExceeded)] =
      derived("DeadlineExceededError", PyExc_TimeoutError, "A timeout expired (a dead peer).");
  cls[static_cast<int>(StatusCode::kInternal)] =
      derived("InternalError", nullptr, "An invariant of zinf broke: a bug.");

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const int code = static_cast<int>(e.status().code());
      PyObject* type = code > 0 && code < static_cast<int>(exception_classes.size()) &&
                               exception_classes[code] != nullptr
                           ? exception_classes[code]
                           : exception_classes[static_cast<int>(StatusCode::kInternal)];
      PyErr_SetString(type, e.what());
    }
  });

  BindOptim(m);
  BindNvme(m);
  BindEngine(m);
  BindLogging(m);
  m.def(
      "read_input_file",
      [](const std::string& path, const std::string& what) {
        return ValueOrThrow(zinf::ReadInputFile(path, what));
      },
      py::arg("path"), py::arg("what"),
      "A config or other input file's text, read as zinf reads every input: a regular file (or "
      "'-') of at most 64 MiB (Note [Bounded input])");
  m.def(
      "check_json_depth",
      [](const std::string& text, const std::string& source) {
        ThrowIfError(zinf::CheckJsonDepth(text, source));
      },
      py::arg("text"), py::arg("source"),
      "Raises, naming `source` and the byte offset, when `text` nests arrays and objects deeper "
      "than zinf reads (Note [Bounded input]); scans without parsing");
}
