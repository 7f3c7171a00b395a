// EngineBase: what every IoEngine backend shares. It checks requests, splits them into
// block_size pieces, stages the unaligned pieces of direct I/O through aligned slots, gathers
// the pieces' results into one completion per request and counts outstanding requests for
// Drain. A backend only moves pieces: Enqueue takes them, it calls Stage before issuing one,
// and CompletePiece (or requeue logic of its own for short transfers) as each finishes.
//
// Note [Staging unaligned direct I/O]
// O_DIRECT moves only aligned memory (Note [Direct I/O alignment]), and a caller's buffer need
// not be: torch's allocator aligns even a 1 GiB tensor to 64 bytes, not to a page. Such a
// request once moved through one aligned copy of its whole length, mapped for it and faulted
// in page by page, and copied before its first byte went to disk; with checksums, whose
// requests are one piece each, every piece mapped a copy of its own (bench/RESULTS.md,
// 2026-11-28). Now each unaligned piece moves through one block-sized slot of its queue's
// StagingSlots: a write's bytes are copied in as the piece is issued, a read's copied out as
// it lands, so the copies overlap the other pieces' I/O and the slots, mapped once, are
// reused. A queue has a slot for each piece it can have in flight, so none waits for one.
//
// Thread-safety: as IoEngine. CompletePiece may be called from any backend thread.
#ifndef ZINF_NVME_ENGINE_BASE_H_
#define ZINF_NVME_ENGINE_BASE_H_

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "nvme/io_engine.h"
#include "zinf/host_memory.h"

namespace zinf::nvme_internal {

struct IoParent;
class StagingSlots;

// One system-call-sized part of a request. Backends advance offset/buffer/length past the
// bytes a short transfer moved and resubmit the rest.
struct IoPiece {
  IoParent* parent = nullptr;
  IoOp op = IoOp::kRead;
  int file = -1;
  int fd = -1;
  uint64_t offset = 0;
  char* buffer = nullptr;
  uint64_t length = 0;
  uint64_t moved = 0;     // bytes moved by earlier short transfers of this piece
  int cancellations = 0;  // times the kernel cancelled it (See Note [Cancelled pieces])
  // An unaligned piece of direct I/O (Note [Staging unaligned direct I/O]): the caller's
  // bytes it moves, and the slot it moves them through while it holds one (length is then
  // user_length rounded up to kDirectIoAlignment).
  char* user = nullptr;
  uint64_t user_length = 0;
  char* staging = nullptr;
  StagingSlots* slots = nullptr;
};

// The aligned slots of one block that a queue's unaligned pieces move through (Note [Staging
// unaligned direct I/O]). Thread-safe.
class StagingSlots {
 public:
  StagingSlots(uint64_t block_bytes, int count) : block_(block_bytes), count_(count) {}
  // Maps the slots on first use; the error says why it could not.
  [[nodiscard]] Status Reserve();
  // A free slot, or nullptr if all are held (or none are reserved).
  char* Acquire();
  void Release(char* slot);

 private:
  const uint64_t block_;
  const int count_;
  std::mutex mu_;
  HostBuffer memory_;        // guarded by mu_
  std::vector<char*> free_;  // guarded by mu_
};

struct FileSlot {
  int fd = -1;
  std::string path;
  bool direct = false;
};

class EngineBase : public IoEngine {
 public:
  explicit EngineBase(const AioOptions& options) : options_(options) {}
  ~EngineBase() override = default;

  const AioOptions& options() const override { return options_; }
  StatusOr<int> AddFile(const IoFile& file) override;
  void Submit(const IoRequest& request, IoCallback done) final;
  using IoEngine::Submit;
  void Drain() override;

 protected:
  // Registers the new file with the backend (io_uring: the fixed file table).
  [[nodiscard]] virtual Status OnAddFile(int id, int fd) {
    (void)id;
    (void)fd;
    return OkStatus();
  }
  // Takes ownership of `pieces` (all of one request, in file order).
  virtual void Enqueue(std::vector<IoPiece*> pieces) = 0;
  // Maps every queue's staging slots, before the first unaligned piece is enqueued.
  [[nodiscard]] virtual Status ReserveStaging() = 0;

  // Readies `piece` to be issued: an unaligned one takes a slot from `slots` (a write copies
  // its bytes in, zero-padded) unless it holds one already. False when no slot is free.
  static bool Stage(IoPiece* piece, StagingSlots& slots);
  // Gives back the piece's slot, if it holds one, copying a read's bytes out when `ok`.
  static void Unstage(IoPiece* piece, bool ok);

  // Ends `piece` (unstaging and deleting it) with OK or its error; the last piece of a request
  // completes it.
  void CompletePiece(IoPiece* piece, Status status);
  // The error for a piece that failed with errno `err`, naming file, offset and length.
  Status PieceErrno(const IoPiece& piece, int err) const;
  // The error for a read that met the end of the file.
  Status PieceEof(const IoPiece& piece) const;

  const FileSlot& file(int id) const { return files_[static_cast<size_t>(id)]; }

  // Blocks until every request has completed; backends call it first in their destructors,
  // while their threads still run.
  void WaitForOutstanding();

  const AioOptions options_;

 private:
  std::mutex files_mu_;
  std::array<FileSlot, kMaxFiles> files_;
  std::atomic<int> num_files_{0};

  std::mutex outstanding_mu_;
  std::condition_variable outstanding_cv_;
  int64_t outstanding_ = 0;
};

}  // namespace zinf::nvme_internal

#endif  // ZINF_NVME_ENGINE_BASE_H_
