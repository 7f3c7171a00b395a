// TransferWorkers: see offload/transfer_workers.h.
#include "offload/transfer_workers.h"

#include <utility>

#include "core/thread_name.h"
#include "zinf/device.h"

namespace zinf {

TransferWorkers::TransferWorkers(int threads, const char* name) {
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([this, name] {
      NameThisThread(name);
      TransferCounters::MarkWorkerThread();  // Note [Transfer counters]
      Loop();
    });
  }
}

void TransferWorkers::Enqueue(std::function<void()> job) {
  {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(job));
  }
  queue_cv_.Signal();
}

void TransferWorkers::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  queue_cv_.SignalAll();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

size_t TransferWorkers::queued() const {
  MutexLock lock(&mu_);
  return queue_.size();
}

void TransferWorkers::Loop() {
  while (true) {
    std::function<void()> job;
    {
      MutexLock lock(&mu_);
      while (!stopping_ && queue_.empty()) queue_cv_.Wait(&mu_);
      if (queue_.empty()) return;  // stopping, and every queued job has run
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job();
  }
}

}  // namespace zinf
