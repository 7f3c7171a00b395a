// libzinf_torch_allocator.so: PyTorch's pluggable CUDA allocator entry points
// (torch.cuda.memory.CUDAPluggableAllocator) backed by zinf's device pool (offload/
// memory_pool.h over CudaDevice): large arenas carved best-fit with coalescing, rounded only
// to 256 bytes, under a byte budget. zinf.cuda loads it; it is built only with CUDA.
//
//   void* zinf_torch_malloc(size_t size, int device, cudaStream_t stream);
//   void  zinf_torch_free(void* ptr, size_t size, int device, cudaStream_t stream);
//
// Note [Stream-ordered frees]
// PyTorch frees a tensor's memory when the tensor dies on the host, while kernels queued on
// `stream` may still use it. A block is therefore not returned to the pool at free(): an event
// is recorded on the freeing stream, and the block goes back only once the event has
// completed (checked at every malloc; a malloc that finds no room waits for the parked blocks
// before giving up). So a later allocation, on any stream, never gets memory that queued work
// still reads or writes.
//
// Errors: malloc throws std::runtime_error with zinf's message (a budget exceeded names the
// pool, what is in use and the request); PyTorch turns it into a Python RuntimeError. free never
// throws: a failure is printed to stderr. zinf_torch_allocator_last_error() returns the last
// message of the calling thread.
//
// Thread-safety: all entry points are thread-safe (one mutex per process).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "offload/memory_pool.h"
#include "zinf/device.h"
#include "zinf/status.h"

#define ZINF_TORCH_API extern "C" __attribute__((visibility("default")))

namespace zinf::torch_allocator {
namespace {

thread_local std::string last_error;

// The caller's current device (PyTorch's), restored on scope exit: CudaDevice and the pool
// switch devices, and PyTorch must not see that.
class DeviceGuard {
 public:
  DeviceGuard() { ok_ = cudaGetDevice(&saved_) == cudaSuccess; }
  ~DeviceGuard() {
    if (ok_) cudaSetDevice(saved_);
  }

 private:
  int saved_ = 0;
  bool ok_ = false;
};

struct Parked {
  cudaEvent_t event;
  PoolBlock block;
};

struct DevicePool {
  std::unique_ptr<Device> device;
  std::unique_ptr<MemoryPool> pool;
  std::unordered_map<void*, PoolBlock> live;
  std::vector<Parked> parked;  // oldest first
  std::vector<cudaEvent_t> spare_events;
  uint64_t parked_bytes = 0;
};

struct Config {
  uint64_t budget_bytes = 0;          // 0: CudaDevice's budget (90% of free memory at open)
  uint64_t arena_bytes = 1ull << 30;  // arenas are made as needed, this size or the request's
};

std::mutex mu;
Config config;
// By device ordinal (node-stable references). Never destroyed: PyTorch may free tensors after
// static destructors have run, and the CUDA runtime may be gone by then.
std::map<int, DevicePool>& pools = *new std::map<int, DevicePool>;

Status CudaError(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return OkStatus();
  cudaGetLastError();  // clear it, so it does not surface in PyTorch's next check
  return Internal(std::string(what) + ": " + cudaGetErrorString(err));
}

// A pool on `device` made with the current config.
StatusOr<DevicePool> OpenPool(int device) {
  CudaDeviceOptions device_options;
  device_options.ordinal = device;
  device_options.memory_budget_bytes = config.budget_bytes;
  StatusOr<std::unique_ptr<Device>> created = CreateCudaDevice(device_options);
  if (!created.ok()) return created.status();
  DevicePoolOptions pool_options;
  pool_options.arena_bytes = config.arena_bytes;
  pool_options.name = "torch allocator pool on cuda:" + std::to_string(device);
  StatusOr<std::unique_ptr<MemoryPool>> pool = MemoryPool::CreateOnDevice(**created, pool_options);
  if (!pool.ok()) return pool.status();
  DevicePool p;
  p.device = std::move(*created);
  p.pool = std::move(*pool);
  return p;
}

StatusOr<DevicePool*> PoolFor(int device) {
  auto it = pools.find(device);
  if (it != pools.end()) return &it->second;
  StatusOr<DevicePool> opened = OpenPool(device);
  if (!opened.ok()) return opened.status();
  return &pools.emplace(device, std::move(*opened)).first->second;
}

// Returns parked blocks whose event has completed (all of them, waiting, with `wait`).
Status Reap(DevicePool& p, bool wait) {
  size_t kept = 0;
  Status first_error;
  for (size_t i = 0; i < p.parked.size(); ++i) {
    Parked& parked = p.parked[i];
    cudaError_t err = wait ? cudaEventSynchronize(parked.event) : cudaEventQuery(parked.event);
    if (err == cudaErrorNotReady) {
      if (kept != i) p.parked[kept] = std::move(parked);
      ++kept;
      continue;
    }
    if (err != cudaSuccess && first_error.ok()) first_error = CudaError(err, "cudaEventQuery");
    p.parked_bytes -= parked.block.size_bytes();
    parked.block.Reset();
    p.spare_events.push_back(parked.event);
  }
  p.parked.resize(kept);
  return first_error;
}

void* Malloc(size_t size, int device) {
  if (size == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mu);
  DeviceGuard guard;
  StatusOr<DevicePool*> pool = PoolFor(device);
  if (!pool.ok()) throw std::runtime_error(pool.status().ToString());
  DevicePool& p = **pool;
  Status reaped = Reap(p, /*wait=*/false);
  if (!reaped.ok()) throw std::runtime_error(reaped.ToString());
  StatusOr<PoolBlock> block = p.pool->Allocate(size);
  if (!block.ok() && block.status().code() == StatusCode::kResourceExhausted && !p.parked.empty()) {
    // Memory freed on streams that are still running: wait for it, then try again.
    reaped = Reap(p, /*wait=*/true);
    if (!reaped.ok()) throw std::runtime_error(reaped.ToString());
    block = p.pool->Allocate(size);
  }
  if (!block.ok()) throw std::runtime_error(block.status().ToString());
  void* data = block->data();
  p.live.emplace(data, std::move(*block));
  return data;
}

Status Free(void* ptr, int device, cudaStream_t stream) {
  if (ptr == nullptr) return OkStatus();
  std::lock_guard<std::mutex> lock(mu);
  DeviceGuard guard;
  auto pit = pools.find(device);
  if (pit == pools.end()) {
    return InvalidArgument("free of " + std::to_string(reinterpret_cast<uintptr_t>(ptr)) +
                           " on cuda:" + std::to_string(device) + ", where nothing was allocated");
  }
  DevicePool& p = pit->second;
  auto it = p.live.find(ptr);
  if (it == p.live.end()) {
    return InvalidArgument("free of a pointer this allocator did not hand out (or freed twice)");
  }
  PoolBlock block = std::move(it->second);
  p.live.erase(it);
  ZINF_RETURN_IF_ERROR(CudaError(cudaSetDevice(device), "cudaSetDevice"));
  cudaEvent_t event = nullptr;
  if (!p.spare_events.empty()) {
    event = p.spare_events.back();
    p.spare_events.pop_back();
  } else {
    Status created = CudaError(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                               "cudaEventCreateWithFlags");
    if (!created.ok()) {
      // No event: wait for the stream instead, so that the block is safe to reuse now.
      cudaStreamSynchronize(stream);
      return created;
    }
  }
  Status recorded = CudaError(cudaEventRecord(event, stream), "cudaEventRecord");
  if (!recorded.ok()) {
    cudaStreamSynchronize(stream);
    p.spare_events.push_back(event);
    return recorded;
  }
  p.parked_bytes += block.size_bytes();
  p.parked.push_back({event, std::move(block)});
  return OkStatus();
}

}  // namespace
}  // namespace zinf::torch_allocator

using namespace zinf::torch_allocator;

ZINF_TORCH_API void* zinf_torch_malloc(size_t size, int device, cudaStream_t stream) {
  (void)stream;  // the pool is shared by all streams: see Note [Stream-ordered frees]
  try {
    return Malloc(size, device);
  } catch (const std::exception& e) {
    last_error = e.what();
    throw;
  }
}

ZINF_TORCH_API void zinf_torch_free(void* ptr, size_t size, int device, cudaStream_t stream) {
  (void)size;
  zinf::Status status;
  try {
    status = Free(ptr, device, stream);
  } catch (const std::exception& e) {
    status = zinf::Internal(e.what());
  }
  if (!status.ok()) {
    last_error = status.ToString();
    std::fprintf(stderr, "zinf torch allocator: %s\n", last_error.c_str());
  }
}

// Sets the budget and arena size of the pools made after the call (0 keeps the default).
// Returns 0, or -1 when a pool exists already (the message in last_error).
ZINF_TORCH_API int zinf_torch_allocator_configure(uint64_t budget_bytes, uint64_t arena_bytes) {
  std::lock_guard<std::mutex> lock(mu);
  if (!pools.empty()) {
    last_error = "zinf_torch_allocator_configure: call it before the first allocation";
    return -1;
  }
  config.budget_bytes = budget_bytes;
  if (arena_bytes != 0) config.arena_bytes = arena_bytes;
  return 0;
}

// Bytes in live blocks, their peak, bytes parked behind a stream (Note [Stream-ordered
// frees]) and bytes held by arenas on `device`. Returns 0, or -1 when the device has no pool.
ZINF_TORCH_API int zinf_torch_allocator_stats(int device, uint64_t* in_use_bytes,
                                              uint64_t* peak_bytes, uint64_t* parked_bytes,
                                              uint64_t* arena_bytes) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = pools.find(device);
  if (it == pools.end()) {
    last_error = "no allocation was made on cuda:" + std::to_string(device);
    return -1;
  }
  const zinf::MemoryPoolStats stats = it->second.pool->stats();
  if (in_use_bytes != nullptr) *in_use_bytes = stats.in_use_bytes;
  if (peak_bytes != nullptr) *peak_bytes = stats.peak_in_use_bytes;
  if (parked_bytes != nullptr) *parked_bytes = it->second.parked_bytes;
  if (arena_bytes != nullptr) *arena_bytes = stats.arena_bytes;
  return 0;
}

// Opens zinf's pool on `device` (what the first malloc there does) without allocating: 0 when
// it can, -1 with the reason in last_error (no GPU, no such device, ...). Never throws.
ZINF_TORCH_API int zinf_torch_allocator_probe(int device) {
  try {
    std::lock_guard<std::mutex> lock(mu);
    DeviceGuard guard;
    // A pool opened here and dropped again, so that zinf_torch_allocator_configure still
    // applies to the pool the first allocation makes.
    if (pools.count(device) != 0) return 0;
    zinf::StatusOr<DevicePool> pool = OpenPool(device);
    if (!pool.ok()) {
      last_error = pool.status().ToString();
      return -1;
    }
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return -1;
  }
}

// The calling thread's last error message ("" when none); valid until its next call.
ZINF_TORCH_API const char* zinf_torch_allocator_last_error(void) { return last_error.c_str(); }
