// Communicator base (argument checks, the worker thread, sticky errors) and the Local backend.
#include "comm/communicator.h"

#include <fmt/core.h>

#include <cstring>

#include "core/log.h"
#include "core/thread_name.h"
#include "zinf/device.h"

namespace zinf {

Status NcclOptions::Validate() const {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return InvalidArgument(
        fmt::format("rank must be in [0, world_size={}), got {}", world_size, rank));
  }
  if (timeout.count() <= 0) {
    return InvalidArgument(fmt::format("timeout must be > 0 ms, got {}", timeout.count()));
  }
  return OkStatus();
}

Status CommWork::Wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  return status_;
}

bool CommWork::Done() const {
  std::lock_guard lock(mu_);
  return done_;
}

Communicator::Communicator(int rank, int world_size) : rank_(rank), world_size_(world_size) {}

Communicator::~Communicator() { StopWorker(); }

void Communicator::StartWorker() {
  worker_ = std::thread([this] {
    NameThisThread("zinf-comm");
    TransferCounters::MarkWorkerThread();  // Note [Transfer counters]: a wait here holds no caller
    Serve();
  });
}

void Communicator::StopWorker() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

Status Communicator::status() const {
  std::lock_guard lock(mu_);
  return sticky_;
}

std::shared_ptr<CommWork> Communicator::Submit(std::string what, std::function<Status()> fn) {
  auto work = std::make_shared<CommWork>();
  auto run = [this, what = std::move(what), fn = std::move(fn)]() -> Status {
    Status s = fn();
    if (s.ok()) return s;
    return std::move(s).WithContext(
        fmt::format("rank {} of {} ({}), {}", rank_, world_size_, backend(), what));
  };
  {
    std::lock_guard lock(mu_);
    if (!sticky_.ok() || stopping_) {
      work->done_ = true;
      work->status_ = stopping_ ? FailedPrecondition("communicator is shutting down") : sticky_;
      return work;
    }
    queue_.emplace_back(work, std::move(run));
  }
  cv_.notify_all();
  return work;
}

void Communicator::Serve() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;
    auto [work, fn] = std::move(queue_.front());
    queue_.pop_front();
    // After a failure, the group is out of step: later collectives fail without running.
    Status status = sticky_;
    if (status.ok()) {
      lock.unlock();
      status = fn();
      lock.lock();
      if (!status.ok() && sticky_.ok()) sticky_ = status;
    }
    {
      std::lock_guard work_lock(work->mu_);
      work->done_ = true;
      work->status_ = status;
    }
    work->cv_.notify_all();
  }
}

namespace {

Status CheckBuffer(const void* p, size_t count, const char* name) {
  if (p == nullptr && count != 0) return InvalidArgument(fmt::format("{} is null", name));
  return OkStatus();
}

}  // namespace

std::shared_ptr<CommWork> Communicator::AllReduceAsync(void* data, size_t count, ElementType type,
                                                       ReduceOp op) {
  return Submit(fmt::format("all-reduce of {} {}", count, ElementTypeName(type)), [=, this] {
    ZINF_RETURN_IF_ERROR(CheckBuffer(data, count, "data"));
    return count == 0 ? OkStatus() : DoAllReduce(data, count, type, op);
  });
}

std::shared_ptr<CommWork> Communicator::AllGatherAsync(const void* send, void* recv, size_t count,
                                                       ElementType type) {
  return Submit(fmt::format("all-gather of {} {} per rank", count, ElementTypeName(type)),
                [=, this] {
                  ZINF_RETURN_IF_ERROR(CheckBuffer(send, count, "send"));
                  ZINF_RETURN_IF_ERROR(CheckBuffer(recv, count, "recv"));
                  return count == 0 ? OkStatus() : DoAllGather(send, recv, count, type);
                });
}

std::shared_ptr<CommWork> Communicator::ReduceScatterAsync(void* send, void* recv, size_t count,
                                                           ElementType type, ReduceOp op,
                                                           Event* after) {
  return Submit(fmt::format("reduce-scatter of {} {} per rank", count, ElementTypeName(type)),
                [=, this] {
                  ZINF_RETURN_IF_ERROR(CheckBuffer(send, count, "send"));
                  ZINF_RETURN_IF_ERROR(CheckBuffer(recv, count, "recv"));
                  if (after != nullptr) ZINF_RETURN_IF_ERROR(after->Synchronize());
                  return count == 0 ? OkStatus() : DoReduceScatter(send, recv, count, type, op);
                });
}

Status Communicator::AllReduce(void* data, size_t count, ElementType type, ReduceOp op) {
  return AllReduceAsync(data, count, type, op)->Wait();
}

Status Communicator::AllGather(const void* send, void* recv, size_t count, ElementType type) {
  return AllGatherAsync(send, recv, count, type)->Wait();
}

Status Communicator::ReduceScatter(void* send, void* recv, size_t count, ElementType type,
                                   ReduceOp op) {
  return ReduceScatterAsync(send, recv, count, type, op)->Wait();
}

Status Communicator::Broadcast(void* data, size_t count, ElementType type, int root) {
  return Submit(fmt::format("broadcast of {} {} from rank {}", count, ElementTypeName(type), root),
                [=, this] {
                  if (root < 0 || root >= world_size_) {
                    return InvalidArgument(fmt::format("broadcast root must be in [0, {}), got {}",
                                                       world_size_, root));
                  }
                  ZINF_RETURN_IF_ERROR(CheckBuffer(data, count, "data"));
                  return count == 0 ? OkStatus() : DoBroadcast(data, count, type, root);
                })
      ->Wait();
}

Status Communicator::Barrier() {
  return Submit("barrier", [this] { return DoBarrier(); })->Wait();
}

namespace {

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator() : Communicator(0, 1) { StartWorker(); }
  ~LocalCommunicator() override { StopWorker(); }
  std::string_view backend() const override { return "local"; }

 protected:
  Status DoAllReduce(void*, size_t, ElementType, ReduceOp) override { return OkStatus(); }
  Status DoAllGather(const void* send, void* recv, size_t count, ElementType type) override {
    if (send != recv) std::memmove(recv, send, count * ElementSize(type));
    return OkStatus();
  }
  Status DoReduceScatter(void* send, void* recv, size_t count, ElementType type,
                         ReduceOp) override {
    if (send != recv) std::memmove(recv, send, count * ElementSize(type));
    return OkStatus();
  }
  Status DoBroadcast(void*, size_t, ElementType, int) override { return OkStatus(); }
  Status DoBarrier() override { return OkStatus(); }
};

}  // namespace

StatusOr<std::unique_ptr<Communicator>> CreateLocalCommunicator() {
  return std::unique_ptr<Communicator>(std::make_unique<LocalCommunicator>());
}

}  // namespace zinf
