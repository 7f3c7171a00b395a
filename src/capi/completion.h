// Completion: what a zinf_completion_t stands for, the outcome of one asynchronous operation:
// a TieredStore prefetch (a shared_future) or a SwapStore read or write (an IoCallback).
//
// Thread-safety: Wait and Poll may be called from any thread, at the same time.
#ifndef ZINF_CAPI_COMPLETION_H_
#define ZINF_CAPI_COMPLETION_H_

#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <optional>

#include "capi/capi_internal.h"
#include "nvme/io_engine.h"
#include "zinf/status.h"

namespace zinf::capi {

class Completion {
 public:
  // Done when `future` is ready.
  explicit Completion(std::shared_future<Status> future) : future_(std::move(future)) {}
  // Done when the callback from Callback() runs.
  Completion() : state_(std::make_shared<State>()) {}

  // For the I/O engine: finishes this completion. It holds only the shared state, so it may
  // run after the handle is gone.
  IoCallback Callback() {
    return [state = state_](Status status) {
      std::lock_guard lock(state->mu);
      if (state->done) return;  // the first outcome stands
      state->status = std::move(status);
      state->done = true;
      state->cv.notify_all();
    };
  }

  Status Wait() {
    if (!state_) return future_.get();
    std::unique_lock lock(state_->mu);
    state_->cv.wait(lock, [&] { return state_->done; });
    return state_->status;
  }

  // The outcome once done, nothing before.
  std::optional<Status> Poll() {
    if (!state_) {
      if (future_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return {};
      return future_.get();
    }
    std::lock_guard lock(state_->mu);
    if (!state_->done) return {};
    return state_->status;
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;  // guarded by mu
    Status status;      // guarded by mu
  };
  std::shared_future<Status> future_;
  std::shared_ptr<State> state_;
};

template <>
struct HandleTraits<zinf_completion_t> {
  using Object = Completion;
  static constexpr HandleKind kKind = HandleKind::kCompletion;
};

}  // namespace zinf::capi

#endif  // ZINF_CAPI_COMPLETION_H_
