// SwapStore: where offloaded tensors live on disk.
//
// At Open it checks each nvme path (exists, is a directory, is writable, has room: it says
// how much is needed and how much there is), creates one swap file per path for this rank and
// preallocates it with fallocate. The files form one address space striped across the paths in
// stripe_bytes units (software RAID-0: bandwidth adds up). Allocate hands out aligned extents
// of it; Free returns them for reuse. Write and Read move a whole extent between memory and
// disk through the IoEngine; with checksum on, a CRC32C per stripe piece is taken on write and
// verified on read, and a mismatch is DataLoss naming the tensor, the file and the offset.
//
// Sticky error (docs/ARCHITECTURE.md, no data loss): once a write fails, Allocate and every later
// Write return that error, as status() does. Reads of extents whose writes completed, and Free,
// keep working so that the caller can save what was acknowledged; reading the extent whose
// write failed is DataLoss. The swap files are scratch space: each is unlinked as soon as it
// is open, so that no directory entry outlives the store however its process ends (kill -9
// included); the destructor waits for outstanding I/O and closes them, which frees the space.
//
// Thread-safety: all methods may be called concurrently, except that an extent must not be
// written while it is read, written or freed elsewhere. Callbacks run on engine threads.
#ifndef ZINF_NVME_SWAP_STORE_H_
#define ZINF_NVME_SWAP_STORE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/extent_allocator.h"
#include "nvme/aio_options.h"
#include "nvme/io_engine.h"
#include "zinf/status.h"

namespace zinf {

struct SwapStoreOptions {
  // Directories for the swap files (DeepSpeed: offload_*.nvme_path). Several paths on
  // different devices stripe across them; each path appears once.
  std::vector<std::string> paths;
  // Names the files (zinf-swap-rank<rank>-<i>.bin) so that ranks sharing a path do not clash.
  int rank = 0;
  // Swap space across all paths; each path gets an equal share rounded up to stripe_bytes.
  // aio.queue_depth counts per path: the store's engine keeps queue_depth x paths pieces in
  // flight (at most the engine's limit), so that each device is as busy as it would be alone.
  uint64_t capacity_bytes = 0;
  // Striping unit across paths, a multiple of 4096. 0: aio.block_size.
  uint64_t stripe_bytes = 0;
  // CRC32C per stripe piece, taken on write and verified on read (a few GB/s of one core).
  // On by default: without it a bit flipped on disk comes back as a silently wrong tensor.
  bool checksum = true;
  AioOptions aio;
  // How long Open waits for a swap file that another store holds (two stores that opened one
  // path at the same moment, before either unlinked it). A crashed process's lock outlives it
  // briefly: the kernel tears its io_uring (which holds the files) down after the process is
  // gone.
  int lock_wait_ms = 5000;

  // InvalidArgument naming the field, its value and what is allowed.
  [[nodiscard]] Status Validate() const;
};

// A handle to an allocated extent. Plain value; id 0 is "none".
struct SwapExtent {
  uint64_t id = 0;
  uint64_t size_bytes = 0;
  bool valid() const { return id != 0; }
};

class SwapStore {
 public:
  // Opens the store. `engine` (optional) replaces the one options.aio would create; tests pass
  // a fault-injecting wrapper. Errors: InvalidArgument (bad options, missing path, path not a
  // directory), FailedPrecondition (read-only path), ResourceExhausted (too little free space:
  // the message says how much is needed and how much there is), Unavailable (io_uring or
  // O_DIRECT required and refused), IoError.
  static StatusOr<std::unique_ptr<SwapStore>> Open(const SwapStoreOptions& options,
                                                   std::unique_ptr<IoEngine> engine = nullptr);
  SwapStore(const SwapStore&) = delete;
  SwapStore& operator=(const SwapStore&) = delete;
  // Waits for outstanding I/O and closes the (already unlinked) swap files; failures are logged.
  ~SwapStore();

  // Reserves an extent of `size_bytes` for the tensor `name` (used in error messages).
  // Errors: the sticky error; InvalidArgument for size 0; ResourceExhausted when no free range
  // is large enough.
  StatusOr<SwapExtent> Allocate(uint64_t size_bytes, std::string name);
  // Returns the extent's space for reuse. InvalidArgument for an unknown extent.
  [[nodiscard]] Status Free(SwapExtent extent);

  // Writes extent.size_bytes from `src` (asynchronous). `src` must stay valid and unchanged
  // until `done` runs. A page-aligned `src` goes to disk without a copy; any other is copied
  // through an aligned buffer. The write is acknowledged (done(OK)) only when every byte is on
  // the device (O_DIRECT) or in the page cache (buffered I/O).
  void WriteAsync(SwapExtent extent, const void* src, IoCallback done);
  // Reads the extent into `dst` (asynchronous; dst must stay valid until `done` runs).
  // FailedPrecondition if the extent was never written; DataLoss for a failed write or a
  // checksum mismatch.
  void ReadAsync(SwapExtent extent, void* dst, IoCallback done);
  // Blocking forms.
  [[nodiscard]] Status Write(SwapExtent extent, const void* src);
  [[nodiscard]] Status Read(SwapExtent extent, void* dst);

  // Registers a caller buffer (e.g. the pinned pool) for fixed-buffer I/O. See
  // IoEngine::RegisterBuffer; must not race with I/O.
  [[nodiscard]] Status RegisterBuffer(void* data, uint64_t size_bytes);

  // The sticky error, or OK.
  Status status() const;

  // Where the swap files were created, for messages: they are unlinked once open, and only
  // this store's descriptors reach them.
  const std::vector<std::string>& file_paths() const { return file_paths_; }
  uint64_t file_bytes() const { return file_bytes_; }  // each file's size
  uint64_t stripe_bytes() const { return stripe_; }
  bool direct_io() const { return direct_; }
  IoEngine& engine() { return *engine_; }
  uint64_t capacity_bytes() const;
  uint64_t free_bytes() const;
  // Entries of the bookkeeping: live extents, and free ranges of the address space (for tests
  // that check nothing grows with use).
  size_t extent_count() const;
  size_t free_ranges() const;

 private:
  struct Extent;
  struct Op;
  // A part of an extent that lies in one file.
  struct Segment {
    int file = 0;  // index into files_
    uint64_t file_offset = 0;
    uint64_t extent_offset = 0;  // bytes into the extent
    uint64_t length = 0;
  };

  SwapStore(const SwapStoreOptions& options, std::unique_ptr<IoEngine> engine);
  [[nodiscard]] Status Init();
  // Where logical swap address `logical` lives.
  Segment Map(uint64_t logical) const;
  // The I/O segments of [offset, offset + size): runs contiguous in one file (with checksums,
  // one stripe piece each: Note [Checksums beside the I/O]), with an unaligned tail split off
  // so that only the tail is staged (Note [Staging unaligned direct I/O]).
  std::vector<Segment> Segments(uint64_t offset, uint64_t size) const;
  // Checks the CRC32C of the read op's pieces that lie wholly in [begin, end) of the extent
  // and are not checked yet.
  Status VerifyPieces(Op& op, uint64_t begin, uint64_t end) const;
  void Finish(Op* op, Status status);
  void FailSticky(const Status& status);

  SwapStoreOptions options_;
  uint64_t stripe_ = 0;
  uint64_t file_bytes_ = 0;
  bool direct_ = true;
  std::vector<std::string> file_paths_;
  std::vector<IoFile> files_;
  std::vector<int> file_ids_;                 // engine ids of files_
  std::vector<std::string> unlink_at_close_;  // files the file system would not unlink open
  std::unique_ptr<IoEngine> engine_;          // declared after files_: destroyed before them

  mutable std::mutex mu_;
  ExtentAllocator allocator_;                                      // guarded by mu_
  std::unordered_map<uint64_t, std::unique_ptr<Extent>> extents_;  // guarded by mu_
  uint64_t next_id_ = 1;                                           // guarded by mu_
  Status sticky_;                                                  // guarded by mu_
};

}  // namespace zinf

#endif  // ZINF_NVME_SWAP_STORE_H_
