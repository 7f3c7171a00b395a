// TransferWorkers: the tiered store's transfer threads, which run its asynchronous jobs
// (Prefetch, EvictAsync, WriteBackAsync) in the order they were queued.
//
// Thread-safety: Enqueue and queued may be called from any thread; Stop from one.
#ifndef ZINF_OFFLOAD_TRANSFER_WORKERS_H_
#define ZINF_OFFLOAD_TRANSFER_WORKERS_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "core/mutex.h"

namespace zinf {

class TransferWorkers {
 public:
  // Starts `threads` threads named `name` (at most 15 characters).
  TransferWorkers(int threads, const char* name);
  ~TransferWorkers() { Stop(); }
  TransferWorkers(const TransferWorkers&) = delete;
  TransferWorkers& operator=(const TransferWorkers&) = delete;

  // Queues `job` for the next free thread. Not after Stop.
  void Enqueue(std::function<void()> job);
  // Runs every job queued and ends the threads; later calls do nothing.
  void Stop();
  // Jobs queued and not yet started.
  size_t queued() const;

 private:
  void Loop();

  mutable Mutex mu_;
  CondVar queue_cv_;  // a job was queued, or stopping
  std::deque<std::function<void()>> queue_ ZINF_GUARDED_BY(mu_);
  bool stopping_ ZINF_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace zinf

#endif  // ZINF_OFFLOAD_TRANSFER_WORKERS_H_
