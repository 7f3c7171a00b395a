// CudaDevice: the Device contract on the CUDA runtime. Memory comes from the device's
// stream-ordered pool (cudaMallocAsync), kept cached by a release threshold so repeated
// allocation is cheap; streams are non-blocking CUDA streams; host memory handed out for
// copies is registered with cudaHostRegister (installed as the process's HostPinner).
//
// Thread-safety: as in offload/device.h. Every entry point sets the device first, so callers
// may use several CudaDevices from one thread.
#include <cuda_runtime.h>
#include <fmt/core.h>

#include <atomic>
#include <mutex>

#include "core/log.h"
#include "core/memory_budget.h"
#include "core/units.h"
#include "offload/cuda/cuda_status.h"
#include "zinf/device.h"

namespace zinf {
namespace {

class CudaHostPinner final : public HostPinner {
 public:
  std::string_view name() const override { return "cudaHostRegister"; }
  Status Pin(void* data, size_t size_bytes) override {
    return CudaStatus(cudaHostRegister(data, size_bytes, cudaHostRegisterDefault),
                      fmt::format("cudaHostRegister of {}", FormatBytes(size_bytes)));
  }
  void Unpin(void* data, size_t) override {
    const cudaError_t err = cudaHostUnregister(data);
    if (err != cudaSuccess) log::Error("cudaHostUnregister: {}", cudaGetErrorString(err));
  }
};

CudaHostPinner g_cuda_pinner;

struct DeviceState {
  DeviceState(int device_ordinal, std::string device_name, uint64_t budget_bytes)
      : ordinal(device_ordinal),
        name(std::move(device_name)),
        budget(fmt::format("cuda:{} memory", device_ordinal), budget_bytes) {}

  Status CheckOpen() const {
    if (closed.load(std::memory_order_acquire)) {
      return FailedPrecondition(fmt::format("{} was used after the device was destroyed", name));
    }
    return CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice");
  }

  const int ordinal;
  const std::string name;
  MemoryBudget budget;
  std::atomic<bool> closed{false};
  cudaStream_t alloc_stream = nullptr;  // allocations and frees are ordered on this stream
  TransferCounters counters;            // counted as the calls are made (Note [Transfer counters])
};

class CudaAllocator final : public internal::DeviceAllocator {
 public:
  explicit CudaAllocator(std::shared_ptr<DeviceState> state) : state_(std::move(state)) {}

  ~CudaAllocator() override {
    if (state_->alloc_stream != nullptr) {
      cudaSetDevice(state_->ordinal);
      cudaStreamSynchronize(state_->alloc_stream);
      cudaStreamDestroy(state_->alloc_stream);
    }
  }

  StatusOr<DeviceBuffer> Allocate(size_t size_bytes, std::shared_ptr<CudaAllocator> self) {
    ZINF_RETURN_IF_ERROR(state_->CheckOpen());
    if (size_bytes == 0) return DeviceBuffer();
    ZINF_RETURN_IF_ERROR(state_->budget.Reserve(size_bytes));
    void* data = nullptr;
    Status status = CudaStatus(cudaMallocAsync(&data, size_bytes, state_->alloc_stream),
                               fmt::format("cudaMallocAsync of {}", FormatBytes(size_bytes)));
    // The allocation must be usable from any stream once we return.
    if (status.ok()) {
      status = CudaStatus(cudaStreamSynchronize(state_->alloc_stream), "cudaStreamSynchronize");
    }
    if (!status.ok()) {
      state_->budget.Release(size_bytes);
      return status.WithContext(state_->name);
    }
    return DeviceBuffer(data, size_bytes, std::move(self));
  }

  void Free(void* data, size_t size_bytes) noexcept override {
    cudaSetDevice(state_->ordinal);
    const cudaError_t err = cudaFreeAsync(data, state_->alloc_stream);
    if (err != cudaSuccess)
      log::Error("{}: cudaFreeAsync: {}", state_->name, cudaGetErrorString(err));
    state_->budget.Release(size_bytes);
  }

  std::shared_ptr<DeviceState> state_;
};

class CudaEvent final : public Event {
 public:
  CudaEvent(std::shared_ptr<DeviceState> device, cudaEvent_t event, bool timing)
      : device_(std::move(device)), event_(event), timing_(timing) {}
  ~CudaEvent() override {
    cudaSetDevice(device_->ordinal);
    cudaEventDestroy(event_);
  }

  StatusOr<bool> Query() override {
    ZINF_RETURN_IF_ERROR(device_->CheckOpen());
    const cudaError_t err = cudaEventQuery(event_);
    if (err == cudaErrorNotReady) return false;
    ZINF_RETURN_IF_ERROR(CudaStatus(err, "cudaEventQuery"));
    return true;
  }

  Status Synchronize() override {
    ZINF_RETURN_IF_ERROR(device_->CheckOpen());
    device_->counters.CountWait();
    return CudaStatus(cudaEventSynchronize(event_), "cudaEventSynchronize");
  }

  StatusOr<double> ElapsedMsSince(const Event& start_event) const override {
    const auto* start = dynamic_cast<const CudaEvent*>(&start_event);
    if (start == nullptr || start->device_ != device_) {
      return InvalidArgument("ElapsedMsSince: the start event belongs to another device");
    }
    if (!timing_ || !start->timing_) {
      return FailedPrecondition("ElapsedMsSince: event was created without enable_timing");
    }
    ZINF_RETURN_IF_ERROR(device_->CheckOpen());
    float ms = 0;
    const cudaError_t err = cudaEventElapsedTime(&ms, start->event_, event_);
    if (err == cudaErrorNotReady || err == cudaErrorInvalidResourceHandle) {
      cudaGetLastError();  // clear the non-sticky error
      return FailedPrecondition("ElapsedMsSince: event not recorded or not yet complete");
    }
    ZINF_RETURN_IF_ERROR(CudaStatus(err, "cudaEventElapsedTime"));
    return static_cast<double>(ms);
  }

  const std::shared_ptr<DeviceState>& device() const { return device_; }
  cudaEvent_t handle() const { return event_; }

 private:
  std::shared_ptr<DeviceState> device_;
  cudaEvent_t event_;
  bool timing_;
};

class CudaStream final : public Stream {
 public:
  // `owned`: created here, synchronized and destroyed with this object; else borrowed
  // (Device::BorrowStream) and left as it is.
  CudaStream(std::shared_ptr<DeviceState> device, cudaStream_t stream, bool owned = true)
      : device_(std::move(device)),
        stream_(stream),
        owned_(owned),
        sticky_(std::make_shared<Sticky>()) {}

  ~CudaStream() override {
    if (!owned_) return;
    cudaSetDevice(device_->ordinal);
    const cudaError_t err = cudaStreamSynchronize(stream_);
    if (err != cudaSuccess)
      log::Error("{}: stream synchronize: {}", device_->name, cudaGetErrorString(err));
    cudaStreamDestroy(stream_);
  }

  Status Copy(void* dst, const void* src, size_t size_bytes, CopyKind kind) override {
    ZINF_RETURN_IF_ERROR(Check());
    if (size_bytes == 0) return OkStatus();
    if (dst == nullptr || src == nullptr) {
      return InvalidArgument(fmt::format("Copy of {} bytes: {} pointer is null", size_bytes,
                                         dst == nullptr ? "dst" : "src"));
    }
    device_->counters.CountCopy(kind, size_bytes);
    // Unified addressing lets the runtime tell the direction from the pointers.
    return CudaStatus(cudaMemcpyAsync(dst, src, size_bytes, cudaMemcpyDefault, stream_),
                      "cudaMemcpyAsync");
  }

  Status Memset(void* dst, int value, size_t size_bytes) override {
    ZINF_RETURN_IF_ERROR(Check());
    if (size_bytes == 0) return OkStatus();
    if (dst == nullptr) return InvalidArgument("Memset: dst pointer is null");
    device_->counters.CountDeviceSet(size_bytes);
    return CudaStatus(cudaMemsetAsync(dst, value, size_bytes, stream_), "cudaMemsetAsync");
  }

  Status HostFunc(std::function<Status()> fn) override {
    ZINF_RETURN_IF_ERROR(Check());
    if (!fn) return InvalidArgument("HostFunc: the function is empty");
    auto* closure = new Closure{std::move(fn), sticky_};
    const cudaError_t err = cudaLaunchHostFunc(stream_, &RunClosure, closure);
    if (err != cudaSuccess) delete closure;
    return CudaStatus(err, "cudaLaunchHostFunc");
  }

  Status Record(Event& event) override {
    // Note [Events across CudaDevices]
    // Every CudaDevice uses the runtime's primary context of its GPU, so an event of another
    // CudaDevice object on the same GPU (a trainer's own device beside the engine's, say) is
    // as good as one of this device: CUDA records it on any stream of that GPU, and a stream
    // may wait on an event of any GPU. Only a record on another GPU is refused, as CUDA would.
    auto* cuda_event = dynamic_cast<CudaEvent*>(&event);
    if (cuda_event == nullptr || cuda_event->device()->ordinal != device_->ordinal) {
      return InvalidArgument(
          fmt::format("Record: the event belongs to another device than {}", device_->name));
    }
    ZINF_RETURN_IF_ERROR(cuda_event->device()->CheckOpen());
    ZINF_RETURN_IF_ERROR(Check());  // last: the current GPU is this stream's
    return CudaStatus(cudaEventRecord(cuda_event->handle(), stream_), "cudaEventRecord");
  }

  Status Wait(const Event& event) override {
    // Any CudaDevice's event (Note [Events across CudaDevices]).
    const auto* cuda_event = dynamic_cast<const CudaEvent*>(&event);
    if (cuda_event == nullptr) {
      return InvalidArgument(fmt::format(
          "Wait: the event is not a CUDA event, and {} can wait only on those", device_->name));
    }
    ZINF_RETURN_IF_ERROR(cuda_event->device()->CheckOpen());
    ZINF_RETURN_IF_ERROR(Check());
    return CudaStatus(cudaStreamWaitEvent(stream_, cuda_event->handle(), 0), "cudaStreamWaitEvent");
  }

  Status Synchronize() override {
    ZINF_RETURN_IF_ERROR(Check());
    device_->counters.CountWait();
    ZINF_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
    return Check();
  }

  void* native_handle() const override { return stream_; }

 private:
  // Host functions cannot fail into CUDA; their errors are kept here.
  struct Sticky {
    std::mutex mu;
    Status error;
  };
  struct Closure {
    std::function<Status()> fn;
    std::shared_ptr<Sticky> sticky;
  };

  static void CUDART_CB RunClosure(void* arg) {
    std::unique_ptr<Closure> closure(static_cast<Closure*>(arg));
    {
      std::lock_guard lock(closure->sticky->mu);
      if (!closure->sticky->error.ok()) return;  // skip work after an error
    }
    Status status = closure->fn();
    if (!status.ok()) {
      std::lock_guard lock(closure->sticky->mu);
      if (closure->sticky->error.ok()) closure->sticky->error = std::move(status);
    }
  }

  Status Check() {
    ZINF_RETURN_IF_ERROR(device_->CheckOpen());
    std::lock_guard lock(sticky_->mu);
    return sticky_->error;
  }

  std::shared_ptr<DeviceState> device_;
  cudaStream_t stream_;
  bool owned_;
  std::shared_ptr<Sticky> sticky_;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(std::shared_ptr<DeviceState> state)
      : state_(std::move(state)), allocator_(std::make_shared<CudaAllocator>(state_)) {}
  ~CudaDevice() override { state_->closed.store(true, std::memory_order_release); }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return state_->name; }
  TransferCounters& transfer_counters() override { return state_->counters; }

  StatusOr<DeviceBuffer> Allocate(size_t size_bytes) override {
    return allocator_->Allocate(size_bytes, allocator_);
  }

  StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    ZINF_RETURN_IF_ERROR(state_->CheckOpen());
    cudaStream_t stream = nullptr;
    ZINF_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                    "cudaStreamCreateWithFlags"));
    return std::unique_ptr<Stream>(std::make_unique<CudaStream>(state_, stream));
  }

  StatusOr<std::unique_ptr<Stream>> BorrowStream(void* native_handle) override {
    ZINF_RETURN_IF_ERROR(state_->CheckOpen());
    auto stream = static_cast<cudaStream_t>(native_handle);
    // The legacy default stream (0) has no device of its own; any other must be this GPU's.
    if (stream != nullptr) {
      int stream_device = -1;
      ZINF_RETURN_IF_ERROR(
          CudaStatus(cudaStreamGetDevice(stream, &stream_device), "cudaStreamGetDevice"));
      if (stream_device != state_->ordinal) {
        return InvalidArgument(fmt::format("BorrowStream: the stream is cuda:{}'s, not {}'s",
                                           stream_device, state_->name));
      }
    }
    return std::unique_ptr<Stream>(std::make_unique<CudaStream>(state_, stream, false));
  }

  StatusOr<std::unique_ptr<Event>> CreateEvent(bool enable_timing) override {
    ZINF_RETURN_IF_ERROR(state_->CheckOpen());
    cudaEvent_t event = nullptr;
    ZINF_RETURN_IF_ERROR(CudaStatus(
        cudaEventCreateWithFlags(&event, enable_timing ? cudaEventDefault : cudaEventDisableTiming),
        "cudaEventCreateWithFlags"));
    return std::unique_ptr<Event>(std::make_unique<CudaEvent>(state_, event, enable_timing));
  }

  DeviceMemoryStats memory_stats() const override {
    return {state_->budget.limit_bytes(), state_->budget.in_use_bytes(),
            state_->budget.peak_bytes()};
  }

  StatusOr<HostBuffer> AllocateHost(size_t size_bytes) override {
    return HostBuffer::Allocate(size_bytes, {.pinned = true});
  }

 private:
  std::shared_ptr<DeviceState> state_;
  std::shared_ptr<CudaAllocator> allocator_;
};

}  // namespace

StatusOr<std::unique_ptr<Device>> CreateCudaDevice(const CudaDeviceOptions& options) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Unavailable(fmt::format("no usable GPU: {}", cudaGetErrorString(err)));
  }
  if (options.ordinal < 0 || options.ordinal >= count) {
    return InvalidArgument(
        fmt::format("cuda device ordinal must be in [0, {}), got {}", count, options.ordinal));
  }
  ZINF_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(options.ordinal), "cudaSetDevice"));
  cudaDeviceProp prop{};
  ZINF_RETURN_IF_ERROR(
      CudaStatus(cudaGetDeviceProperties(&prop, options.ordinal), "cudaGetDeviceProperties"));
  size_t free_bytes = 0, total_bytes = 0;
  ZINF_RETURN_IF_ERROR(CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  uint64_t budget = options.memory_budget_bytes;
  if (budget == 0) budget = free_bytes / 10 * 9;

  // Keep freed memory in the pool instead of returning it to the driver at every sync.
  cudaMemPool_t pool = nullptr;
  ZINF_RETURN_IF_ERROR(CudaStatus(cudaDeviceGetDefaultMemPool(&pool, options.ordinal),
                                  "cudaDeviceGetDefaultMemPool"));
  uint64_t threshold = UINT64_MAX;
  ZINF_RETURN_IF_ERROR(
      CudaStatus(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
                 "cudaMemPoolSetAttribute"));

  auto state = std::make_shared<DeviceState>(
      options.ordinal, fmt::format("cuda:{} ({})", options.ordinal, prop.name), budget);
  ZINF_RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&state->alloc_stream, cudaStreamNonBlocking),
                 "cudaStreamCreateWithFlags"));
  SetHostPinner(&g_cuda_pinner);
  return std::unique_ptr<Device>(std::make_unique<CudaDevice>(std::move(state)));
}

}  // namespace zinf
