// HostDevice: the CPU as a device. "Device memory" is host memory under a byte budget; each
// stream is an ordered queue served by its own worker thread (so two streams overlap, as a
// GPU's copy engines do); events complete in stream order. It is a real device: zinf trains
// on it on CPU-only machines, and it runs every scheduling path in CI.
//
// Thread-safety: as in offload/device.h.
#include <fmt/core.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/log.h"
#include "core/memory_budget.h"
#include "core/units.h"
#include "zinf/device.h"

namespace zinf {
namespace {

using Clock = std::chrono::steady_clock;

// What the device, its streams, events and buffers share; outlives the HostDevice object.
struct DeviceState {
  DeviceState(std::string device_name, uint64_t budget_bytes)
      : name(std::move(device_name)), budget(name + " memory", budget_bytes) {}

  Status CheckOpen() const {
    if (closed.load(std::memory_order_acquire)) {
      return FailedPrecondition(fmt::format("{} was used after the device was destroyed", name));
    }
    return OkStatus();
  }

  const std::string name;
  MemoryBudget budget;
  std::atomic<bool> closed{false};
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

 private:
  std::shared_ptr<DeviceState> state_;
  std::mutex mu_;
  std::unordered_map<void*, HostBuffer> buffers_;
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
  explicit HostStream(std::shared_ptr<DeviceState> device)
      : device_(std::move(device)), worker_([this] { Serve(); }) {}

  ~HostStream() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    work_cv_.notify_one();
    worker_.join();  // the worker drains the queue before it exits
    if (!error_.ok()) log::Debug("{} stream closed with error: {}", device_->name, error_);
  }

  Status Copy(void* dst, const void* src, size_t size_bytes, CopyKind) override {
    if (size_bytes == 0) return OkStatus();
    if (dst == nullptr || src == nullptr) {
      return InvalidArgument(fmt::format("Copy of {} bytes: {} pointer is null", size_bytes,
                                         dst == nullptr ? "dst" : "src"));
    }
    return Enqueue([=] {
      std::memcpy(dst, src, size_bytes);
      return OkStatus();
    });
  }

  Status Memset(void* dst, int value, size_t size_bytes) override {
    if (size_bytes == 0) return OkStatus();
    if (dst == nullptr) return InvalidArgument("Memset: dst pointer is null");
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
      {
        std::lock_guard event_lock(state->mu);
        target = ++state->recorded;
      }
      queue_.push_back(Task{[this, state, target] {
                              {
                                std::lock_guard event_lock(state->mu);
                                state->completed = std::max(state->completed, target);
                                state->time = Clock::now();
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
    std::unique_lock lock(mu_);
    idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
    return error_;
  }

  void* native_handle() const override { return nullptr; }

 private:
  struct Task {
    std::function<Status()> fn;
    bool run_after_error;
  };

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
      Status status = skip ? OkStatus() : task.fn();
      lock.lock();
      busy_ = false;
      if (!status.ok() && error_.ok()) error_ = std::move(status);
      if (queue_.empty()) idle_cv_.notify_all();
    }
  }

  std::shared_ptr<DeviceState> device_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;
  std::deque<Task> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  // Sticky. Written only by the worker thread (under mu_), so the worker may read it
  // without the lock (Record tasks do); other threads read it under mu_.
  Status error_;
  std::thread worker_;
};

class HostDevice final : public Device {
 public:
  explicit HostDevice(const HostDeviceOptions& options)
      : state_(std::make_shared<DeviceState>(fmt::format("host:{}", options.ordinal),
                                             options.memory_budget_bytes)),
        allocator_(std::make_shared<HostAllocator>(state_)) {}

  ~HostDevice() override { state_->closed.store(true, std::memory_order_release); }

  DeviceKind kind() const override { return DeviceKind::kHost; }
  std::string name() const override {
    return fmt::format("{} (budget {})", state_->name, FormatBytes(state_->budget.limit_bytes()));
  }

  StatusOr<DeviceBuffer> Allocate(size_t size_bytes) override {
    return allocator_->Allocate(size_bytes, allocator_);
  }

  StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    ZINF_RETURN_IF_ERROR(state_->CheckOpen());
    return std::unique_ptr<Stream>(std::make_unique<HostStream>(state_));
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
