// The C ABI of the NVMe swap store (zinf_swap_store_*), over zinf::SwapStore; asynchronous
// reads and writes finish zinf_completion_t handles.
//
// Thread-safety: as SwapStore: all calls may run concurrently, except that an extent must not
// be written while it is read, written or freed elsewhere.
#include <nlohmann/json.hpp>

#include <string>

#include "capi/capi_internal.h"
#include "capi/completion.h"
#include "core/config_reader.h"
#include "nvme/swap_store.h"
#include "zinf/c_api.h"

namespace zinf::capi {

template <>
struct HandleTraits<zinf_swap_store_t> {
  using Object = SwapStore;
  static constexpr HandleKind kKind = HandleKind::kSwapStore;
};

namespace {

StatusOr<SwapStoreOptions> ToOptions(const zinf_swap_store_options_t* in) {
  zinf_swap_store_options_t c;
  zinf_swap_store_options_init(&c);
  ZINF_RETURN_IF_ERROR(
      ReadStruct(in, "options", "zinf_swap_store_options_t", "zinf_swap_store_options_init", &c));
  SwapStoreOptions o;
  if (c.path_count > 0 && c.paths == nullptr) {
    return InvalidArgument("options->paths is NULL with path_count " +
                           std::to_string(c.path_count));
  }
  for (size_t i = 0; i < c.path_count; ++i) {
    if (c.paths[i] == nullptr) {
      return InvalidArgument("options->paths[" + std::to_string(i) + "] is NULL");
    }
    o.paths.emplace_back(c.paths[i]);
  }
  o.rank = c.rank;
  o.capacity_bytes = c.capacity_bytes;
  o.stripe_bytes = c.stripe_bytes;
  o.checksum = c.checksum != 0;
  o.lock_wait_ms = c.lock_wait_ms;
  if (c.aio_json != nullptr) {
    ZINF_ASSIGN_OR_RETURN(const nlohmann::json aio, ParseJson(c.aio_json, "options->aio_json"));
    ZINF_RETURN_IF_ERROR(ReadAioOptions(aio, "options->aio_json", &o.aio));
  }
  return o;
}

SwapExtent ToExtent(zinf_swap_extent_t e) { return SwapExtent{e.id, e.size_bytes}; }

// Starts an asynchronous read or write and hands its completion to C.
template <typename Start>
Status StartIo(zinf_completion_t** completion, Start&& start) {
  ZINF_RETURN_IF_ERROR(CheckNotNull(completion, "completion"));
  *completion = nullptr;
  auto c = std::make_shared<Completion>();
  IoCallback done = c->Callback();
  // Registered before the I/O starts, so that a handle exists whenever the callback runs.
  zinf_completion_t* handle = NewHandle<zinf_completion_t>(std::move(c));
  IoCallback finish = done;
  try {
    start(std::move(done));
  } catch (...) {
    // The handle exists: its outcome, not this call's, reports the failure, and
    // zinf_completion_destroy must not wait for a callback that will never run.
    finish(StatusFromCurrentException());
  }
  *completion = handle;
  return OkStatus();
}

}  // namespace
}  // namespace zinf::capi

using zinf::OkStatus;
using zinf::Status;
using zinf::capi::CheckNotNull;
using zinf::capi::Run;
using zinf::capi::ToExtent;

extern "C" {

void zinf_swap_store_options_init(zinf_swap_store_options_t* options) {
  if (options == nullptr) return;
  const zinf::SwapStoreOptions d;
  *options = zinf_swap_store_options_t{};
  options->struct_size = sizeof(*options);
  options->capacity_bytes = d.capacity_bytes;
  options->stripe_bytes = d.stripe_bytes;
  options->rank = d.rank;
  options->checksum = d.checksum ? 1 : 0;
  options->lock_wait_ms = d.lock_wait_ms;
}

zinf_code_t zinf_swap_store_open(const zinf_swap_store_options_t* options,
                                 zinf_swap_store_t** store, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(CheckNotNull(store, "store"));
    *store = nullptr;
    ZINF_ASSIGN_OR_RETURN(auto o, zinf::capi::ToOptions(options));
    ZINF_ASSIGN_OR_RETURN(std::shared_ptr<zinf::SwapStore> opened, zinf::SwapStore::Open(o));
    *store = zinf::capi::NewHandle<zinf_swap_store_t>(std::move(opened));
    return OkStatus();
  });
}

void zinf_swap_store_destroy(zinf_swap_store_t* store) {
  try {
    zinf::capi::TakeHandle(store).reset();
  } catch (...) {
  }
}

zinf_code_t zinf_swap_store_allocate(zinf_swap_store_t* store, uint64_t size_bytes,
                                     const char* name, zinf_swap_extent_t* extent, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto s, zinf_swap_store_t, store);
    ZINF_RETURN_IF_ERROR(CheckNotNull(extent, "extent"));
    ZINF_ASSIGN_OR_RETURN(zinf::SwapExtent e,
                          s->Allocate(size_bytes, name != nullptr ? name : "(unnamed)"));
    *extent = zinf_swap_extent_t{e.id, e.size_bytes};
    return OkStatus();
  });
}

zinf_code_t zinf_swap_store_free(zinf_swap_store_t* store, zinf_swap_extent_t extent,
                                 char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto s, zinf_swap_store_t, store);
    return s->Free(ToExtent(extent));
  });
}

zinf_code_t zinf_swap_store_write_async(zinf_swap_store_t* store, zinf_swap_extent_t extent,
                                        const void* src, zinf_completion_t** completion,
                                        char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    if (completion != nullptr) *completion = nullptr;
    ZINF_CAPI_GET(auto s, zinf_swap_store_t, store);
    ZINF_RETURN_IF_ERROR(CheckNotNull(src, "src"));
    return zinf::capi::StartIo(completion, [&](zinf::IoCallback done) {
      s->WriteAsync(ToExtent(extent), src, std::move(done));
    });
  });
}

zinf_code_t zinf_swap_store_read_async(zinf_swap_store_t* store, zinf_swap_extent_t extent,
                                       void* dst, zinf_completion_t** completion, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    if (completion != nullptr) *completion = nullptr;
    ZINF_CAPI_GET(auto s, zinf_swap_store_t, store);
    ZINF_RETURN_IF_ERROR(CheckNotNull(dst, "dst"));
    return zinf::capi::StartIo(completion, [&](zinf::IoCallback done) {
      s->ReadAsync(ToExtent(extent), dst, std::move(done));
    });
  });
}

zinf_code_t zinf_swap_store_write(zinf_swap_store_t* store, zinf_swap_extent_t extent,
                                  const void* src, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto s, zinf_swap_store_t, store);
    ZINF_RETURN_IF_ERROR(CheckNotNull(src, "src"));
    return s->Write(ToExtent(extent), src);
  });
}

zinf_code_t zinf_swap_store_read(zinf_swap_store_t* store, zinf_swap_extent_t extent, void* dst,
                                 char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto s, zinf_swap_store_t, store);
    ZINF_RETURN_IF_ERROR(CheckNotNull(dst, "dst"));
    return s->Read(ToExtent(extent), dst);
  });
}

zinf_code_t zinf_swap_store_register_buffer(zinf_swap_store_t* store, void* data,
                                            uint64_t size_bytes, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto s, zinf_swap_store_t, store);
    ZINF_RETURN_IF_ERROR(CheckNotNull(data, "data"));
    return s->RegisterBuffer(data, size_bytes);
  });
}

zinf_code_t zinf_swap_store_status(zinf_swap_store_t* store, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto s, zinf_swap_store_t, store);
    return s->status();
  });
}

zinf_code_t zinf_swap_store_info(zinf_swap_store_t* store, zinf_swap_store_info_t* info,
                                 char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto s, zinf_swap_store_t, store);
    zinf_swap_store_info_t c{};
    c.capacity_bytes = s->capacity_bytes();
    c.free_bytes = s->free_bytes();
    c.file_bytes = s->file_bytes();
    c.stripe_bytes = s->stripe_bytes();
    c.file_count = s->file_paths().size();
    c.direct_io = s->direct_io() ? 1 : 0;
    return zinf::capi::WriteStruct(c, "info", "zinf_swap_store_info_t", info);
  });
}

}  // extern "C"
