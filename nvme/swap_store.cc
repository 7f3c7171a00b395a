// SwapStore: swap files, striping, extents, checksums and the sticky write error.
// Thread-safety: see swap_store.h.
#include "nvme/swap_store.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "core/crc32c.h"
#include "core/log.h"
#include "core/units.h"
#include "nvme/path_probe.h"

namespace zinf {

struct SwapStore::Extent {
  enum class State { kEmpty, kWriting, kWritten, kFailed };
  std::string name;
  uint64_t offset = 0;  // logical swap address
  uint64_t size = 0;
  State state = State::kEmpty;
  Status write_error;
  std::vector<uint32_t> crcs;  // one per stripe piece, when options_.checksum
};

// Note [Checksums beside the I/O]
// Taken for the whole extent before its write was issued, or checked after its whole read had
// landed, the CRC32Cs were added to every transfer (a 1 GiB tensor: writes at 0.84x and reads
// at 0.78x of DeepSpeed's aio_handle, which checks nothing; bench/RESULTS.md). So with
// checksums each piece is a request of its own: a write's pieces are issued as their CRCs are
// taken, and a read's pieces are checked as each lands (on the I/O engine's completion thread,
// while the rest are in flight). That hid a read's checksums almost wholly (1.06x against
// 1.09x without them); a write's still cost about a fifth (0.92x against 1.18x).

struct SwapStore::Op {
  IoOp op = IoOp::kRead;
  uint64_t id = 0;
  std::string name;
  uint64_t offset = 0;
  uint64_t size = 0;
  char* data = nullptr;
  IoCallback done;
  std::vector<uint32_t> crcs;    // write: taken from src; read: expected
  std::vector<uint8_t> checked;  // read: pieces whose CRC was checked (one writer each)
  std::atomic<int64_t> remaining{0};
  std::mutex mu;
  Status error;

  // The checksummed pieces: the piece that byte `pos` of the extent lies in, where piece k
  // begins, and the bytes of the piece that begins at `pos`.
  size_t Piece(uint64_t pos, uint64_t stripe) const {
    return (offset + pos) / stripe - offset / stripe;
  }
  uint64_t PieceBegin(size_t k, uint64_t stripe) const {
    return k == 0 ? 0 : (offset / stripe + k) * stripe - offset;
  }
  uint64_t PieceBytes(uint64_t pos, uint64_t stripe) const {
    return std::min(stripe - (offset + pos) % stripe, size - pos);
  }
  void SetError(Status status) {
    std::lock_guard<std::mutex> lock(mu);
    if (error.ok()) error = std::move(status);
  }
};

Status SwapStoreOptions::Validate() const {
  if (paths.empty()) {
    return InvalidArgument("swap store: expected at least one nvme path, got none");
  }
  std::set<std::string> seen;
  for (const std::string& p : paths) {
    if (p.empty()) return InvalidArgument("swap store: an nvme path is the empty string");
    if (!seen.insert(p).second) {
      return InvalidArgument(fmt::format("swap store: nvme path {} is listed twice", p));
    }
  }
  if (rank < 0) return InvalidArgument(fmt::format("swap store: rank must be >= 0, got {}", rank));
  if (capacity_bytes == 0) {
    return InvalidArgument("swap store: capacity_bytes must be positive, got 0");
  }
  if (stripe_bytes != 0 && (stripe_bytes % kDirectIoAlignment != 0 || stripe_bytes > kGiB)) {
    return InvalidArgument(fmt::format(
        "swap store: stripe_bytes must be 0 (aio.block_size) or a multiple of {} up to 1 GiB, "
        "got {}",
        kDirectIoAlignment, stripe_bytes));
  }
  return aio.Validate();
}

namespace {

// Checks one path before anything is created in it.
Status CheckPath(const std::string& path, struct stat* st) {
  if (stat(path.c_str(), st) != 0) {
    if (errno == ENOENT) {
      return InvalidArgument(fmt::format("nvme path {} does not exist", path));
    }
    return ErrnoStatus(errno, fmt::format("nvme path {}", path));
  }
  if (!S_ISDIR(st->st_mode)) {
    return InvalidArgument(fmt::format("nvme path {} is not a directory", path));
  }
  struct statvfs vfs {};
  if (statvfs(path.c_str(), &vfs) == 0 && (vfs.f_flag & ST_RDONLY) != 0) {
    return FailedPrecondition(fmt::format("nvme path {} is on a read-only file system", path));
  }
  if (access(path.c_str(), W_OK | X_OK) != 0) {
    return FailedPrecondition(
        fmt::format("nvme path {} is not writable: {}", path, std::strerror(errno)));
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<SwapStore>> SwapStore::Open(const SwapStoreOptions& options,
                                                     std::unique_ptr<IoEngine> engine) {
  ZINF_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<SwapStore> store(new SwapStore(options, std::move(engine)));
  ZINF_RETURN_IF_ERROR(store->Init());
  return store;
}

SwapStore::SwapStore(const SwapStoreOptions& options, std::unique_ptr<IoEngine> engine)
    : options_(options),
      stripe_(options.stripe_bytes != 0 ? options.stripe_bytes : options.aio.block_size),
      engine_(std::move(engine)),
      allocator_(0, kDirectIoAlignment) {}

Status SwapStore::Init() {
  const uint64_t n = options_.paths.size();
  file_bytes_ = AlignUp((options_.capacity_bytes + n - 1) / n, stripe_);

  // Free space, summed per file system so that two paths on one disk are not counted twice.
  std::map<dev_t, std::pair<uint64_t, std::vector<std::string>>> need;  // dev -> bytes, paths
  std::map<dev_t, uint64_t> have;
  for (const std::string& path : options_.paths) {
    struct stat st {};
    ZINF_RETURN_IF_ERROR(CheckPath(path, &st));
    auto& [bytes, paths] = need[st.st_dev];
    bytes += file_bytes_;
    paths.push_back(path);
    ZINF_ASSIGN_OR_RETURN(uint64_t free_bytes, FreeBytes(path));
    // A swap file left by an earlier run is reused: its blocks count as free.
    struct stat old {};
    const std::string file =
        fmt::format("{}/zinf-swap-rank{}-{}.bin", path, options_.rank, file_paths_.size());
    if (stat(file.c_str(), &old) == 0 && S_ISREG(old.st_mode)) {
      free_bytes += static_cast<uint64_t>(old.st_blocks) * 512;
    }
    have[st.st_dev] += free_bytes;
    file_paths_.push_back(file);
  }
  for (const auto& [dev, entry] : need) {
    const auto& [bytes, paths] = entry;
    // statvfs counts the free space once per file system; `have` added it once per path.
    const uint64_t free_bytes = have[dev] / paths.size();
    if (free_bytes < bytes) {
      return ResourceExhausted(fmt::format(
          "not enough disk space for {} of swap: {} needs {} ({} per path over {} path(s)), "
          "it has {} free",
          FormatBytes(options_.capacity_bytes), fmt::join(paths, ", "), FormatBytes(bytes),
          FormatBytes(file_bytes_), n, FormatBytes(free_bytes)));
    }
  }

  if (!engine_) {
    // aio.queue_depth is per path: striping over n devices keeps each as busy as one alone.
    AioOptions aio = options_.aio;
    aio.queue_depth = static_cast<int>(
        std::min<uint64_t>(static_cast<uint64_t>(aio.queue_depth) * n, kMaxAioQueueDepth));
    ZINF_ASSIGN_OR_RETURN(engine_, CreateIoEngine(aio));
  }
  for (const std::string& file : file_paths_) {
    ZINF_ASSIGN_OR_RETURN(IoFile f, OpenIoFile(file, /*create=*/true, options_.aio.direct_io));
    // Unlinked while still empty: the descriptor keeps the file, and however the process ends
    // (kill -9 included) the kernel frees its space; no full-size file is ever left behind.
    // Nothing opens a swap file by its path again. A file left by an older zinf is reused
    // and so removed too.
    if (unlink(file.c_str()) != 0 && errno != ENOENT) {
      log::Warn("swap file {} cannot be unlinked while open ({}); it is deleted at close instead",
                file, std::strerror(errno));
      unlink_at_close_.push_back(file);
    }
    // Two stores that opened the same file before either unlinked it would overwrite each
    // other's tensors; the lock lives as long as the descriptor, so a crashed owner does not
    // hold it.
    bool locked = flock(f.fd(), LOCK_EX | LOCK_NB) == 0;
    for (int waited = 0; !locked && waited < options_.lock_wait_ms; waited += 10) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      locked = flock(f.fd(), LOCK_EX | LOCK_NB) == 0;
    }
    if (!locked) {
      return FailedPrecondition(fmt::format(
          "swap file {} is in use by another swap store (another process or engine with the "
          "same nvme path and rank); give each its own nvme_path",
          file));
    }
    // Start from an empty file so that no stale data can be read back as a tensor.
    if (ftruncate(f.fd(), 0) != 0) {
      return ErrnoStatus(errno, fmt::format("truncating swap file {}", file));
    }
    if (fallocate(f.fd(), 0, 0, static_cast<off_t>(file_bytes_)) != 0) {
      const int err = errno;
      if (err != EOPNOTSUPP) {
        return ErrnoStatus(
            err, fmt::format("preallocating {} for swap file {}", FormatBytes(file_bytes_), file));
      }
      log::Warn(
          "{}: the file system cannot preallocate (fallocate: {}); the swap file is "
          "sparse and a full disk will show up as write errors",
          file, std::strerror(err));
      if (ftruncate(f.fd(), static_cast<off_t>(file_bytes_)) != 0) {
        return ErrnoStatus(errno, fmt::format("sizing swap file {}", file));
      }
    }
    direct_ = direct_ && f.direct();
    ZINF_ASSIGN_OR_RETURN(int id, engine_->AddFile(f));
    file_ids_.push_back(id);
    files_.push_back(std::move(f));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    allocator_ = ExtentAllocator(file_bytes_ * n, kDirectIoAlignment);
  }
  log::Debug("swap store: {} file(s) of {}, stripe {}, engine {}, {} I/O, checksum {}", n,
             FormatBytes(file_bytes_), FormatBytes(stripe_), engine_->name(),
             direct_ ? "direct" : "buffered", options_.checksum ? "on" : "off");
  return OkStatus();
}

SwapStore::~SwapStore() {
  if (engine_) engine_->Drain();
  engine_.reset();  // joins the engine's threads before the files close
  files_.clear();   // the files were unlinked at Open: closing frees their space
  for (const std::string& file : unlink_at_close_) {
    if (unlink(file.c_str()) != 0 && errno != ENOENT) {
      log::Warn("deleting swap file {}: {}", file, std::strerror(errno));
    }
  }
}

uint64_t SwapStore::capacity_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocator_.capacity_bytes();
}

uint64_t SwapStore::free_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocator_.free_bytes();
}

size_t SwapStore::extent_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return extents_.size();
}

size_t SwapStore::free_ranges() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocator_.free_ranges();
}

Status SwapStore::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sticky_;
}

Status SwapStore::RegisterBuffer(void* data, uint64_t size_bytes) {
  return engine_->RegisterBuffer(data, size_bytes);
}

StatusOr<SwapExtent> SwapStore::Allocate(uint64_t size_bytes, std::string name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!sticky_.ok()) {
    return Status(sticky_.code(), fmt::format("swap store refuses new extents after a failed "
                                              "write: {}",
                                              sticky_.message()));
  }
  auto offset = allocator_.Allocate(size_bytes);
  if (!offset.ok()) {
    // Past the capacity the store was made with: say so, and what to do, at the source, so
    // that every binding passes on the same words.
    std::string what = fmt::format(
        "allocating swap for tensor '{}' ({} bytes) in a swap store "
        "of capacity {}",
        name, size_bytes, FormatBytes(options_.capacity_bytes));
    if (offset.status().code() == StatusCode::kResourceExhausted) {
      what += " (free tensors stored earlier, or create the store with a larger capacity_bytes)";
    }
    return offset.status().WithContext(what);
  }
  auto extent = std::make_unique<Extent>();
  extent->name = std::move(name);
  extent->offset = *offset;
  extent->size = size_bytes;
  const uint64_t id = next_id_++;
  extents_.emplace(id, std::move(extent));
  return SwapExtent{id, size_bytes};
}

Status SwapStore::Free(SwapExtent extent) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = extents_.find(extent.id);
  if (it == extents_.end()) {
    return InvalidArgument(
        fmt::format("freeing swap extent id {}: no such extent (double free?)", extent.id));
  }
  ZINF_RETURN_IF_ERROR(allocator_.Free(it->second->offset, it->second->size));
  extents_.erase(it);
  return OkStatus();
}

SwapStore::Segment SwapStore::Map(uint64_t logical) const {
  const uint64_t n = files_.size();
  const uint64_t stripe_index = logical / stripe_;
  Segment s;
  s.file = static_cast<int>(stripe_index % n);
  s.file_offset = (stripe_index / n) * stripe_ + logical % stripe_;
  return s;
}

std::vector<SwapStore::Segment> SwapStore::Segments(uint64_t offset, uint64_t size) const {
  std::vector<Segment> out;
  for (uint64_t pos = 0; pos < size;) {
    const uint64_t logical = offset + pos;
    const uint64_t len = std::min(stripe_ - logical % stripe_, size - pos);
    Segment s = Map(logical);
    s.extent_offset = pos;
    s.length = len;
    if (!options_.checksum && !out.empty() && out.back().file == s.file &&
        out.back().file_offset + out.back().length == s.file_offset) {
      out.back().length += len;  // one path, no checksums: the whole extent is one run
    } else {
      out.push_back(s);
    }
    pos += len;
  }
  Segment& last = out.back();
  const uint64_t tail = last.length % kDirectIoAlignment;
  if (tail != 0 && last.length > kDirectIoAlignment) {
    Segment t = last;
    last.length -= tail;
    t.file_offset += last.length;
    t.extent_offset += last.length;
    t.length = tail;
    out.push_back(t);
  }
  return out;
}

void SwapStore::WriteAsync(SwapExtent extent, const void* src, IoCallback done) {
  auto op = std::make_unique<Op>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!sticky_.ok()) {
      Status s(sticky_.code(), fmt::format("swap store refuses writes after a failed write: {}",
                                           sticky_.message()));
      done(std::move(s));
      return;
    }
    auto it = extents_.find(extent.id);
    if (it == extents_.end() || it->second->size != extent.size_bytes || src == nullptr) {
      done(InvalidArgument(fmt::format("writing swap extent id {} ({} bytes) from {}: {}",
                                       extent.id, extent.size_bytes, src,
                                       src == nullptr ? "null source buffer" : "no such extent")));
      return;
    }
    Extent& e = *it->second;
    e.state = Extent::State::kWriting;
    op->name = e.name;
    op->offset = e.offset;
    op->size = e.size;
  }
  op->op = IoOp::kWrite;
  op->id = extent.id;
  op->data = const_cast<char*>(static_cast<const char*>(src));
  op->done = std::move(done);
  const std::vector<Segment> segments = Segments(op->offset, op->size);
  op->remaining.store(static_cast<int64_t>(segments.size()));
  uint64_t summed = 0;  // bytes of the extent whose pieces' CRCs are taken
  Op* raw = op.release();
  // Each piece's CRC just before its request (Note [Checksums beside the I/O]). Only this
  // thread touches raw->crcs until the last request is issued, and the op ends no earlier.
  for (const Segment& s : segments) {
    while (options_.checksum && summed < s.extent_offset + s.length) {
      const uint64_t len = raw->PieceBytes(summed, stripe_);
      raw->crcs.push_back(Crc32c(raw->data + summed, len));
      summed += len;
    }
    IoRequest r{IoOp::kWrite, file_ids_[static_cast<size_t>(s.file)], s.file_offset,
                raw->data + s.extent_offset, s.length};
    engine_->Submit(r, [this, raw](Status st) { Finish(raw, std::move(st)); });
  }
}

void SwapStore::ReadAsync(SwapExtent extent, void* dst, IoCallback done) {
  auto op = std::make_unique<Op>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = extents_.find(extent.id);
    if (it == extents_.end() || it->second->size != extent.size_bytes || dst == nullptr) {
      done(InvalidArgument(fmt::format(
          "reading swap extent id {} ({} bytes) into {}: {}", extent.id, extent.size_bytes, dst,
          dst == nullptr ? "null destination buffer" : "no such extent")));
      return;
    }
    const Extent& e = *it->second;
    switch (e.state) {
      case Extent::State::kWritten:
        break;
      case Extent::State::kFailed:
        done(
            DataLoss(fmt::format("reading tensor '{}': its write failed, the data is not on "
                                 "disk: {}",
                                 e.name, e.write_error.message())));
        return;
      case Extent::State::kEmpty:
      case Extent::State::kWriting:
        done(FailedPrecondition(fmt::format("reading tensor '{}': {}", e.name,
                                            e.state == Extent::State::kEmpty
                                                ? "it was never written"
                                                : "its write has not completed")));
        return;
    }
    op->name = e.name;
    op->offset = e.offset;
    op->size = e.size;
    op->crcs = e.crcs;
  }
  op->op = IoOp::kRead;
  op->id = extent.id;
  op->data = static_cast<char*>(dst);
  op->done = std::move(done);
  if (options_.checksum) {
    if (op->size == 0 || op->crcs.size() != op->Piece(op->size - 1, stripe_) + 1) {
      done(DataLoss(fmt::format("reading tensor '{}': {} checksums recorded for its {} bytes",
                                op->name, op->crcs.size(), op->size)));
      return;
    }
    op->checked.assign(op->crcs.size(), 0);
  }
  const std::vector<Segment> segments = Segments(op->offset, op->size);
  op->remaining.store(static_cast<int64_t>(segments.size()));
  Op* raw = op.release();
  for (const Segment& s : segments) {
    IoRequest r{IoOp::kRead, file_ids_[static_cast<size_t>(s.file)], s.file_offset,
                raw->data + s.extent_offset, s.length};
    engine_->Submit(
        r, [this, raw, begin = s.extent_offset, end = s.extent_offset + s.length](Status st) {
          // Checked as it lands (Note [Checksums beside the I/O]); a piece split between two
          // requests (the unaligned tail) is checked once all have.
          if (st.ok() && options_.checksum) raw->SetError(VerifyPieces(*raw, begin, end));
          Finish(raw, std::move(st));
        });
  }
}

Status SwapStore::VerifyPieces(Op& op, uint64_t begin, uint64_t end) const {
  for (size_t k = op.Piece(begin, stripe_); k < op.checked.size(); ++k) {
    const uint64_t pos = op.PieceBegin(k, stripe_);
    const uint64_t len = op.PieceBytes(pos, stripe_);
    if (pos >= end) break;
    if (pos < begin || pos + len > end) continue;  // not wholly in [begin, end)
    if (op.checked[k] != 0) continue;
    op.checked[k] = 1;
    const uint32_t got = Crc32c(op.data + pos, len);
    if (got != op.crcs[k]) {
      const Segment where = Map(op.offset + pos);
      return DataLoss(fmt::format(
          "tensor '{}': checksum mismatch reading {} at offset {} ({} bytes, tensor bytes "
          "[{}, {})): stored crc32c {:#010x}, read {:#010x}",
          op.name, file_paths_[static_cast<size_t>(where.file)], where.file_offset, len, pos,
          pos + len, op.crcs[k], got));
    }
  }
  return OkStatus();
}

void SwapStore::Finish(Op* raw, Status status) {
  if (!status.ok()) {
    std::lock_guard<std::mutex> lock(raw->mu);
    if (raw->error.ok()) raw->error = std::move(status);
  }
  if (raw->remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  std::unique_ptr<Op> op(raw);
  Status result;
  {
    std::lock_guard<std::mutex> lock(op->mu);
    result = std::move(op->error);
  }
  if (op->op == IoOp::kWrite) {
    if (!result.ok()) {
      result = std::move(result).WithContext(
          fmt::format("writing tensor '{}' ({} bytes) to swap", op->name, op->size));
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = extents_.find(op->id);
    if (it != extents_.end()) {
      Extent& e = *it->second;
      e.state = result.ok() ? Extent::State::kWritten : Extent::State::kFailed;
      e.write_error = result;
      e.crcs = std::move(op->crcs);
    }
    if (!result.ok() && sticky_.ok()) sticky_ = result;
  } else if (!result.ok()) {
    result = std::move(result).WithContext(
        fmt::format("reading tensor '{}' ({} bytes) from swap", op->name, op->size));
  } else if (options_.checksum) {
    // Every request has landed: the pieces no single request held (a split tail).
    result = VerifyPieces(*op, 0, op->size);
  }
  IoCallback done = std::move(op->done);
  op.reset();
  done(std::move(result));
}

Status SwapStore::Write(SwapExtent extent, const void* src) {
  IoWaiter waiter;
  waiter.Add();
  WriteAsync(extent, src, waiter.Callback());
  return waiter.Wait();
}

Status SwapStore::Read(SwapExtent extent, void* dst) {
  IoWaiter waiter;
  waiter.Add();
  ReadAsync(extent, dst, waiter.Callback());
  return waiter.Wait();
}

}  // namespace zinf
