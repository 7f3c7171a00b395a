// NvmePieces: the tiered store's NVMe tier. A tensor homed there is a list of extents of a
// swap store (nvme/swap_store.h), pieces of at most piece_bytes so that one fits a staging
// buffer. NvmePieces allocates and frees them, moves them to and from host-addressable memory
// with every piece in flight together, and lends the pinned staging buffers through which
// moves between device memory and NVMe go one piece at a time.
//
// Thread-safety: all methods are thread-safe; a tensor's pieces must not be written while they
// are read, written or freed elsewhere (the store's `busy` flag sees to it).
#ifndef ZINF_OFFLOAD_NVME_PIECES_H_
#define ZINF_OFFLOAD_NVME_PIECES_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "core/mutex.h"
#include "nvme/io_engine.h"
#include "nvme/swap_store.h"
#include "offload/memory_pool.h"
#include "zinf/status.h"
#include "zinf/tiered_store.h"

namespace zinf {

class NvmePieces {
 public:
  // Opens the swap store (on `engine` when not null, else on the one swap.aio makes) and
  // preallocates `staging_buffers` staging buffers of piece_bytes (page-locked when
  // `pin_staging`). Errors: the swap store's, the staging pool's.
  static StatusOr<std::unique_ptr<NvmePieces>> Open(const SwapStoreOptions& swap,
                                                    uint64_t piece_bytes, int staging_buffers,
                                                    bool pin_staging,
                                                    std::unique_ptr<IoEngine> engine);
  NvmePieces(const NvmePieces&) = delete;
  NvmePieces& operator=(const NvmePieces&) = delete;
  ~NvmePieces();

  uint64_t piece_bytes() const { return piece_bytes_; }

  // Extents for `size_bytes` of the tensor `name` (named in the swap store's errors), or
  // none: ResourceExhausted (swap space full), the swap store's sticky error.
  StatusOr<std::vector<SwapExtent>> Allocate(std::string_view name, uint64_t size_bytes);
  // Gives the extents back and clears them; a failure is logged with the tensor named.
  void Free(std::string_view name, std::vector<SwapExtent>& extents);

  // Starts reading every piece of `from` into host-addressable memory at `out` (writing every
  // piece of `to` from `in`); `waiter` counts them.
  void SubmitReads(const std::vector<SwapExtent>& from, char* out, IoWaiter& waiter);
  void SubmitWrites(const std::vector<SwapExtent>& to, const char* in, IoWaiter& waiter);
  // The same, waiting for them: the first error.
  Status Read(const std::vector<SwapExtent>& from, char* out);
  Status Write(const std::vector<SwapExtent>& to, const char* in);
  // Piece `k` of a tensor starts at k * piece_bytes of its bytes. Blocking, one piece.
  Status ReadPiece(SwapExtent piece, void* out) { return swap_->Read(piece, out); }
  Status WritePiece(SwapExtent piece, const void* in) { return swap_->Write(piece, in); }
  // Starts moving every piece between the extents and `buffer` (as SubmitReads and
  // SubmitWrites), `piece_done` called once per piece on an I/O thread.
  void Stream(const std::vector<SwapExtent>& extents, char* buffer, bool write,
              const IoCallback& piece_done);

  // A staging buffer of piece_bytes, waiting for one to come back when all are lent.
  PoolBlock TakeStaging();
  void GiveStaging(PoolBlock buffer);

  // SwapStore::RegisterBuffer.
  Status RegisterBuffer(void* data, uint64_t size_bytes) {
    return swap_->RegisterBuffer(data, size_bytes);
  }
  // The tier's budget and use (TieredStoreStats::tiers), and the swap files' size on disk.
  TierStats stats() const;
  uint64_t file_bytes() const;
  // Entries in the swap store's and the staging buffers' bookkeeping.
  uint64_t BookkeepingEntries() const;

 private:
  NvmePieces(std::unique_ptr<SwapStore> swap, uint64_t piece_bytes);

  std::unique_ptr<SwapStore> swap_;
  const uint64_t piece_bytes_;
  std::unique_ptr<MemoryPool> staging_pool_;  // before staging_free_: outlives its blocks
  mutable Mutex mu_;
  CondVar staging_back_;  // a staging buffer came back
  std::vector<PoolBlock> staging_free_ ZINF_GUARDED_BY(mu_);
};

}  // namespace zinf

#endif  // ZINF_OFFLOAD_NVME_PIECES_H_
