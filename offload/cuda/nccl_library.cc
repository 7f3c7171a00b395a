#include "offload/cuda/nccl_library.h"

#include <dlfcn.h>
#include <fmt/core.h>

#include <string>
#include <type_traits>

namespace zinf {
namespace {

constexpr const char* kNcclSoname = "libnccl.so.2";

StatusOr<NcclLibrary> Load() {
  dlerror();
  // Never closed: collectives may run until the process exits.
  void* handle = dlopen(kNcclSoname, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return Unavailable(fmt::format(
        "NCCL is not loadable ({}): install it (or put its directory on LD_LIBRARY_PATH), or "
        "import torch first, whose CUDA builds bring their own",
        why != nullptr ? why : kNcclSoname));
  }
  NcclLibrary nccl{};
  Status missing;
  auto bind = [&](auto& function, const char* name) {
    function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(dlsym(handle, name));
    if (function == nullptr && missing.ok()) {
      missing = Unavailable(
          fmt::format("the loaded {} has no {}: NCCL 2.14 or later is needed", kNcclSoname, name));
    }
  };
  bind(nccl.GetVersion, "ncclGetVersion");
  bind(nccl.GetErrorString, "ncclGetErrorString");
  bind(nccl.GetUniqueId, "ncclGetUniqueId");
  bind(nccl.CommInitRankConfig, "ncclCommInitRankConfig");
  bind(nccl.CommGetAsyncError, "ncclCommGetAsyncError");
  bind(nccl.CommAbort, "ncclCommAbort");
  bind(nccl.CommDestroy, "ncclCommDestroy");
  bind(nccl.AllReduce, "ncclAllReduce");
  bind(nccl.AllGather, "ncclAllGather");
  bind(nccl.ReduceScatter, "ncclReduceScatter");
  bind(nccl.Broadcast, "ncclBroadcast");
  if (!missing.ok()) return missing;
  return nccl;
}

}  // namespace

StatusOr<const NcclLibrary*> LoadNccl() {
  static const StatusOr<NcclLibrary> loaded = Load();
  if (!loaded.ok()) return loaded.status();
  return &*loaded;
}

}  // namespace zinf
