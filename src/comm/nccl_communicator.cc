// The NCCL backend: GPU buffers, collectives on the communicator's own CUDA stream. The
// communicator is created non-blocking and every wait polls the stream and
// ncclCommGetAsyncError against a deadline, so a dead peer aborts the communicator and fails
// the call instead of hanging it (NCCL's blocking calls would wait forever). NCCL itself is
// loaded by the first communicator (Note [NCCL loaded on first use]).
#include <cuda_runtime.h>
#include <fmt/core.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "comm/communicator.h"
#include "comm/tcp_store.h"
#include "offload/cuda/nccl_library.h"

namespace zinf {
namespace {

using Clock = std::chrono::steady_clock;

Status NcclError(const NcclLibrary& nccl, ncclResult_t r, std::string_view what) {
  const std::string m = fmt::format("{}: {}", what, nccl.GetErrorString(r));
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return InvalidArgument(m);
    case ncclRemoteError:
    case ncclSystemError:
      return Unavailable(m + "; a peer rank may have died");
    default:
      return Internal(m);
  }
}

ncclDataType_t NcclType(ElementType type) {
  switch (type) {
    case ElementType::kFp32:
      return ncclFloat32;
    case ElementType::kFp64:
      return ncclFloat64;
    case ElementType::kInt64:
      return ncclInt64;
    case ElementType::kBf16:
      return ncclBfloat16;
    case ElementType::kFp16:
      return ncclFloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

// Waits until NCCL has left the in-progress state (init) or `stream` is idle, or the deadline.
Status WaitFor(const NcclLibrary& nccl, ncclComm_t comm, cudaStream_t stream,
               std::chrono::milliseconds timeout, std::string_view what) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = nccl.CommGetAsyncError(comm, &async);
    if (r != ncclSuccess) return NcclError(nccl, r, what);
    if (async != ncclSuccess && async != ncclInProgress) {
      nccl.CommAbort(comm);
      return NcclError(nccl, async, what);
    }
    if (async == ncclSuccess) {
      if (stream == nullptr) return OkStatus();
      const cudaError_t q = cudaStreamQuery(stream);
      if (q == cudaSuccess) return OkStatus();
      if (q != cudaErrorNotReady) {
        return Internal(fmt::format("{}: {}", what, cudaGetErrorString(q)));
      }
    }
    if (Clock::now() > deadline) {
      nccl.CommAbort(comm);
      return DeadlineExceeded(
          fmt::format("{}: no progress within {} ms; a peer rank may have "
                      "died or stalled (the communicator was aborted)",
                      what, timeout.count()));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const NcclLibrary& nccl, const NcclOptions& options, ncclComm_t comm,
                   cudaStream_t stream, float* scratch)
      : Communicator(options.rank, options.world_size),
        nccl_(nccl),
        device_(options.device),
        timeout_(options.timeout),
        comm_(comm),
        stream_(stream),
        scratch_(scratch) {
    StartWorker();
  }
  ~NcclCommunicator() override {
    StopWorker();
    cudaSetDevice(device_);
    if (status().ok()) nccl_.CommDestroy(comm_);  // an aborted communicator is already gone
    cudaFree(scratch_);
    cudaStreamDestroy(stream_);
  }
  std::string_view backend() const override { return "nccl"; }

 protected:
  Status DoAllReduce(void* data, size_t count, ElementType type, ReduceOp op) override {
    return Run("ncclAllReduce", [&] {
      return nccl_.AllReduce(data, data, count, NcclType(type), NcclOp(op), comm_, stream_);
    });
  }
  Status DoAllGather(const void* send, void* recv, size_t count, ElementType type) override {
    return Run("ncclAllGather",
               [&] { return nccl_.AllGather(send, recv, count, NcclType(type), comm_, stream_); });
  }
  Status DoReduceScatter(void* send, void* recv, size_t count, ElementType type,
                         ReduceOp op) override {
    return Run("ncclReduceScatter", [&] {
      return nccl_.ReduceScatter(send, recv, count, NcclType(type), NcclOp(op), comm_, stream_);
    });
  }
  Status DoBroadcast(void* data, size_t count, ElementType type, int root) override {
    return Run("ncclBroadcast", [&] {
      return nccl_.Broadcast(data, data, count, NcclType(type), root, comm_, stream_);
    });
  }
  Status DoBarrier() override {
    return Run("barrier (ncclAllReduce of one float)", [&] {
      return nccl_.AllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_);
    });
  }

 private:
  template <typename Fn>
  Status Run(std::string_view what, Fn&& launch) {
    cudaSetDevice(device_);
    const ncclResult_t r = launch();
    if (r != ncclSuccess && r != ncclInProgress) return NcclError(nccl_, r, what);
    return WaitFor(nccl_, comm_, stream_, timeout_, what);
  }

  const NcclLibrary& nccl_;
  const int device_;
  const std::chrono::milliseconds timeout_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  float* scratch_;
};

}  // namespace

StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(TcpStore& store,
                                                               const NcclOptions& options) {
  ZINF_RETURN_IF_ERROR(options.Validate());
  ZINF_ASSIGN_OR_RETURN(const NcclLibrary* loaded, LoadNccl());
  const NcclLibrary& nccl = *loaded;
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    cudaGetLastError();
    return Unavailable("NCCL needs a GPU and none is usable");
  }
  if (options.device < 0 || options.device >= gpus) {
    return InvalidArgument(fmt::format("device must be in [0, {}), got {}", gpus, options.device));
  }
  const std::string key = fmt::format("nccl/{}/unique_id", options.group_name);
  ncclUniqueId id;
  if (options.rank == 0) {
    const ncclResult_t r = nccl.GetUniqueId(&id);
    if (r != ncclSuccess) return NcclError(nccl, r, "ncclGetUniqueId");
    ZINF_RETURN_IF_ERROR(
        store.Set(key, std::vector<uint8_t>(id.internal, id.internal + sizeof(id.internal))));
  } else {
    ZINF_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, store.Get(key));
    if (bytes.size() != sizeof(id.internal)) {
      return DataLoss(fmt::format("NCCL unique id in the store has {} bytes, expected {}",
                                  bytes.size(), sizeof(id.internal)));
    }
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }
  cudaSetDevice(options.device);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r =
      nccl.CommInitRankConfig(&comm, options.world_size, id, options.rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) return NcclError(nccl, r, "ncclCommInitRankConfig");
  ZINF_RETURN_IF_ERROR(WaitFor(nccl, comm, nullptr, options.timeout,
                               fmt::format("rank {} of {} connecting NCCL group '{}'", options.rank,
                                           options.world_size, options.group_name)));
  cudaStream_t stream = nullptr;
  float* scratch = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMalloc(&scratch, sizeof(float)) != cudaSuccess) {
    nccl.CommDestroy(comm);
    if (stream != nullptr) cudaStreamDestroy(stream);
    return Internal("creating the NCCL communicator's stream or scratch buffer failed");
  }
  return std::unique_ptr<Communicator>(
      std::make_unique<NcclCommunicator>(nccl, options, comm, stream, scratch));
}

}  // namespace zinf
