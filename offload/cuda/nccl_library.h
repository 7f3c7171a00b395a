// NCCL, loaded the first time it is needed instead of linked (Note [NCCL loaded on first use]).
//
// Thread-safety: LoadNccl may be called from any thread; the table it returns is immutable.
#ifndef ZINF_OFFLOAD_CUDA_NCCL_LIBRARY_H_
#define ZINF_OFFLOAD_CUDA_NCCL_LIBRARY_H_

#include <nccl.h>

#include "zinf/status.h"

namespace zinf {

// Note [NCCL loaded on first use]
// libzinf.so does not link libnccl. A CUDA build then loads, imports and runs everywhere
// CUDA does, and only an NCCL communicator (or `zinf info`'s NCCL version) needs NCCL, saying
// so where it is missing. And zinf uses the NCCL the process has already: PyTorch from pip
// links its own, newer than the CUDA toolkit's, and while libzinf linked NCCL, whichever
// libnccl.so.2 the loader mapped first served both, so `import zinf, torch` broke torch
// (`undefined symbol: ncclCommResume`). dlopen("libnccl.so.2") returns the library already
// loaded under that name, torch's when torch came first, and otherwise searches the loader's
// path (LD_LIBRARY_PATH, ld.so.conf).
struct NcclLibrary {
  decltype(&ncclGetVersion) GetVersion;
  decltype(&ncclGetErrorString) GetErrorString;
  decltype(&ncclGetUniqueId) GetUniqueId;
  decltype(&ncclCommInitRankConfig) CommInitRankConfig;
  decltype(&ncclCommGetAsyncError) CommGetAsyncError;
  decltype(&ncclCommAbort) CommAbort;
  decltype(&ncclCommDestroy) CommDestroy;
  decltype(&ncclAllReduce) AllReduce;
  decltype(&ncclAllGather) AllGather;
  decltype(&ncclReduceScatter) ReduceScatter;
  decltype(&ncclBroadcast) Broadcast;
};

// The process's NCCL, loaded by the first call. Unavailable, with the loader's message, where
// no libnccl.so.2 loads or it lacks one of the functions above; every later call returns the
// same result.
StatusOr<const NcclLibrary*> LoadNccl();

}  // namespace zinf

#endif  // ZINF_OFFLOAD_CUDA_NCCL_LIBRARY_H_
