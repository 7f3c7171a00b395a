// What the parts of the `zinf._zinf` extension share: turning a zinf Status (or a C ABI error)
// into a Python exception, and checking the raw pointers the Python side hands over.
//
// Tensors cross this boundary as (data pointer, element count) pairs. zinf/*.py checks each
// tensor (device, dtype, contiguity, size) before taking its pointer and keeps the tensor
// alive while zinf may touch it; this side checks what it can see (null pointers, counts).
#ifndef ZINF_PYTHON_CSRC_BINDING_H_
#define ZINF_PYTHON_CSRC_BINDING_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "zinf/c_api.h"
#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf::python {

namespace py = pybind11;

// Thrown by the binding for a non-OK Status; the translator registered in module.cc raises the
// Python exception class of its code (zinf.InvalidArgumentError, zinf.DataLossError, ...)
// with the status's text.
class StatusError : public std::exception {
 public:
  explicit StatusError(Status status) : status_(std::move(status)), what_(status_.ToString()) {}
  const Status& status() const { return status_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  Status status_;
  std::string what_;
};

inline void ThrowIfError(const Status& status) {
  if (!status.ok()) throw StatusError(status);
}

template <typename T>
T ValueOrThrow(StatusOr<T>&& value) {
  if (!value.ok()) throw StatusError(std::move(value).status());
  return std::move(*value);
}

// A C ABI call's code and message (freed here) as a Status.
Status FromC(zinf_code_t code, char* err);

// Runs `call(&err)`, a C ABI call that reports failure through a `char** err`, and throws its
// status. Use this, not FromC(zinf_x(..., &err), err): the order in which a call's arguments
// are evaluated is unspecified, so `err` could be read before zinf_x wrote it, losing the
// message and leaking it.
template <typename Call>
void CheckC(Call&& call) {
  char* err = nullptr;
  const zinf_code_t code = call(&err);
  ThrowIfError(FromC(code, err));
}

// A pointer handed over from Python as an integer; `what` names it in the error.
inline void* Pointer(uintptr_t address, const char* what) {
  if (address == 0) throw StatusError(InvalidArgument(std::string(what) + " is a null pointer"));
  return reinterpret_cast<void*>(address);
}

// ElementType from the names zinf/*.py uses ("float32", "bfloat16", "float16").
ElementType ElementTypeFromName(const std::string& name, const char* what);

void BindOptim(py::module_& m);
void BindNvme(py::module_& m);
void BindEngine(py::module_& m);
void BindLogging(py::module_& m);

}  // namespace zinf::python

#endif  // ZINF_PYTHON_CSRC_BINDING_H_
