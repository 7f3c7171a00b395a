// NvmeGradients: the flat shard's fp32 gradient accumulators on NVMe (zinf.gradients_on_nvme),
// the pipelined optimizer's chunk gradient tensors (homed on NVMe in the tiered store), so that
// host memory holds only the chunks being filled.
//
// Note [Gradients on NVMe]
// Reduced gradients arrive a parameter at a time (backward's order, last layer first), each
// once per micro-batch. Each lands in a host staging buffer of the chunk it belongs to; once
// every element of a chunk has arrived, the chunk is flushed: written as the accumulator in
// the batch's first micro-batch, read, added to (acc + g, as the host accumulators do) and
// written back in the later ones. The last flush of a chunk also takes its squared norm and
// finiteness, so that the step knows the global norm without reading the gradients again;
// the pipelined step then reads them with the state. Host memory: the chunks being filled
// (tensors of the tiered store's host tier; backward fills them in order, so a few, plus those of
// the largest parameter, and those whose write is still in flight, at most max_staging_bytes: past
// it, taking a buffer waits for the oldest write) instead of four bytes per parameter. Writes are
// asynchronous; a chunk's read-back in a later micro-batch waits for its write. When a
// chunk's last write of the batch is on disk, its FinalChunks hears of it (from the I/O
// thread): the overlapped step may update it from then on.
//
// Thread-safety: one thread (the engine's).
#ifndef ZINF_ZERO_NVME_GRADIENTS_H_
#define ZINF_ZERO_NVME_GRADIENTS_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "nvme/io_engine.h"
#include "offload/pipelined_optimizer.h"
#include "zero/store_array.h"
#include "zinf/cpu_optimizer.h"
#include "zinf/status.h"
#include "zinf/tiered_store.h"

namespace zinf {

// Who hears that a chunk's gradients for the batch are all on disk: the step beside backward
// (OptimizerOverlap).
class FinalChunks {
 public:
  virtual ~FinalChunks() = default;
  // Chunk `chunk` is final; any thread.
  virtual void MarkChunkFinal(size_t chunk) = 0;
};

class NvmeGradients {
 public:
  // `optimizer`'s shard `shard` keeps its own fp32 gradients (ShardSpec::host_grads null);
  // `cpu` takes the norms; the staging buffers are tensors of `store`'s host tier, which must
  // have room for max_staging_bytes and a few buffers beyond (see StagingBudget). All three
  // must outlive this object, and so must `final` (optional): it hears of each chunk once its
  // gradients for the batch are all on disk.
  static StatusOr<std::unique_ptr<NvmeGradients>> Create(
      PipelinedOptimizer* optimizer, int shard, CpuOptimizer* cpu, TieredStore* store,
      int accumulation_steps, FinalChunks* final = nullptr,
      uint64_t max_staging_bytes = kMaxStagingBytes);
  // Waits for the writes in flight.
  ~NvmeGradients();
  NvmeGradients(const NvmeGradients&) = delete;
  NvmeGradients& operator=(const NvmeGradients&) = delete;

  // Adds `size` reduced gradient elements of the flat shard, at `flat_offset`: each element
  // once per micro-batch.
  Status Add(uint64_t flat_offset, const float* grads, uint64_t size);
  // Waits for every write; then the accumulated gradients' squared norm and finiteness, once
  // every chunk has received all of the batch's micro-batches, or the same fewer for every chunk
  // (a short last window; FailedPrecondition otherwise).
  StatusOr<GradStats> Stats();
  // The next batch starts from zero.
  void EndBatch();
  static constexpr uint64_t kMaxStagingBytes = 256ull << 20;
  // Host-tier bytes the staging may take with chunks of `chunk_elements`: the bound, and the
  // chunks being filled beyond it (those a parameter spans, and the read-back of one).
  static uint64_t StagingBudget(uint64_t chunk_elements,
                                uint64_t max_staging_bytes = kMaxStagingBytes) {
    return max_staging_bytes + 8 * PipelinedOptimizer::GradientBufferBytes(chunk_elements);
  }
  // Host bytes of the staging buffers at most (this batch and before).
  uint64_t peak_staging_bytes() const { return peak_staging_bytes_; }

 private:
  struct Chunk {
    ChunkInfo info;
    StoreArray staging;                 // empty while no gradient of this micro-batch has arrived
    uint64_t arrived = 0;               // elements of this micro-batch
    int flushes = 0;                    // micro-batches written this batch
    GradStats stats;                    // after the batch's last flush
    std::unique_ptr<IoWaiter> writing;  // the write in flight, and its buffer
    StoreArray written;
  };
  NvmeGradients(PipelinedOptimizer* optimizer, int shard, CpuOptimizer* cpu, TieredStore* store,
                int steps, FinalChunks* final, uint64_t max_staging_bytes)
      : optimizer_(optimizer),
        shard_(shard),
        cpu_(cpu),
        store_(store),
        accumulation_steps_(steps),
        final_(final),
        max_staging_bytes_(max_staging_bytes) {}
  Status Flush(size_t c);
  // Waits for chunk c's write in flight and takes its buffer back.
  Status Settle(Chunk& chunk);
  StatusOr<StoreArray> TakeBuffer();
  // Chunk c's statistics from its gradients on NVMe (a batch that ended short).
  Status ReadStats(size_t c);

  PipelinedOptimizer* const optimizer_;
  const int shard_;
  CpuOptimizer* const cpu_;
  TieredStore* const store_;
  const int accumulation_steps_;
  FinalChunks* const final_;
  const uint64_t max_staging_bytes_;
  std::vector<Chunk> chunks_;
  std::vector<StoreArray> free_;  // staging buffers for reuse, each of buffer_bytes_
  std::deque<size_t> in_flight_;  // chunks whose write is in flight, oldest first
  uint64_t buffer_bytes_ = 0;
  uint64_t staging_bytes_ = 0, peak_staging_bytes_ = 0;
};

}  // namespace zinf

#endif  // ZINF_ZERO_NVME_GRADIENTS_H_
