// Device: where compute runs and "device memory" lives — a GPU (CudaDevice) or the CPU itself
// (HostDevice). Everything above this layer (pools, TieredStore, the ZeRO engine) is written
// against this interface only, so every scheduling path runs in CI on HostDevice.
//
// The contract, shared by every implementation (tests/offload/device_conformance.h checks it):
// - Allocate() takes device memory under a byte budget; exceeding it is ResourceExhausted
//   naming the budget, what is in use and the request. Memory is returned when the
//   DeviceBuffer is destroyed; the caller must first make sure no queued work still uses it
//   (synchronize a stream, or wait on an event), as with any stream-ordered allocator.
// - A Stream runs its work asynchronously and in the order it was enqueued. Work on different
//   streams may overlap; Record() on one stream and Wait() on another orders them.
// - An Event marks a point in a stream. Wait() captures the event's most recent Record() at
//   the time of the call (later records do not affect it), as CUDA does, so waiting on an
//   event that was never recorded is a no-op and cannot deadlock. Streams take the events of
//   their own device; on CUDA also those of any other CudaDevice (one GPU: Record and Wait;
//   another GPU: Wait), since CUDA orders work across devices by events.
// - Errors raised by queued work (a failed host function, a CUDA fault) are sticky on the
//   stream: every later call on it, and Synchronize(), return the first error.
// - Streams, events and buffers may outlive their Device: the memory is still freed, and
//   every other call returns FailedPrecondition saying the device was destroyed.
//
// Thread-safety: Device methods are thread-safe. A Stream or Event may be used from several
// threads, but enqueue order between threads is whatever order the calls happen in.
#ifndef ZINF_DEVICE_H_
#define ZINF_DEVICE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zinf/export.h"
#include "zinf/host_memory.h"
#include "zinf/status.h"

namespace zinf {

enum class DeviceKind { kHost, kCuda };

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice, kHostToHost };

struct DeviceMemoryStats {
  uint64_t budget_bytes = 0;  // 0: unlimited
  uint64_t in_use_bytes = 0;
  uint64_t peak_bytes = 0;
};

// What a device was asked to do, and the passes its users made over memory with the CPU beside
// it, since the device was opened (Device::transfer_counters). See Note [Transfer counters] in
// offload/tiered_store.cc for who counts what.
struct TransferCounts {
  // Blocking waits: Event::Synchronize, Stream::Synchronize, a tiered store's waits for a
  // transfer in flight, and the engine's for the store's futures. Each call counts once,
  // whether or not it found the work already done. host_waits: on the threads that call zinf
  // (the trainer's); worker_waits: on zinf's own threads (the store's transfer threads, the
  // engine's optimizer threads), which hold no trainer up.
  uint64_t host_waits = 0;
  uint64_t worker_waits = 0;
  // Copies by where their sides live (the CopyKind), through streams or, where the host may
  // touch the device's memory, by memcpy.
  uint64_t copies_down = 0, bytes_down = 0;            // device to host
  uint64_t copies_up = 0, bytes_up = 0;                // host to device
  uint64_t copies_on_device = 0, bytes_on_device = 0;  // device to device
  uint64_t copies_host = 0, bytes_host = 0;            // host to host, through a stream
  uint64_t device_bytes_set = 0;                       // memsets of device memory
  // What the CPU itself memsets and memcpys in host memory in zinf's passes (zeroing an
  // accumulator, a staging copy, the optimizer's copies): the host's work that a GPU would not
  // take over.
  uint64_t host_bytes_set = 0;
  uint64_t host_bytes_copied = 0;
};

// The counters behind TransferCounts: relaxed atomics, so counting costs an uncontended add
// and any thread may count. Thread-safe.
class TransferCounters {
 public:
  void CountWait() { Add(IsWorkerThread() ? worker_waits_ : host_waits_, 1); }
  void CountCopy(CopyKind kind, uint64_t bytes) {
    const int k = static_cast<int>(kind);
    Add(copies_[k], 1);
    Add(copy_bytes_[k], bytes);
  }
  void CountDeviceSet(uint64_t bytes) { Add(device_bytes_set_, bytes); }
  void CountHostSet(uint64_t bytes) { Add(host_bytes_set_, bytes); }
  void CountHostCopy(uint64_t bytes) { Add(host_bytes_copied_, bytes); }
  TransferCounts counts() const {
    TransferCounts c;
    c.host_waits = Get(host_waits_);
    c.worker_waits = Get(worker_waits_);
    c.copies_up = Get(copies_[int(CopyKind::kHostToDevice)]);
    c.bytes_up = Get(copy_bytes_[int(CopyKind::kHostToDevice)]);
    c.copies_down = Get(copies_[int(CopyKind::kDeviceToHost)]);
    c.bytes_down = Get(copy_bytes_[int(CopyKind::kDeviceToHost)]);
    c.copies_on_device = Get(copies_[int(CopyKind::kDeviceToDevice)]);
    c.bytes_on_device = Get(copy_bytes_[int(CopyKind::kDeviceToDevice)]);
    c.copies_host = Get(copies_[int(CopyKind::kHostToHost)]);
    c.bytes_host = Get(copy_bytes_[int(CopyKind::kHostToHost)]);
    c.device_bytes_set = Get(device_bytes_set_);
    c.host_bytes_set = Get(host_bytes_set_);
    c.host_bytes_copied = Get(host_bytes_copied_);
    return c;
  }

  // Marks the calling thread, for the rest of its life, as one of zinf's own (its waits are
  // worker_waits): what zinf's thread pools call first in each thread.
  ZINF_EXPORT static void MarkWorkerThread();  // src/core/thread_name.cc

 private:
  ZINF_EXPORT static bool IsWorkerThread();
  static void Add(std::atomic<uint64_t>& counter, uint64_t n) {
    counter.fetch_add(n, std::memory_order_relaxed);
  }
  static uint64_t Get(const std::atomic<uint64_t>& counter) {
    return counter.load(std::memory_order_relaxed);
  }

  std::atomic<uint64_t> host_waits_{0}, worker_waits_{0};
  std::atomic<uint64_t> copies_[4]{}, copy_bytes_[4]{};  // indexed by CopyKind
  std::atomic<uint64_t> device_bytes_set_{0}, host_bytes_set_{0}, host_bytes_copied_{0};
};

namespace internal {
// Returns device memory; kept alive by every DeviceBuffer so freeing works after the device
// is gone.
class ZINF_EXPORT DeviceAllocator {
 public:
  virtual ~DeviceAllocator() = default;
  virtual void Free(void* data, size_t size_bytes) noexcept = 0;
};
}  // namespace internal

// Owns one device allocation. Move-only; frees on destruction (see the contract above).
class ZINF_EXPORT DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(void* data, size_t size_bytes, std::shared_ptr<internal::DeviceAllocator> owner)
      : data_(data), size_bytes_(size_bytes), owner_(std::move(owner)) {}
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
      size_bytes_ = std::exchange(other.size_bytes_, 0);
      owner_ = std::move(other.owner_);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size_bytes() const { return size_bytes_; }
  bool empty() const { return data_ == nullptr; }

  void Reset() {
    if (owner_ != nullptr && data_ != nullptr) owner_->Free(data_, size_bytes_);
    data_ = nullptr;
    size_bytes_ = 0;
    owner_.reset();
  }

 private:
  void* data_ = nullptr;
  size_t size_bytes_ = 0;
  std::shared_ptr<internal::DeviceAllocator> owner_;
};

class ZINF_EXPORT Event {
 public:
  virtual ~Event() = default;
  // True when the work before the most recent Record() has run (true if never recorded).
  virtual StatusOr<bool> Query() = 0;
  // Blocks the calling thread until Query() would be true.
  virtual Status Synchronize() = 0;
  // Milliseconds from `start`'s completion to this event's. Both must be timing events of the
  // same device, recorded and complete: otherwise FailedPrecondition.
  virtual StatusOr<double> ElapsedMsSince(const Event& start) const = 0;
};

class ZINF_EXPORT Stream {
 public:
  // Waits for the stream's queued work (best effort; errors are logged, never thrown).
  virtual ~Stream() = default;

  // Enqueues a copy of `size_bytes` from `src` to `dst`. Both must stay valid until the copy
  // has run. `kind` says where each side lives; host sides should come from
  // Device::AllocateHost for full speed (pinned memory on CUDA).
  virtual Status Copy(void* dst, const void* src, size_t size_bytes, CopyKind kind) = 0;
  // Enqueues filling device memory with a byte value.
  virtual Status Memset(void* dst, int value, size_t size_bytes) = 0;
  // Enqueues `fn` to run on a host thread in stream order. On HostDevice this is how compute
  // runs; on CUDA it is a host callback and must not call CUDA. An error it returns becomes
  // the stream's sticky error.
  virtual Status HostFunc(std::function<Status()> fn) = 0;
  virtual Status Record(Event& event) = 0;
  // Makes later work on this stream wait for `event`'s most recent Record().
  virtual Status Wait(const Event& event) = 0;
  // Blocks until all enqueued work has run; returns the sticky error if any.
  virtual Status Synchronize() = 0;
  // The backend's handle (cudaStream_t on CUDA, nullptr on HostDevice) for launching kernels.
  virtual void* native_handle() const = 0;
};

class ZINF_EXPORT Device {
 public:
  // Marks the device closed (see the contract above). Waiting for work queued on streams
  // that are still alive is the caller's job.
  virtual ~Device() = default;

  virtual DeviceKind kind() const = 0;
  // "host:0 (budget 8.00 GiB)", "cuda:0 (NVIDIA H100 80GB HBM3)".
  virtual std::string name() const = 0;

  virtual StatusOr<DeviceBuffer> Allocate(size_t size_bytes) = 0;
  virtual StatusOr<std::unique_ptr<Stream>> CreateStream() = 0;
  // A Stream over a native stream another library owns (PyTorch's current stream, a
  // cudaStream_t of this GPU): work queued and events recorded through it go on that stream,
  // and destroying it neither synchronizes nor destroys the native one. How a trainer with
  // streams of its own orders them with the engine's events. FailedPrecondition where the
  // backend has no native streams (the host device).
  virtual StatusOr<std::unique_ptr<Stream>> BorrowStream(void* native_handle) = 0;
  virtual StatusOr<std::unique_ptr<Event>> CreateEvent(bool enable_timing = false) = 0;
  virtual DeviceMemoryStats memory_stats() const = 0;
  // Host memory that copies to and from this device run fastest with: page-locked for CUDA.
  virtual StatusOr<HostBuffer> AllocateHost(size_t size_bytes) = 0;
  // Whether the host may read and write this device's memory directly, outside its streams:
  // the host device with no modelled link. Elsewhere device memory is reached only through
  // the device's streams.
  virtual bool host_addressable() const { return false; }
  // What this device's streams and events were asked to do since it opened, every user's
  // (the engine's, its store's, a trainer's on the same device), and where the users count
  // their host passes beside them. Lives as long as the device.
  virtual TransferCounters& transfer_counters() = 0;
};

// ---------------------------------------------------------------------------------------
// Factories.

struct ZINF_EXPORT HostDeviceOptions {
  // Bytes of "device memory"; must be > 0.
  uint64_t memory_budget_bytes = 0;
  int ordinal = 0;  // distinguishes devices in names ("host:1")
  // A modelled host<->device link, a stand-in for PCIe so that overlap of transfers with
  // compute can be measured and tested without a GPU. 0 (the default): off, every copy is a
  // plain memcpy. Otherwise a copy between host memory and this device's memory takes
  // max(memcpy time, size_bytes / link_bytes_per_second), and runs on one copy engine per
  // direction, as on a GPU: two host-to-device copies on different streams run one after the
  // other, while a host-to-device copy, a device-to-host copy and compute on other streams
  // run at the same time. Device-to-device and host-to-host copies stay plain memcpys. The
  // direction comes from where the pointers live (the device knows its allocations), not
  // from the CopyKind, as with CudaDevice. The time is slept, not spun: it costs no core. A
  // link cannot be faster than the host's memcpy: choose a rate well below it
  // (`zinf bench pcie --host --link-gbps 0` measures memcpy through the device).
  uint64_t link_bytes_per_second = 0;

  // Reads the environment variable ZINF_HOST_LINK_GBPS, when it is set and not empty, into
  // link_bytes_per_second: a decimal number of GB/s (10^9 bytes per second; "12.5" for
  // about a PCIe 4.0 x16 link), 0 turning the model off. It overrides the field. Whoever
  // builds the options calls this (TieredStore, the GPT's CPU backend, `zinf bench pcie
  // --host`), so a whole run can be put behind a modelled link without code changes.
  // InvalidArgument naming the variable and its value when it is not a number in
  // [0, 1000000]; the options are then unchanged.
  [[nodiscard]] Status ApplyEnvironment();
};
ZINF_EXPORT StatusOr<std::unique_ptr<Device>> CreateHostDevice(const HostDeviceOptions& options);

struct CudaDeviceOptions {
  int ordinal = 0;
  // Bytes zinf may allocate on the GPU; 0 = 90% of what is free when the device is opened.
  uint64_t memory_budget_bytes = 0;
};
// Unavailable when zinf was built without CUDA or no GPU is usable (the message says why).
ZINF_EXPORT StatusOr<std::unique_ptr<Device>> CreateCudaDevice(const CudaDeviceOptions& options);

// A device by name, with a memory budget: "host" (its link from ZINF_HOST_LINK_GBPS, see
// HostDeviceOptions::ApplyEnvironment) or "cuda:N". InvalidArgument for another name; the
// factories' errors.
ZINF_EXPORT StatusOr<std::unique_ptr<Device>> CreateDevice(std::string_view name,
                                                           uint64_t memory_budget_bytes);

struct GpuDescription {
  int ordinal = 0;
  std::string name;
  uint64_t total_memory_bytes = 0;
  uint64_t free_memory_bytes = 0;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  int pci_bus_id = 0;
  int multiprocessors = 0;
};

struct GpuReport {
  bool cuda_built = false;      // zinf compiled with CUDA
  std::string runtime_version;  // "13.0"
  std::string driver_version;   // "13.0" or empty
  std::string nccl_version;     // "2.28.3" or empty when NCCL was not found
  std::vector<GpuDescription> gpus;
  std::string error;  // why there are no GPUs ("CUDA driver version is insufficient...")
};
// Never fails: what cannot be found is reported in `error`.
ZINF_EXPORT GpuReport ProbeGpus();

}  // namespace zinf

#endif  // ZINF_DEVICE_H_
