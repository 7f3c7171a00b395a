// EngineBase: request checks, bounce buffers, splitting and completion accounting shared by
// the io_uring and POSIX backends. Thread-safety: see engine_base.h.
#include "nvme/engine_base.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>

#include "core/log.h"
#include "core/units.h"

namespace zinf::nvme_internal {

// Everything a request needs until its last piece completes.
struct IoParent {
  IoCallback done;
  IoOp op = IoOp::kRead;
  std::string path;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::atomic<int64_t> remaining{0};
  std::mutex mu;
  Status error;  // first piece error
};

Status StagingSlots::Reserve() {
  std::lock_guard<std::mutex> lock(mu_);
  if (memory_.data() != nullptr) return OkStatus();
  ZINF_ASSIGN_OR_RETURN(memory_, HostBuffer::Allocate(block_ * static_cast<uint64_t>(count_)));
  for (int i = count_ - 1; i >= 0; --i) free_.push_back(memory_.as<char>() + i * block_);
  return OkStatus();
}

char* StagingSlots::Acquire() {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) return nullptr;
  char* slot = free_.back();
  free_.pop_back();
  return slot;
}

void StagingSlots::Release(char* slot) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(slot);
}

bool EngineBase::Stage(IoPiece* piece, StagingSlots& slots) {
  if (piece->user == nullptr || piece->staging != nullptr) return true;
  char* slot = slots.Acquire();
  if (slot == nullptr) return false;
  if (piece->op == IoOp::kWrite) {
    std::memcpy(slot, piece->user, piece->user_length);
    std::memset(slot + piece->user_length, 0, piece->length - piece->user_length);
  }
  piece->staging = slot;
  piece->slots = &slots;
  piece->buffer = slot;
  return true;
}

void EngineBase::Unstage(IoPiece* piece, bool ok) {
  if (piece->staging == nullptr) return;
  if (ok && piece->op == IoOp::kRead) {
    std::memcpy(piece->user, piece->staging, piece->user_length);
  }
  piece->slots->Release(piece->staging);
  piece->staging = nullptr;
}

StatusOr<int> EngineBase::AddFile(const IoFile& file) {
  if (file.fd() < 0) {
    return InvalidArgument(fmt::format("IoEngine::AddFile: file {} is not open", file.path()));
  }
  std::lock_guard<std::mutex> lock(files_mu_);
  const int id = num_files_.load(std::memory_order_relaxed);
  if (id >= kMaxFiles) {
    return ResourceExhausted(
        fmt::format("IoEngine::AddFile: {} already holds {} files, the most it can; cannot add {}",
                    name(), kMaxFiles, file.path()));
  }
  ZINF_RETURN_IF_ERROR_CTX(OnAddFile(id, file.fd()),
                           fmt::format("registering {} with {}", file.path(), name()));
  files_[static_cast<size_t>(id)] = FileSlot{file.fd(), file.path(), file.direct()};
  num_files_.store(id + 1, std::memory_order_release);
  return id;
}

void EngineBase::Submit(const IoRequest& request, IoCallback done) {
  const int nfiles = num_files_.load(std::memory_order_acquire);
  if (request.file < 0 || request.file >= nfiles) {
    done(InvalidArgument(fmt::format("{} request names file id {}, expected one in [0, {})",
                                     IoOpName(request.op), request.file, nfiles)));
    return;
  }
  const FileSlot& f = file(request.file);
  if (request.buffer == nullptr || request.length == 0) {
    done(InvalidArgument(fmt::format(
        "{} of {} at offset {}: buffer must be non-null and length positive, got buffer {} "
        "length {}",
        IoOpName(request.op), f.path, request.offset, request.buffer, request.length)));
    return;
  }
  if (f.direct && request.offset % kDirectIoAlignment != 0) {
    done(InvalidArgument(
        fmt::format("{} of {} at offset {}: O_DIRECT needs offsets that are multiples of {}",
                    IoOpName(request.op), f.path, request.offset, kDirectIoAlignment)));
    return;
  }

  // Pieces of direct I/O whose memory or length is unaligned are staged (Note [Staging
  // unaligned direct I/O]); their length on disk is rounded up to the alignment.
  char* data = static_cast<char*>(request.buffer);
  const uint64_t block = options_.block_size;
  std::vector<IoPiece*> pieces;
  pieces.reserve((request.length + block - 1) / block);
  bool staged = false;
  for (uint64_t pos = 0; pos < request.length; pos += block) {
    auto* piece = new IoPiece;
    piece->op = request.op;
    piece->file = request.file;
    piece->fd = f.fd;
    piece->offset = request.offset + pos;
    piece->buffer = data + pos;
    piece->length = std::min(block, request.length - pos);
    if (f.direct && (reinterpret_cast<uintptr_t>(piece->buffer) % kDirectIoAlignment != 0 ||
                     piece->length % kDirectIoAlignment != 0)) {
      piece->user = piece->buffer;
      piece->user_length = piece->length;
      piece->buffer = nullptr;
      piece->length = AlignUp(piece->length, kDirectIoAlignment);
      staged = true;
    }
    pieces.push_back(piece);
  }
  if (Status s = staged ? ReserveStaging() : OkStatus(); !s.ok()) {
    for (IoPiece* piece : pieces) delete piece;
    done(
        std::move(s).WithContext(fmt::format("{} of {} at offset {}: mapping the slots that "
                                             "stage unaligned direct I/O",
                                             IoOpName(request.op), f.path, request.offset)));
    return;
  }
  auto* parent = new IoParent;
  parent->done = std::move(done);
  parent->op = request.op;
  parent->path = f.path;
  parent->offset = request.offset;
  parent->length = request.length;
  for (IoPiece* piece : pieces) piece->parent = parent;
  parent->remaining.store(static_cast<int64_t>(pieces.size()), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(outstanding_mu_);
    ++outstanding_;
  }
  Enqueue(std::move(pieces));
}

void EngineBase::CompletePiece(IoPiece* piece, Status status) {
  IoParent* parent = piece->parent;
  Unstage(piece, status.ok());
  delete piece;
  if (!status.ok()) {
    std::lock_guard<std::mutex> lock(parent->mu);
    if (parent->error.ok()) parent->error = std::move(status);
  }
  if (parent->remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;

  Status result;
  {
    std::lock_guard<std::mutex> lock(parent->mu);
    result = std::move(parent->error);
  }
  IoCallback done = std::move(parent->done);
  delete parent;
  done(std::move(result));
  std::lock_guard<std::mutex> lock(outstanding_mu_);
  if (--outstanding_ == 0) outstanding_cv_.notify_all();
}

Status EngineBase::PieceErrno(const IoPiece& piece, int err) const {
  const IoParent& p = *piece.parent;
  return ErrnoStatus(
      err, fmt::format("{} {} at offset {} ({} bytes; request of {} bytes at "
                       "offset {})",
                       IoOpName(piece.op), p.path, piece.offset, piece.length, p.length, p.offset));
}

Status EngineBase::PieceEof(const IoPiece& piece) const {
  const IoParent& p = *piece.parent;
  return DataLoss(fmt::format(
      "read {} at offset {}: end of file after {} of {} bytes (request of {} bytes at offset {})",
      p.path, piece.offset, piece.moved, piece.moved + piece.length, p.length, p.offset));
}

void EngineBase::Drain() { WaitForOutstanding(); }

void EngineBase::WaitForOutstanding() {
  std::unique_lock<std::mutex> lock(outstanding_mu_);
  outstanding_cv_.wait(lock, [&] { return outstanding_ == 0; });
}

}  // namespace zinf::nvme_internal
