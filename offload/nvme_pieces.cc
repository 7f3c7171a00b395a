// NvmePieces: see offload/nvme_pieces.h.
#include "offload/nvme_pieces.h"

#include <fmt/core.h>

#include <algorithm>
#include <utility>

#include "core/log.h"

namespace zinf {

StatusOr<std::unique_ptr<NvmePieces>> NvmePieces::Open(const SwapStoreOptions& swap,
                                                       uint64_t piece_bytes, int staging_buffers,
                                                       bool pin_staging,
                                                       std::unique_ptr<IoEngine> engine) {
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<SwapStore> store, SwapStore::Open(swap, std::move(engine)));
  std::unique_ptr<NvmePieces> pieces(new NvmePieces(std::move(store), piece_bytes));
  PinnedPoolOptions sp;
  sp.name = "tiered store staging";
  sp.budget_bytes = piece_bytes * staging_buffers;
  sp.preallocate = true;
  sp.pinned = pin_staging;
  ZINF_ASSIGN_OR_RETURN(pieces->staging_pool_, MemoryPool::CreatePinned(sp));
  MutexLock lock(&pieces->mu_);
  for (int i = 0; i < staging_buffers; ++i) {
    ZINF_ASSIGN_OR_RETURN(PoolBlock b, pieces->staging_pool_->Allocate(piece_bytes));
    pieces->staging_free_.push_back(std::move(b));
  }
  return pieces;
}

NvmePieces::NvmePieces(std::unique_ptr<SwapStore> swap, uint64_t piece_bytes)
    : swap_(std::move(swap)), piece_bytes_(piece_bytes) {}

NvmePieces::~NvmePieces() {
  MutexLock lock(&mu_);
  staging_free_.clear();  // back to the pool before it goes
}

StatusOr<std::vector<SwapExtent>> NvmePieces::Allocate(std::string_view name, uint64_t size_bytes) {
  std::vector<SwapExtent> extents;
  for (uint64_t off = 0; off < size_bytes; off += piece_bytes_) {
    StatusOr<SwapExtent> e = swap_->Allocate(std::min(piece_bytes_, size_bytes - off),
                                             fmt::format("{} piece {}", name, off / piece_bytes_));
    if (!e.ok()) {
      for (const SwapExtent& x : extents) swap_->Free(x).IgnoreError();
      return std::move(e).status();
    }
    extents.push_back(*e);
  }
  return extents;
}

void NvmePieces::Free(std::string_view name, std::vector<SwapExtent>& extents) {
  for (const SwapExtent& e : extents) {
    Status s = swap_->Free(e);
    if (!s.ok()) log::Warn("tiered store: freeing '{}' on NVMe: {}", name, s);
  }
  extents.clear();
}

void NvmePieces::SubmitReads(const std::vector<SwapExtent>& from, char* out, IoWaiter& waiter) {
  for (size_t k = 0; k < from.size(); ++k) {
    waiter.Add();
    swap_->ReadAsync(from[k], out + k * piece_bytes_, waiter.Callback());
  }
}

void NvmePieces::SubmitWrites(const std::vector<SwapExtent>& to, const char* in, IoWaiter& waiter) {
  for (size_t k = 0; k < to.size(); ++k) {
    waiter.Add();
    swap_->WriteAsync(to[k], in + k * piece_bytes_, waiter.Callback());
  }
}

Status NvmePieces::Read(const std::vector<SwapExtent>& from, char* out) {
  IoWaiter waiter;
  SubmitReads(from, out, waiter);
  return waiter.Wait();
}

Status NvmePieces::Write(const std::vector<SwapExtent>& to, const char* in) {
  IoWaiter waiter;
  SubmitWrites(to, in, waiter);
  return waiter.Wait();
}

void NvmePieces::Stream(const std::vector<SwapExtent>& extents, char* buffer, bool write,
                        const IoCallback& piece_done) {
  for (size_t k = 0; k < extents.size(); ++k) {
    char* at = buffer + k * piece_bytes_;
    if (write) {
      swap_->WriteAsync(extents[k], at, piece_done);
    } else {
      swap_->ReadAsync(extents[k], at, piece_done);
    }
  }
}

PoolBlock NvmePieces::TakeStaging() {
  MutexLock lock(&mu_);
  while (staging_free_.empty()) staging_back_.Wait(&mu_);
  PoolBlock b = std::move(staging_free_.back());
  staging_free_.pop_back();
  return b;
}

void NvmePieces::GiveStaging(PoolBlock buffer) {
  MutexLock lock(&mu_);
  staging_free_.push_back(std::move(buffer));
  staging_back_.SignalAll();
}

TierStats NvmePieces::stats() const {
  TierStats s;
  s.budget_bytes = swap_->capacity_bytes();
  s.in_use_bytes = swap_->capacity_bytes() - swap_->free_bytes();
  s.peak_bytes = s.in_use_bytes;
  return s;
}

uint64_t NvmePieces::file_bytes() const { return swap_->file_bytes() * swap_->file_paths().size(); }

uint64_t NvmePieces::BookkeepingEntries() const {
  uint64_t n = swap_->extent_count() + swap_->free_ranges() + staging_pool_->stats().free_ranges;
  MutexLock lock(&mu_);
  return n + staging_free_.size();
}

}  // namespace zinf
