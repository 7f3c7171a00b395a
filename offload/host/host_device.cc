// HostDevice: the CPU as a device. "Device memory" is host memory under a byte budget; each
// stream is an ordered queue served by its own worker thread (so two streams overlap, as a
// GPU's copy engines do); events complete in stream order. It is a real device: zinf trains
// on it on CPU-only machines, and it runs every scheduling path in CI. Optionally, copies
// between host and device memory go over a modelled link (Note [Host link model]).
//
// Thread-safety: as in offload/device.h.
#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "core/log.h"
#include "core/memory_budget.h"
#include "core/thread_name.h"
#include "core/units.h"
#include "zinf/device.h"

namespace zinf {
namespace {

using Clock = std::chrono::steady_clock;

// Note [Host link model]
// With HostDeviceOptions::link_bytes_per_second set, a copy between host memory and device
// memory is a transfer over a modelled link, PCIe's stand-in, so that the overlap of
// transfers with compute that the tiered store and the ZeRO engine depend on can be
// measured and tested on a machine without a GPU.
//
// - One copy engine per direction, as on a GPU: copies in one direction run one at a time,
//   in the order their streams reach them (a ticket queue), while the other direction and
//   compute, on their own stream threads, go on at the same time.
// - A copy holds its engine for max(memcpy time, bytes / bandwidth): its memcpy is done at
//   once, then its stream's thread sleeps until the modelled end. Sleeping, not spinning,
//   keeps the cores free for the compute the copy is meant to overlap with.
// - Time is kept on the engine's own schedule of absolute deadlines, not on the stream
//   thread's, as a DMA engine does not wait for a CPU: a copy begins at max(when it could
//   have begun, when the engine became free) and ends max(memcpy time, bytes / bandwidth)
//   later. "Could have begun" is the later of its enqueue and the end of the previous task on
//   its stream (the modelled end, when that was a copy too). So the thread's wake-up latency
//   after each deadline (tens of microseconds, milliseconds on a loaded machine) is not
//   counted as link time: a back-to-back chain of copies keeps the modelled rate as long as
//   the threads keep up on average, and `zinf bench pcie --host` prints what was modelled. A
//   copy is never credited time before it was enqueued and never completes before its
//   modelled end, so the link is never faster than modelled.
// - The direction comes from the pointers (which one lies in one of this device's
//   allocations), not from the caller's CopyKind: CudaDevice uses cudaMemcpyDefault and
//   ignores the kind too, so a wrong kind must not change the timing here either.
//   Device-to-device and host-to-host copies are not on the link.
// - No latency per transfer is modelled, only bandwidth.
enum class LinkDirection { kHostToDevice = 0, kDeviceToHost = 1 };

class LinkModel {
 public:
  explicit LinkModel(uint64_t bytes_per_second) : bytes_per_second_(bytes_per_second) {}

  uint64_t bytes_per_second() const { return bytes_per_second_; }

  // Runs `copy` (which moves `size_bytes`) on the engine of `direction` and returns when the
  // modelled transfer is over, with its modelled end. `ready_at`: when the copy could have
  // begun (see the Note).
  template <typename CopyFn>
  Clock::time_point Transfer(LinkDirection direction, size_t size_bytes, Clock::time_point ready_at,
                             CopyFn copy) {
    Engine& engine = engines_[static_cast<int>(direction)];
    std::unique_lock lock(engine.mu);
    const uint64_t ticket = engine.next_ticket++;
    engine.cv.wait(lock, [&] { return engine.serving == ticket; });
    const Clock::time_point begin = std::max(ready_at, engine.free_at);
    lock.unlock();
    const Clock::time_point copy_start = Clock::now();
    copy();
    const Clock::duration copy_took = Clock::now() - copy_start;
    const auto on_link = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(static_cast<double>(size_bytes) / bytes_per_second_));
    const Clock::time_point end = begin + std::max(on_link, copy_took);
    std::this_thread::sleep_until(end);
    lock.lock();
    engine.free_at = end;
    ++engine.serving;
    lock.unlock();
    engine.cv.notify_all();
    return end;
  }

 private:
  struct Engine {
    std::mutex mu;
    std::condition_variable cv;
    uint64_t next_ticket = 0;   // handed to the next copy that reaches the engine
    uint64_t serving = 0;       // the ticket whose copy may run now
    Clock::time_point free_at;  // the modelled end of the last copy
  };

  const uint64_t bytes_per_second_;
  Engine engines_[2];
};

// What the device, its streams, events and buffers share; outlives the HostDevice object.
struct DeviceState {
  DeviceState(std::string device_name, uint64_t budget_bytes, uint64_t link_bytes_per_second)
      : name(std::move(device_name)),
        budget(name + " memory", budget_bytes),
        link(link_bytes_per_second == 0 ? nullptr
                                        : std::make_unique<LinkModel>(link_bytes_per_second)) {}

  Status CheckOpen() const {
    if (closed.load(std::memory_order_acquire)) {
      return FailedPrecondition(fmt::format("{} was used after the device was destroyed", name));
    }
    return OkStatus();
  }

  const std::string name;
  MemoryBudget budget;
  const std::unique_ptr<LinkModel> link;  // null: no link model, copies are plain memcpys
  std::atomic<bool> closed{false};
  TransferCounters counters;  // counted as the calls are made (Note [Transfer counters])
};

class HostAllocator final : public internal::DeviceAllocator {
 public:
  explicit HostAllocator(std::shared_ptr<DeviceState> state) : state_(std::move(state)) {}

  StatusOr<DeviceBuffer> Allocate(size_t size_bytes, std::shared_ptr<HostAllocator> self) {
    ZINF_RETURN_IF_ERROR(state_->CheckOpen());
    ZINF_RETURN_IF_ERROR(state_->budget.Reserve(size_bytes));
    StatusOr<HostBuffer> buffer = HostBuffer::Allocate(size_bytes);
    if (!buffer.ok()) {
      state_->budget.Release(size_bytes);
      return std::move(buffer).status().WithContext(state_->name);
    }
    void* data = buffer->data();
    if (data == nullptr) return DeviceBuffer();  // zero bytes
    std::lock_guard lock(mu_);
    buffers_.emplace(data, std::move(*buffer));
    return DeviceBuffer(data, size_bytes, std::move(self));
  }

  void Free(void* data, size_t size_bytes) noexcept override {
    HostBuffer released;
    {
      std::lock_guard lock(mu_);
      auto it = buffers_.find(data);
      if (it == buffers_.end()) {
        log::Error("{}: free of unknown pointer {}", state_->name, data);
        return;
      }
      released = std::move(it->second);
      buffers_.erase(it);
    }
    state_->budget.Release(size_bytes);
  }

  // True when `p` points into one of this device's live allocations (at any offset: pools
  // hand out pieces of larger allocations).
  bool Owns(const void* p) {
    std::lock_guard lock(mu_);
    auto it = buffers_.upper_bound(p);  // the first allocation that starts after p
    if (it == buffers_.begin()) return false;
    --it;
    return std::less<const void*>()(p, it->second.as<const char>() + it->second.size_bytes());
  }

 private:
  std::shared_ptr<DeviceState> state_;
  std::mutex mu_;
  // Ordered by address (std::less<> also compares const void* keys), so Owns() can find the
  // allocation around any pointer.
  std::map<const void*, HostBuffer, std::less<>> buffers_;
};

// The state behind an Event; streams hold it while a Record or Wait is queued.
struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;   // Record() calls so far
  uint64_t completed = 0;  // highest record that has run
  Status error;            // the recording stream's sticky error, handed on to waiters
  Clock::time_point time;
  bool timing = false;
};

class HostEvent final : public Event {
 public:
  HostEvent(std::shared_ptr<DeviceState> device, bool timing)
      : device_(std::move(device)), state_(std::make_shared<EventState>()) {
    state_->timing = timing;
  }

  StatusOr<bool> Query() override {
    ZINF_RETURN_IF_ERROR(device_->CheckOpen());
    std::lock_guard lock(state_->mu);
    return state_->completed >= state_->recorded;
  }

  Status Synchronize() override {
    ZINF_RETURN_IF_ERROR(device_->CheckOpen());
    device_->counters.CountWait();
    std::unique_lock lock(state_->mu);
    const uint64_t target = state_->recorded;
    state_->cv.wait(lock, [&] { return state_->completed >= target; });
    return state_->error;
  }

  StatusOr<double> ElapsedMsSince(const Event& start_event) const override {
    const auto* start = dynamic_cast<const HostEvent*>(&start_event);
    if (start == nullptr || start->device_ != device_) {
      return InvalidArgument("ElapsedMsSince: the start event belongs to another device");
    }
    Clock::time_point t0, t1;
    for (auto [event, out] : {std::pair{start, &t0}, std::pair{this, &t1}}) {
      std::lock_guard lock(event->state_->mu);
      if (!event->state_->timing) {
        return FailedPrecondition("ElapsedMsSince: event was created without enable_timing");
      }
      if (event->state_->recorded == 0 || event->state_->completed < event->state_->recorded) {
        return FailedPrecondition("ElapsedMsSince: event not recorded or not yet complete");
      }
      *out = event->state_->time;
    }
    return std::chrono::duration<double, std::milli>(t1 - t0).count();
  }

  const std::shared_ptr<DeviceState>& device() const { return device_; }
  const std::shared_ptr<EventState>& state() const { return state_; }

 private:
  std::shared_ptr<DeviceState> device_;
  std::shared_ptr<EventState> state_;
};

class HostStream final : public Stream {
 public:
  HostStream(std::shared_ptr<DeviceState> device, std::shared_ptr<HostAllocator> allocator)
      : device_(std::move(device)), allocator_(std::move(allocator)), worker_([this] {
          NameThisThread("zinf-host-dev");
          Serve();
        }) {}

  ~HostStream() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    work_cv_.notify_one();
    worker_.join();  // the worker drains the queue before it exits
    if (!error_.ok()) log::Debug("{} stream closed with error: {}", device_->name, error_);
  }

  Status Copy(void* dst, const void* src, size_t size_bytes, CopyKind kind) override {
    if (size_bytes == 0) return OkStatus();
    if (dst == nullptr || src == nullptr) {
      return InvalidArgument(fmt::format("Copy of {} bytes: {} pointer is null", size_bytes,
                                         dst == nullptr ? "dst" : "src"));
    }
    device_->counters.CountCopy(kind, size_bytes);
    const std::optional<LinkDirection> direction = LinkDirectionOf(dst, src);
    if (!direction.has_value()) {
      return Enqueue([=] {
        std::memcpy(dst, src, size_bytes);
        return OkStatus();
      });
    }
    return Enqueue([this, dst, src, size_bytes, direction = *direction] {
      modelled_end_ = device_->link->Transfer(direction, size_bytes, ready_at_,
                                              [&] { std::memcpy(dst, src, size_bytes); });
      return OkStatus();
    });
  }

  Status Memset(void* dst, int value, size_t size_bytes) override {
    if (size_bytes == 0) return OkStatus();
    if (dst == nullptr) return InvalidArgument("Memset: dst pointer is null");
    device_->counters.CountDeviceSet(size_bytes);
    return Enqueue([=] {
      std::memset(dst, value, size_bytes);
      return OkStatus();
    });
  }

  Status HostFunc(std::function<Status()> fn) override {
    if (!fn) return InvalidArgument("HostFunc: the function is empty");
    return Enqueue(std::move(fn));
  }

  Status Record(Event& event) override {
    auto* host_event = dynamic_cast<HostEvent*>(&event);
    if (host_event == nullptr || host_event->device() != device_) {
      return InvalidArgument("Record: the event belongs to another device");
    }
    ZINF_RETURN_IF_ERROR(device_->CheckOpen());
    std::shared_ptr<EventState> state = host_event->state();
    Status sticky;
    {
      // Counting the record and queueing it happen together: a counted record that never
      // runs would leave its waiters waiting forever. It is queued even after an error, so
      // that waiters are released and inherit the error.
      std::lock_guard lock(mu_);
      uint64_t target;
      if (queue_.empty() && !busy_) {
        // Nothing is queued before it: it completes now, without a hand-off to the worker
        // and back (a fetch that enqueued nothing costs its caller no thread wake-up). The
        // worker, idle, wrote previous_end_ before it last took mu_.
        {
          std::lock_guard event_lock(state->mu);
          target = ++state->recorded;
          state->completed = std::max(state->completed, target);
          state->time = std::max(Clock::now(), previous_end_);
          state->error = error_;
        }
        state->cv.notify_all();
        return error_;
      }
      {
        std::lock_guard event_lock(state->mu);
        target = ++state->recorded;
      }
      queue_.push_back(Task{[this, state, target] {
                              {
                                std::lock_guard event_lock(state->mu);
                                state->completed = std::max(state->completed, target);
                                // When the work before it ended (a link copy's
                                // modelled end), not when this thread got here.
                                state->time = ready_at_;
                                state->error = error_;
                              }
                              state->cv.notify_all();
                              return OkStatus();
                            },
                            /*run_after_error=*/true});
      sticky = error_;
    }
    work_cv_.notify_one();
    return sticky;
  }

  Status Wait(const Event& event) override {
    const auto* host_event = dynamic_cast<const HostEvent*>(&event);
    if (host_event == nullptr || host_event->device() != device_) {
      return InvalidArgument("Wait: the event belongs to another device");
    }
    std::shared_ptr<EventState> state = host_event->state();
    uint64_t target;
    {
      std::lock_guard lock(state->mu);
      target = state->recorded;  // captured now: later records do not matter
    }
    if (target == 0) return OkStatus();
    return Enqueue([state, target] {
      std::unique_lock lock(state->mu);
      state->cv.wait(lock, [&] { return state->completed >= target; });
      return state->error;
    });
  }

  Status Synchronize() override {
    ZINF_RETURN_IF_ERROR(device_->CheckOpen());
    device_->counters.CountWait();
    std::unique_lock lock(mu_);
    idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
    return error_;
  }

  void* native_handle() const override { return nullptr; }

 private:
  struct Task {
    std::function<Status()> fn;
    bool run_after_error;
    Clock::time_point enqueued_at = Clock::now();
  };

  // The link a copy from `src` to `dst` goes over, or nullopt when it is a plain memcpy (no
  // link model, or both sides on the same side of the link). See Note [Host link model].
  std::optional<LinkDirection> LinkDirectionOf(const void* dst, const void* src) const {
    if (device_->link == nullptr) return std::nullopt;
    const bool dst_on_device = allocator_->Owns(dst);
    const bool src_on_device = allocator_->Owns(src);
    if (dst_on_device == src_on_device) return std::nullopt;
    return dst_on_device ? LinkDirection::kHostToDevice : LinkDirection::kDeviceToHost;
  }

  Status Enqueue(std::function<Status()> fn) {
    ZINF_RETURN_IF_ERROR(device_->CheckOpen());
    {
      std::lock_guard lock(mu_);
      if (!error_.ok()) return error_;
      queue_.push_back(Task{std::move(fn), /*run_after_error=*/false});
    }
    work_cv_.notify_one();
    return OkStatus();
  }

  void Serve() {
    std::unique_lock lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      Task task = std::move(queue_.front());
      queue_.pop_front();
      const bool skip = !error_.ok() && !task.run_after_error;
      busy_ = true;
      lock.unlock();
      ready_at_ = std::max(task.enqueued_at, previous_end_);
      modelled_end_.reset();
      Status status = skip ? OkStatus() : task.fn();
      previous_end_ = modelled_end_.value_or(Clock::now());
      lock.lock();
      busy_ = false;
      if (!status.ok() && error_.ok()) error_ = std::move(status);
      if (queue_.empty()) idle_cv_.notify_all();
    }
  }

  std::shared_ptr<DeviceState> device_;
  std::shared_ptr<HostAllocator> allocator_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;
  std::deque<Task> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  // Sticky. Written only by the worker thread (under mu_), so the worker may read it
  // without the lock (Record tasks do); other threads read it under mu_.
  Status error_;
  // The worker thread's own, for the link model (Note [Host link model]): when the running
  // task could have begun, when the previous one ended, and the modelled end a link copy
  // reports (its thread wakes a little after it).
  Clock::time_point ready_at_;
  Clock::time_point previous_end_;
  std::optional<Clock::time_point> modelled_end_;
  std::thread worker_;  // last: it starts in the constructor and uses the members above
};

class HostDevice final : public Device {
 public:
  explicit HostDevice(const HostDeviceOptions& options)
      : state_(std::make_shared<DeviceState>(fmt::format("host:{}", options.ordinal),
                                             options.memory_budget_bytes,
                                             options.link_bytes_per_second)),
        allocator_(std::make_shared<HostAllocator>(state_)) {}

  ~HostDevice() override { state_->closed.store(true, std::memory_order_release); }

  DeviceKind kind() const override { return DeviceKind::kHost; }
  bool host_addressable() const override { return state_->link == nullptr; }
  TransferCounters& transfer_counters() override { return state_->counters; }
  std::string name() const override {
    std::string link;
    if (state_->link != nullptr) {
      link = fmt::format(", link {:.2f} GB/s", state_->link->bytes_per_second() / 1e9);
    }
    return fmt::format("{} (budget {}{})", state_->name, FormatBytes(state_->budget.limit_bytes()),
                       link);
  }

  StatusOr<DeviceBuffer> Allocate(size_t size_bytes) override {
    return allocator_->Allocate(size_bytes, allocator_);
  }

  StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    ZINF_RETURN_IF_ERROR(state_->CheckOpen());
    return std::unique_ptr<Stream>(std::make_unique<HostStream>(state_, allocator_));
  }

  StatusOr<std::unique_ptr<Stream>> BorrowStream(void*) override {
    return FailedPrecondition(
        "BorrowStream: the host device has no native streams (its compute runs on the "
        "caller's thread)");
  }

  StatusOr<std::unique_ptr<Event>> CreateEvent(bool enable_timing) override {
    ZINF_RETURN_IF_ERROR(state_->CheckOpen());
    return std::unique_ptr<Event>(std::make_unique<HostEvent>(state_, enable_timing));
  }

  DeviceMemoryStats memory_stats() const override {
    return {state_->budget.limit_bytes(), state_->budget.in_use_bytes(),
            state_->budget.peak_bytes()};
  }

  StatusOr<HostBuffer> AllocateHost(size_t size_bytes) override {
    // Host memory is already what this device computes on: no pinning needed.
    return HostBuffer::Allocate(size_bytes);
  }

 private:
  std::shared_ptr<DeviceState> state_;
  std::shared_ptr<HostAllocator> allocator_;
};

}  // namespace

Status HostDeviceOptions::ApplyEnvironment() {
  static constexpr const char* kVariable = "ZINF_HOST_LINK_GBPS";
  static constexpr double kMaxGbps = 1e6;
  const char* text = std::getenv(kVariable);
  if (text == nullptr || *text == '\0') return OkStatus();
  char* end = nullptr;
  const double gbps = std::strtod(text, &end);
  // !(a <= b) rather than a > b, so that NaN is refused too.
  if (end == text || *end != '\0' || !(gbps >= 0) || !(gbps <= kMaxGbps)) {
    return InvalidArgument(fmt::format(
        "environment variable {} must be a link bandwidth in GB/s (10^9 bytes/s) in [0, {}], "
        "got '{}'",
        kVariable, kMaxGbps, text));
  }
  // A positive rate too small to count in bytes/s still means "a link", not "off".
  const auto bytes_per_second = static_cast<uint64_t>(std::llround(gbps * 1e9));
  link_bytes_per_second = gbps > 0 ? std::max<uint64_t>(bytes_per_second, 1) : 0;
  return OkStatus();
}

StatusOr<std::unique_ptr<Device>> CreateHostDevice(const HostDeviceOptions& options) {
  if (options.memory_budget_bytes == 0) {
    return InvalidArgument("host device memory_budget_bytes must be > 0, got 0");
  }
  if (options.ordinal < 0) {
    return InvalidArgument(
        fmt::format("host device ordinal must be >= 0, got {}", options.ordinal));
  }
  return std::unique_ptr<Device>(std::make_unique<HostDevice>(options));
}

}  // namespace zinf
