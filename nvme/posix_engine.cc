// PosixEngine: pread/pwrite on a thread pool. Thread-safety: see posix_engine.h.
#include "nvme/posix_engine.h"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <system_error>
#include <thread>
#include <vector>

#include "core/thread_name.h"
#include "nvme/engine_base.h"

namespace zinf {
namespace {

using nvme_internal::EngineBase;
using nvme_internal::IoPiece;
using nvme_internal::StagingSlots;

class PosixEngine final : public EngineBase {
 public:
  explicit PosixEngine(const AioOptions& options)
      : EngineBase(options), staging_(options.block_size, Workers(options)) {
    const int workers = Workers(options);
    threads_.reserve(static_cast<size_t>(workers));
    for (int i = 0; i < workers; ++i) {
      try {
        threads_.emplace_back([this] {
          NameThisThread("zinf-posix-io");
          Work();
        });
      } catch (const std::system_error& e) {
        start_error_ = ResourceExhausted(
            fmt::format("starting POSIX I/O worker {} of {}: {}", i + 1, workers, e.what()));
        break;
      }
    }
  }

  const Status& start_error() const { return start_error_; }

  ~PosixEngine() override {
    WaitForOutstanding();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  std::string_view name() const override { return "posix"; }

 protected:
  Status ReserveStaging() override { return staging_.Reserve(); }

  void Enqueue(std::vector<IoPiece*> pieces) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.insert(queue_.end(), pieces.begin(), pieces.end());
    }
    if (pieces.size() == 1) {
      cv_.notify_one();
    } else {
      cv_.notify_all();
    }
  }

 private:
  void Work() {
    for (;;) {
      IoPiece* piece;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and nothing left
        piece = queue_.front();
        queue_.pop_front();
      }
      Run(piece);
    }
  }

  // Blocking I/O needs a thread per request in flight; 256 threads is already past what any
  // device rewards.
  static int Workers(const AioOptions& options) {
    return std::min(std::min(options.queue_depth, 32) * options.thread_count, 256);
  }

  // Moves the whole piece, continuing after short transfers.
  void Run(IoPiece* piece) {
    if (!Stage(piece, staging_)) {  // a slot per worker: cannot happen
      CompletePiece(piece, Internal("posix engine: no staging slot free for a worker"));
      return;
    }
    while (piece->length > 0) {
      const ssize_t n =
          piece->op == IoOp::kRead
              ? pread(piece->fd, piece->buffer, piece->length, static_cast<off_t>(piece->offset))
              : pwrite(piece->fd, piece->buffer, piece->length, static_cast<off_t>(piece->offset));
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        CompletePiece(piece, PieceErrno(*piece, errno));
        return;
      }
      if (n == 0) {
        // A write of zero bytes makes no progress either; both would loop forever.
        CompletePiece(piece,
                      piece->op == IoOp::kRead ? PieceEof(*piece) : PieceErrno(*piece, ENOSPC));
        return;
      }
      const auto moved = static_cast<uint64_t>(n);
      piece->buffer += moved;
      piece->offset += moved;
      piece->length -= moved;
      piece->moved += moved;
    }
    CompletePiece(piece, OkStatus());
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<IoPiece*> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
  StagingSlots staging_;  // a slot per worker (Note [Staging unaligned direct I/O])
  Status start_error_;
};

}  // namespace

StatusOr<std::unique_ptr<IoEngine>> CreatePosixEngine(const AioOptions& options) {
  ZINF_RETURN_IF_ERROR(options.Validate());
  auto engine = std::make_unique<PosixEngine>(options);
  if (!engine->start_error().ok()) return engine->start_error();
  return std::unique_ptr<IoEngine>(std::move(engine));
}

}  // namespace zinf
