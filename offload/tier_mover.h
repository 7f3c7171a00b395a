// TierMover: copies a tensor's bytes from its copy in one tier to its copy in another, over
// the links that pair of tiers uses, each metered (offload/link_meter.h):
//   host <-> device   the device's copy streams, one per direction (memcpy on the direct host
//                     device: Note [Direct host device] in offload/tiered_store.cc);
//   host <-> NVMe     every piece in flight together (NvmePieces), and so for the direct host
//                     device's memory;
//   device <-> NVMe   a piece at a time through a pinned staging buffer;
//   from zeros        a copy never written fills the other with zeros, moving nothing.
// The caller owns the tensor's records and has claimed it (StoreTensor::busy) so that nothing
// else touches the two copies; the destination's memory is already held.
//
// Thread-safety: Move and Clear may run on several threads at once, each on its own tensor.
#ifndef ZINF_OFFLOAD_TIER_MOVER_H_
#define ZINF_OFFLOAD_TIER_MOVER_H_

#include <cstdint>
#include <memory>
#include <span>

#include "offload/link_meter.h"
#include "offload/nvme_pieces.h"
#include "offload/store_tensor.h"
#include "zinf/device.h"
#include "zinf/status.h"

namespace zinf {

class TierMover {
 public:
  // Over `device` (null: no device tier; not owned) and `nvme` (null: no NVMe tier; not owned),
  // metering on `links` and counting its memcpys and memsets on `counters` (Note [Transfer
  // counters] in offload/tiered_store.cc; not owned). All four outlive the mover. Errors: the
  // device's, making its streams.
  static StatusOr<std::unique_ptr<TierMover>> Create(Device* device, NvmePieces* nvme,
                                                     LinkMeters* links, TransferCounters* counters);
  TierMover(const TierMover&) = delete;
  TierMover& operator=(const TierMover&) = delete;

  // Whether the device tier's memory is host memory that moves touch directly (Note [Direct
  // host device]).
  bool direct() const { return direct_; }
  // Whether moves between `tier` and NVMe go straight to and from its memory.
  bool Addressable(Tier tier) const {
    return tier == Tier::kHost || (direct_ && tier == Tier::kDevice);
  }

  // Copies t's bytes from its copy in `src` to its copy in `dst`. Errors: the device's, the
  // NVMe tier's, Internal for a pair of tiers with no route.
  Status Move(StoreTensor& t, Tier src, Tier dst);
  // Each tensor's host copy into its device copy, every copy on the up stream before one wait
  // for them all (a step's write-backs, a module's fetch: Note [Batched write-backs] in
  // offload/tiered_store.cc); tensors that follow one another in both tiers go as one copy
  // (Note [Runs of blocks] in offload/memory_pool.h). Not for the direct host device. Errors:
  // the device's; then none of the copies is known to have landed.
  Status Upload(std::span<StoreTensor* const> batch);
  // Whether a's host copy lies below b's: the order in which Upload copies a batch, and in
  // which a batch's device memory is best placed for it.
  static bool HostOrder(const StoreTensor* a, const StoreTensor* b);
  // Whether `next` continues the run that ends with `last` in both the host and device tiers
  // (Note [Runs of blocks] in offload/memory_pool.h): the same distance between their copies
  // on either side, within what `last` holds in each, so that one copy may carry both and
  // the rounding between them.
  static bool ContinuesRun(const StoreTensor& last, const StoreTensor& next);
  // Zeros t's memory in `tier` (the device or host tier).
  Status Clear(StoreTensor& t, Tier tier);
  // `n` bytes of device memory into host memory no copy of a tensor owns (the caller's), over
  // the device-to-host link (TieredStore::CopyDownAsync).
  Status CopyDown(const void* device_src, void* host_dst, uint64_t n);

 private:
  TierMover(Device* device, NvmePieces* nvme, LinkMeters* links, TransferCounters* counters);
  // Zeros `size` bytes of memory the host may touch, counting them as `tier`'s.
  void ZeroDirect(void* data, uint64_t size, Tier tier);
  // Move from a copy that reads as zeros and was never written.
  Status MoveZeros(StoreTensor& t, Tier dst);
  // NVMe to device memory, a piece at a time through a staging buffer.
  Status ReadToDevice(const TierCopy& from, char* device_dst);
  // Device memory `device_src` (or zeros when null) to the NVMe pieces of `to`, a piece at a
  // time through a staging buffer.
  Status WriteFromDevice(const TierCopy& to, const char* device_src);
  // A copy on `stream`, waited for.
  Status DeviceCopy(Stream& stream, void* dst, const void* src, uint64_t n, CopyKind kind);

  Device* const device_;
  NvmePieces* const nvme_;
  LinkMeters& links_;
  TransferCounters& counters_;
  const bool direct_;
  std::unique_ptr<Stream> up_stream_;    // host to device
  std::unique_ptr<Stream> down_stream_;  // device to host
};

}  // namespace zinf

#endif  // ZINF_OFFLOAD_TIER_MOVER_H_
