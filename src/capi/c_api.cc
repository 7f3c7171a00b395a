// The C ABI's common entry points: codes, version, zinf_free and completions.
//
// Thread-safety: all of these may be called from any thread.
#include "zinf/c_api.h"

#include <cstdlib>

#include "capi/capi_internal.h"
#include "capi/completion.h"
#include "core/log.h"

#ifndef ZINF_VERSION_STRING
#error "ZINF_VERSION_STRING must be defined by the build (src/capi/CMakeLists.txt)"
#endif

using zinf::OkStatus;
using zinf::Status;
using zinf::capi::Completion;
using zinf::capi::Run;

extern "C" {

const char* zinf_code_name(int code) {
  switch (code) {
    case ZINF_OK:
      return "OK";
    case ZINF_INVALID_ARGUMENT:
      return "InvalidArgument";
    case ZINF_FAILED_PRECONDITION:
      return "FailedPrecondition";
    case ZINF_RESOURCE_EXHAUSTED:
      return "ResourceExhausted";
    case ZINF_UNAVAILABLE:
      return "Unavailable";
    case ZINF_IO_ERROR:
      return "IoError";
    case ZINF_DATA_LOSS:
      return "DataLoss";
    case ZINF_CANCELLED:
      return "Cancelled";
    case ZINF_DEADLINE_EXCEEDED:
      return "DeadlineExceeded";
    case ZINF_INTERNAL:
      return "Internal";
  }
  return "Unknown";
}

const char* zinf_version(void) { return ZINF_VERSION_STRING; }

int zinf_c_api_version(void) { return ZINF_C_API_VERSION; }

void zinf_free(void* ptr) { std::free(ptr); }

zinf_code_t zinf_completion_wait(zinf_completion_t* completion, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto c, zinf_completion_t, completion);
    return c->Wait();
  });
}

zinf_code_t zinf_completion_poll(zinf_completion_t* completion, int* done, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto c, zinf_completion_t, completion);
    ZINF_RETURN_IF_ERROR(zinf::capi::CheckNotNull(done, "done"));
    std::optional<Status> outcome = c->Poll();
    *done = outcome.has_value() ? 1 : 0;
    return outcome.value_or(OkStatus());
  });
}

void zinf_completion_destroy(zinf_completion_t* completion) {
  try {
    std::shared_ptr<Completion> c = zinf::capi::TakeHandle(completion);
    // The operation may still write into the caller's buffer: see the header.
    if (c) c->Wait().IgnoreError();
  } catch (...) {
    zinf::log::Error("{}: {}", __func__, zinf::capi::StatusFromCurrentException());
  }
}

}  // extern "C"
