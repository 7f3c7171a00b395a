// What every part of the C ABI (include/zinf/c_api.h) shares: the handle registry, the
// conversion of a Status (or an exception) into a code and a malloc()ed message, and the
// reading of caller structs that carry their own size.
//
// Thread-safety: the registry is thread-safe; the helpers are pure functions.
#ifndef ZINF_CAPI_CAPI_INTERNAL_H_
#define ZINF_CAPI_CAPI_INTERNAL_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "zinf/c_api.h"
#include "zinf/cpu_optimizer.h"
#include "zinf/status.h"

namespace zinf::capi {

// Note [C handles]
// A handle given to C is not the address of an object but a number: a registry id shifted left
// by 4 bits, ids counting up from 1 and never reused. The registry maps live ids to a
// shared_ptr of the object and the kind of handle. So a call on a destroyed handle is told
// apart from one on a live handle reusing its address (malloc reuses addresses at once), and is
// reported as FailedPrecondition instead of touching freed memory; a pointer that was never a
// handle (or the wrong kind) is InvalidArgument. A call holds its own reference to the object
// for its duration, so destroying a handle while another thread is inside a call on it frees
// the object when that call returns, not under it. Nothing is destroyed at process exit: the
// registry is never freed, because running destructors (threads, swap files) during static
// destruction is how a library hangs a process on its way out.

enum class HandleKind : uint32_t {
  kCompletion = 1,
  kTieredStore,
  kPinnedPool,
  kSwapStore,
  kCpuOptimizer,
  kEngine,
};
const char* HandleKindName(HandleKind kind);  // "zinf_tiered_store_t", ...

// Registers `object` and returns its handle value.
void* RegisterHandle(HandleKind kind, std::shared_ptr<void> object);
// The object of a live handle of `kind`. `arg` names the argument in errors.
StatusOr<std::shared_ptr<void>> LookupHandle(const void* handle, HandleKind kind, const char* arg);
// Removes a live handle of `kind` and returns its object (null when the handle is not live; the
// reason is logged). The caller drops it outside the registry's lock.
std::shared_ptr<void> UnregisterHandle(const void* handle, HandleKind kind);

// The C++ object behind each C handle type.
template <typename CType>
struct HandleTraits;

template <typename CType>
using HandleObject = typename HandleTraits<CType>::Object;

template <typename CType>
CType* NewHandle(std::shared_ptr<HandleObject<CType>> object) {
  return static_cast<CType*>(RegisterHandle(HandleTraits<CType>::kKind, std::move(object)));
}

template <typename CType>
StatusOr<std::shared_ptr<HandleObject<CType>>> GetHandle(const CType* handle, const char* arg) {
  auto object = LookupHandle(handle, HandleTraits<CType>::kKind, arg);
  if (!object.ok()) return std::move(object).status();
  return std::static_pointer_cast<HandleObject<CType>>(*std::move(object));
}

// `ZINF_CAPI_GET(auto store, zinf_tiered_store_t, store);` declares a shared_ptr to the object
// behind the argument `store`, or returns the error.
#define ZINF_CAPI_GET(lhs, ctype, arg) \
  ZINF_ASSIGN_OR_RETURN(lhs, ::zinf::capi::GetHandle<ctype>(arg, #arg))

template <typename CType>
std::shared_ptr<HandleObject<CType>> TakeHandle(const CType* handle) {
  return std::static_pointer_cast<HandleObject<CType>>(
      UnregisterHandle(handle, HandleTraits<CType>::kKind));
}

// ---- Errors ----

// The Status of the exception being handled (call only inside a catch block).
Status StatusFromCurrentException() noexcept;

// Returns status's code; on failure stores "function: Code: message" in *errptr (freeing the
// old value) when errptr is not null.
zinf_code_t Report(const char* function, const Status& status, char** errptr) noexcept;

// Runs `body` (a callable returning Status) so that no exception escapes, and reports its
// outcome. Every C entry point is one call of this.
template <typename F>
zinf_code_t Run(const char* function, char** errptr, F&& body) noexcept {
  Status status;
  try {
    status = body();
  } catch (...) {
    status = StatusFromCurrentException();
  }
  return Report(function, status, errptr);
}

// A malloc()ed copy of `s` (for strings handed to C), or null when malloc fails.
char* MallocString(const std::string& s) noexcept;

// ---- Arguments ----

// How C reaches a member of the argument `arg` in messages: "->" for a pointer ("options"),
// "." for an array element ("params[1]").
const char* MemberOf(const char* arg);

// InvalidArgument "<arg> is NULL" unless `pointer` is set.
Status CheckNotNull(const void* pointer, const char* arg);

// Note [Versioned structs]
// A struct that may grow starts with size_t struct_size, which the caller sets to sizeof the
// struct its header declared. Reading one, the library takes the fields that fit in
// struct_size and leaves the rest at their defaults (a caller built against an older header);
// bytes past the struct this library knows must be zero (a caller built against a newer
// header that uses none of the new fields). Below the first version's size, or implausibly
// large (an uninitialised field, most likely), it is InvalidArgument naming the struct and the
// function that initialises it. This is the rule of Linux's copy_struct_from_user. Output
// structs are filled up to struct_size, and at least the first version's fields.

// Bytes past what this library knows that a caller may pass, at most: more is garbage.
inline constexpr size_t kMaxStructGrowth = 4096;

Status CheckStructSize(size_t struct_size, size_t min_size, size_t known_size, const void* base,
                       const char* arg, const char* type_name, const char* init_function);

// Reads the caller's *in over *out (which holds the defaults). `min_size` is the size of the
// struct's first version (today's size for every struct in version 1 of the ABI).
template <typename T>
Status ReadStruct(const T* in, const char* arg, const char* type_name, const char* init_function,
                  T* out, size_t min_size = sizeof(T)) {
  ZINF_RETURN_IF_ERROR(CheckNotNull(in, arg));
  ZINF_RETURN_IF_ERROR(
      CheckStructSize(in->struct_size, min_size, sizeof(T), in, arg, type_name, init_function));
  const size_t struct_size = out->struct_size;
  std::memcpy(static_cast<void*>(out), in, std::min(in->struct_size, sizeof(T)));
  out->struct_size = struct_size;
  return OkStatus();
}

// Checks the caller's output struct *out (not null, a plausible struct_size) without writing.
template <typename T>
Status CheckOutputStruct(const T* out, const char* arg, const char* type_name,
                         size_t min_size = sizeof(T)) {
  ZINF_RETURN_IF_ERROR(CheckNotNull(out, arg));
  const size_t struct_size = out->struct_size;
  if (struct_size < min_size || struct_size > sizeof(T) + kMaxStructGrowth) {
    return InvalidArgument(std::string(arg) + MemberOf(arg) + "struct_size is " +
                           std::to_string(struct_size) + "; set it to sizeof(" + type_name + ") (" +
                           std::to_string(sizeof(T)) + " in this library)");
  }
  return OkStatus();
}

// Writes `value` into the caller's *out, up to out->struct_size bytes.
template <typename T>
Status WriteStruct(T value, const char* arg, const char* type_name, T* out,
                   size_t min_size = sizeof(T)) {
  ZINF_RETURN_IF_ERROR(CheckOutputStruct(out, arg, type_name, min_size));
  value.struct_size = out->struct_size;
  std::memcpy(static_cast<void*>(out), &value, std::min(out->struct_size, sizeof(T)));
  return OkStatus();
}

// A caller's zinf_hyper_params_t (`arg` names it in errors), and back (cpu_optimizer_c.cc).
StatusOr<OptimizerHyperParams> HyperParamsFromC(const zinf_hyper_params_t* in, const char* arg);
zinf_hyper_params_t HyperParamsToC(const OptimizerHyperParams& hp);

}  // namespace zinf::capi

#endif  // ZINF_CAPI_CAPI_INTERNAL_H_
