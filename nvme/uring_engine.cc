// UringEngine: io_uring rings with one completion thread each. Thread-safety: see
// uring_engine.h.
//
// Note [io_uring rings]
// liburing's submission queue has one producer and its completion queue one consumer, and the
// two sides are independent. Each Ring therefore guards its SQ, its queue of waiting pieces and
// its in-flight count with one mutex, which any thread may take to prepare and submit; only the
// ring's reaper thread consumes completions, and it does so without the mutex, blocked in
// io_uring_wait_cqe. So a submitter never waits for the device: it appends pieces, fills free
// slots up to queue_depth and submits them. The reaper takes a whole batch of completions,
// resubmits the rest of any short transfer at the front of the queue, refills the freed slots,
// and only then runs callbacks, outside the mutex, so a callback may submit more work. A NOP
// whose user_data is kWakeTag stops the reaper once the engine is idle. How many pieces one
// io_uring_enter carries is AioOptions::single_submit's choice (See Note [Default aio options]).
//
// Note [Cancelled pieces]
// io_uring ties a request to the thread that submitted it: work the kernel hands to its io-wq
// workers (buffered writes always are) is cancelled with -ECANCELED when that thread exits.
// Submitters here may be short-lived (a trainer's worker threads, a test's), and the engine
// never cancels anything itself, so -ECANCELED means only "the submitter left": the reaper
// submits the piece again, now as its own. Repeating a piece is harmless: the same bytes go to
// or come from the same offset.
#include "nvme/uring_engine.h"

#include <fmt/core.h>
#include <liburing.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <system_error>
#include <thread>
#include <vector>

#include "core/log.h"
#include "core/thread_name.h"
#include "nvme/engine_base.h"

namespace zinf {
namespace {

constexpr int kMaxCancellations = 16;

using nvme_internal::EngineBase;
using nvme_internal::IoPiece;
using nvme_internal::StagingSlots;

// user_data of the NOP that stops a reaper; pieces are heap pointers and never equal it.
constexpr uint64_t kWakeTag = 1;
// io_uring_register_buffers takes at most 1 GiB per iovec.
constexpr uint64_t kMaxRegisteredIovec = uint64_t{1} << 30;

struct Region {
  uintptr_t begin = 0;
  uintptr_t end = 0;
};

class UringEngine;

class Ring {
 public:
  explicit Ring(UringEngine* engine);
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  Status Init(unsigned entries);
  void Start() {
    reaper_ = std::thread([this] {
      NameThisThread("zinf-uring");
      Reap();
    });
  }
  void Stop();
  ~Ring();

  // Appends pieces and submits what fits.
  void Push(std::vector<IoPiece*>& pieces);

  io_uring* ring() { return &ring_; }
  std::mutex& mu() { return mu_; }
  StagingSlots& staging() { return staging_; }

 private:
  void FillLocked();
  void SubmitLocked();
  void PrepLocked(io_uring_sqe* sqe, IoPiece* piece);
  void Reap();

  UringEngine* engine_;
  io_uring ring_{};
  bool initialized_ = false;
  std::mutex mu_;
  std::deque<IoPiece*> pending_;  // guarded by mu_
  // Prepared or in the kernel. Changed under mu_; the reaper also reads it without the lock
  // (only it lowers it, so what it reads is a lower bound).
  std::atomic<int> inflight_ = 0;
  StagingSlots staging_;  // a slot per piece in flight (Note [Staging unaligned direct I/O])
  std::thread reaper_;
};

class UringEngine final : public EngineBase {
 public:
  explicit UringEngine(const AioOptions& options) : EngineBase(options) {}

  ~UringEngine() override {
    WaitForOutstanding();
    for (auto& r : rings_) r->Stop();
    rings_.clear();
  }

  Status Init() {
    unsigned entries = 1;
    while (entries < static_cast<unsigned>(options_.queue_depth) + 1) entries <<= 1;
    for (int i = 0; i < options_.thread_count; ++i) {
      auto ring = std::make_unique<Ring>(this);
      ZINF_RETURN_IF_ERROR(ring->Init(entries));
      rings_.push_back(std::move(ring));
    }
    if (options_.register_files) {
      fixed_files_ = true;
      for (auto& r : rings_) {
        const int rc = io_uring_register_files_sparse(r->ring(), kMaxFiles);
        if (rc < 0) {
          log::Info("io_uring: registered files unavailable ({}); using plain descriptors",
                    std::strerror(-rc));
          fixed_files_ = false;
          break;
        }
      }
    }
    for (size_t i = 0; i < rings_.size(); ++i) {
      try {
        rings_[i]->Start();
      } catch (const std::system_error& e) {
        return ResourceExhausted(
            fmt::format("starting the completion thread of io_uring ring {}: "
                        "{}",
                        i, e.what()));
      }
    }
    return OkStatus();
  }

  std::string_view name() const override { return "io_uring"; }

  Status RegisterBuffer(void* data, uint64_t size_bytes) override {
    if (!options_.register_buffers) return OkStatus();
    if (data == nullptr || size_bytes == 0) {
      return InvalidArgument(fmt::format(
          "RegisterBuffer: expected a non-null buffer of positive size, got {} ({} bytes)", data,
          size_bytes));
    }
    std::vector<Region> regions = regions_;
    auto begin = reinterpret_cast<uintptr_t>(data);
    for (uint64_t pos = 0; pos < size_bytes; pos += kMaxRegisteredIovec) {
      const uint64_t len = std::min(kMaxRegisteredIovec, size_bytes - pos);
      regions.push_back(Region{begin + pos, begin + pos + len});
    }
    std::vector<iovec> iovecs;
    for (const Region& r : regions) {
      iovecs.push_back(iovec{reinterpret_cast<void*>(r.begin), r.end - r.begin});
    }
    for (auto& ring : rings_) {
      std::lock_guard<std::mutex> lock(ring->mu());
      if (!regions_.empty()) io_uring_unregister_buffers(ring->ring());
      const int rc = io_uring_register_buffers(ring->ring(), iovecs.data(),
                                               static_cast<unsigned>(iovecs.size()));
      if (rc < 0) {
        // Leave no ring with a table that disagrees with regions_.
        for (auto& other : rings_) {
          if (other.get() != ring.get()) {
            std::lock_guard<std::mutex> other_lock(other->mu());
            io_uring_unregister_buffers(other->ring());
          }
        }
        regions_.clear();
        return ErrnoStatus(-rc, fmt::format("io_uring_register_buffers of {} bytes at {} "
                                            "(raise RLIMIT_MEMLOCK, or set "
                                            "aio.register_buffers=false)",
                                            size_bytes, data));
      }
    }
    regions_ = std::move(regions);
    return OkStatus();
  }

  // Index of the registered region holding [p, p + len), or -1. Called under a ring mutex.
  int FindRegion(const char* p, uint64_t len) const {
    const auto b = reinterpret_cast<uintptr_t>(p);
    for (size_t i = 0; i < regions_.size(); ++i) {
      if (b >= regions_[i].begin && b + len <= regions_[i].end) return static_cast<int>(i);
    }
    return -1;
  }

  bool fixed_files() const { return fixed_files_; }
  using EngineBase::CompletePiece;
  using EngineBase::PieceEof;
  using EngineBase::PieceErrno;
  using EngineBase::Stage;
  using EngineBase::Unstage;

 protected:
  Status OnAddFile(int id, int fd) override {
    if (!fixed_files_) return OkStatus();
    for (auto& r : rings_) {
      const int rc = io_uring_register_files_update(r->ring(), static_cast<unsigned>(id), &fd, 1);
      if (rc < 0) return ErrnoStatus(-rc, "io_uring_register_files_update");
    }
    return OkStatus();
  }

  Status ReserveStaging() override {
    for (auto& r : rings_) ZINF_RETURN_IF_ERROR(r->staging().Reserve());
    return OkStatus();
  }

  void Enqueue(std::vector<IoPiece*> pieces) override {
    if (rings_.size() == 1) {
      rings_[0]->Push(pieces);
      return;
    }
    // Deal pieces to rings in turn so that one large request uses them all.
    const size_t n = rings_.size();
    const size_t start = next_ring_.fetch_add(1, std::memory_order_relaxed);
    std::vector<std::vector<IoPiece*>> dealt(n);
    for (size_t i = 0; i < pieces.size(); ++i) dealt[(start + i) % n].push_back(pieces[i]);
    for (size_t r = 0; r < n; ++r) {
      if (!dealt[r].empty()) rings_[r]->Push(dealt[r]);
    }
  }

 private:
  std::vector<std::unique_ptr<Ring>> rings_;
  std::vector<Region> regions_;
  bool fixed_files_ = false;
  std::atomic<size_t> next_ring_{0};
};

Ring::Ring(UringEngine* engine)
    : engine_(engine), staging_(engine->options().block_size, engine->options().queue_depth) {}

Status Ring::Init(unsigned entries) {
  const int rc = io_uring_queue_init(entries, &ring_, 0);
  if (rc < 0) {
    const int err = -rc;
    const std::string what =
        fmt::format("io_uring_queue_init({} entries): {}", entries, std::strerror(err));
    if (err == ENOSYS || err == EPERM || err == ENOMEM || err == EACCES) {
      return Unavailable(what);
    }
    return IoError(what);
  }
  initialized_ = true;
  return OkStatus();
}

Ring::~Ring() {
  if (initialized_) io_uring_queue_exit(&ring_);
}

void Ring::Stop() {
  if (!reaper_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    // The ring is idle here (the engine waited for every request), so a slot is free.
    if (sqe != nullptr) {
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data64(sqe, kWakeTag);
      SubmitLocked();
    }
  }
  reaper_.join();
}

void Ring::Push(std::vector<IoPiece*>& pieces) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.insert(pending_.end(), pieces.begin(), pieces.end());
  FillLocked();
}

void Ring::PrepLocked(io_uring_sqe* sqe, IoPiece* p) {
  int fd = p->fd;
  const bool fixed_file = engine_->fixed_files();
  if (fixed_file) fd = p->file;
  const int buf_index = engine_->FindRegion(p->buffer, p->length);
  const auto len = static_cast<unsigned>(p->length);  // block_size <= 256 MiB
  if (p->op == IoOp::kRead) {
    if (buf_index >= 0) {
      io_uring_prep_read_fixed(sqe, fd, p->buffer, len, p->offset, buf_index);
    } else {
      io_uring_prep_read(sqe, fd, p->buffer, len, p->offset);
    }
  } else {
    if (buf_index >= 0) {
      io_uring_prep_write_fixed(sqe, fd, p->buffer, len, p->offset, buf_index);
    } else {
      io_uring_prep_write(sqe, fd, p->buffer, len, p->offset);
    }
  }
  if (fixed_file) sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data(sqe, p);
}

void Ring::FillLocked() {
  const AioOptions& o = engine_->options();
  int prepared = 0;
  while (inflight_ < o.queue_depth && !pending_.empty()) {
    // Staged first: a piece keeps its slot if no entry is free, and a slot is free for every
    // piece that may be in flight.
    if (!UringEngine::Stage(pending_.front(), staging_)) break;
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) break;
    PrepLocked(sqe, pending_.front());
    pending_.pop_front();
    ++inflight_;
    ++prepared;
    if (o.single_submit) SubmitLocked();
  }
  if (prepared > 0 && !o.single_submit) SubmitLocked();
}

void Ring::SubmitLocked() {
  for (int attempt = 0;; ++attempt) {
    const int rc = io_uring_submit(&ring_);
    if (rc >= 0) return;
    if (rc == -EINTR) continue;
    if ((rc == -EAGAIN || rc == -EBUSY) && attempt < 100000) {
      // The kernel is short of request memory or the CQ is full: the reaper frees both.
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      continue;
    }
    // The prepared entries stay in the SQ and go with the next successful submit.
    log::Error("io_uring_submit: {}", std::strerror(-rc));
    return;
  }
}

void Ring::Reap() {
  struct Done {
    IoPiece* piece;
    Status status;
  };
  std::vector<std::pair<IoPiece*, int>> batch;
  std::vector<IoPiece*> requeue;
  std::vector<Done> done;
  for (;;) {
    io_uring_cqe* cqe = nullptr;
    // Waking once per eighth of the queue instead of per completion saves a wake-up and a
    // submit per request at small block sizes, and keeps the queue at least 7/8 full.
    const unsigned wait_for = std::max(1, inflight_.load(std::memory_order_relaxed) / 8);
    const int rc = io_uring_wait_cqe_nr(&ring_, &cqe, wait_for);
    if (rc < 0) {
      if (rc != -EINTR) log::Error("io_uring_wait_cqe: {}", std::strerror(-rc));
      continue;
    }
    bool wake = false;
    unsigned head;
    unsigned seen = 0;
    batch.clear();
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      if (cqe->user_data == kWakeTag) {
        wake = true;
      } else {
        batch.emplace_back(static_cast<IoPiece*>(io_uring_cqe_get_data(cqe)), cqe->res);
      }
    }
    io_uring_cq_advance(&ring_, seen);

    {
      // Under the mutex that prepared these pieces: the kernel orders the hand-over, but the
      // lock also makes it visible to race detectors. No callbacks run here; a staged read's
      // copy out (a block at most) does, so that its slot is free for the refill.
      std::lock_guard<std::mutex> lock(mu_);
      requeue.clear();
      done.clear();
      for (auto [p, res] : batch) {
        if (res < 0) {
          // See Note [Cancelled pieces]: resubmitted from here, the piece belongs to this
          // thread, which lives as long as the ring; the bound only guards against a loop.
          const bool cancelled = res == -ECANCELED && ++p->cancellations <= kMaxCancellations;
          if (res == -EAGAIN || res == -EINTR || cancelled) {
            requeue.push_back(p);
          } else {
            done.push_back({p, engine_->PieceErrno(*p, -res)});
          }
          continue;
        }
        const auto moved = static_cast<uint64_t>(res);
        if (moved >= p->length) {
          done.push_back({p, OkStatus()});
        } else if (moved == 0) {
          // No progress: a read at the end of the file, or a write the device would not take.
          done.push_back(
              {p, p->op == IoOp::kRead ? engine_->PieceEof(*p) : engine_->PieceErrno(*p, ENOSPC)});
        } else {
          // A short transfer: resubmit the rest, never report it as complete.
          p->buffer += moved;
          p->offset += moved;
          p->length -= moved;
          p->moved += moved;
          requeue.push_back(p);
        }
      }
      inflight_.fetch_sub(static_cast<int>(batch.size()), std::memory_order_relaxed);
      for (auto it = requeue.rbegin(); it != requeue.rend(); ++it) pending_.push_front(*it);
      // The finished pieces' slots first, so that the pieces waiting may take them.
      for (Done& d : done) UringEngine::Unstage(d.piece, d.status.ok());
      FillLocked();
    }
    for (Done& d : done) engine_->CompletePiece(d.piece, std::move(d.status));
    if (wake) return;
  }
}

}  // namespace

StatusOr<std::unique_ptr<IoEngine>> CreateUringEngine(const AioOptions& options) {
  ZINF_RETURN_IF_ERROR(options.Validate());
  auto engine = std::make_unique<UringEngine>(options);
  ZINF_RETURN_IF_ERROR(engine->Init());
  return std::unique_ptr<IoEngine>(std::move(engine));
}

}  // namespace zinf
