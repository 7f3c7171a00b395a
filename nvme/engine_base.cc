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
  // Unaligned direct I/O: pieces move `bounce`; a read copies into user_buffer at the end.
  HostBuffer bounce;
  void* user_buffer = nullptr;
};

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

  auto* parent = new IoParent;
  parent->done = std::move(done);
  parent->op = request.op;
  parent->path = f.path;
  parent->offset = request.offset;
  parent->length = request.length;
  char* data = static_cast<char*>(request.buffer);
  uint64_t length = request.length;
  const bool unaligned = reinterpret_cast<uintptr_t>(request.buffer) % kDirectIoAlignment != 0 ||
                         request.length % kDirectIoAlignment != 0;
  if (f.direct && unaligned) {
    // See Note [Direct I/O alignment]: move an aligned copy, zero-padded to the boundary.
    length = AlignUp(request.length, kDirectIoAlignment);
    auto bounce = HostBuffer::Allocate(length);
    if (!bounce.ok()) {
      Status s = bounce.status().WithContext(
          fmt::format("{} of {} at offset {}: allocating an aligned bounce buffer",
                      IoOpName(request.op), f.path, request.offset));
      IoCallback cb = std::move(parent->done);
      delete parent;
      cb(std::move(s));
      return;
    }
    parent->bounce = std::move(*bounce);
    if (request.op == IoOp::kWrite) {
      std::memcpy(parent->bounce.data(), request.buffer, request.length);
      std::memset(parent->bounce.as<char>() + request.length, 0, length - request.length);
    } else {
      parent->user_buffer = request.buffer;
    }
    data = parent->bounce.as<char>();
  }

  const uint64_t block = options_.block_size;
  std::vector<IoPiece*> pieces;
  pieces.reserve((length + block - 1) / block);
  for (uint64_t pos = 0; pos < length; pos += block) {
    auto* piece = new IoPiece;
    piece->parent = parent;
    piece->op = request.op;
    piece->file = request.file;
    piece->fd = f.fd;
    piece->offset = request.offset + pos;
    piece->buffer = data + pos;
    piece->length = std::min(block, length - pos);
    pieces.push_back(piece);
  }
  parent->remaining.store(static_cast<int64_t>(pieces.size()), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(outstanding_mu_);
    ++outstanding_;
  }
  Enqueue(std::move(pieces));
}

void EngineBase::CompletePiece(IoPiece* piece, Status status) {
  IoParent* parent = piece->parent;
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
  if (result.ok() && parent->user_buffer != nullptr) {
    std::memcpy(parent->user_buffer, parent->bounce.data(), parent->length);
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
