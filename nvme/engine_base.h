// EngineBase: what every IoEngine backend shares. It checks requests, bounces unaligned
// direct I/O through an aligned copy, splits requests into block_size pieces, gathers the
// pieces' results into one completion per request and counts outstanding requests for Drain.
// A backend only moves pieces: Enqueue takes them, and it calls CompletePiece (or Requeue
// logic of its own for short transfers) as each finishes.
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

  // Ends `piece` (deleting it) with OK or its error; the last piece of a request completes it.
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
