// NvmeGradients: the flat shard's fp32 gradient accumulators on NVMe (zinf.gradients_on_nvme),
// in the pipelined optimizer's chunk extents, so that host memory holds only the chunks
// being filled.
//
// Note [Gradients on NVMe]
// Reduced gradients arrive a parameter at a time (backward's order, last layer first), each
// once per micro-batch. Each lands in a host staging buffer of the chunk it belongs to; once
// every element of a chunk has arrived, the chunk is flushed: written as the accumulator in
// the batch's first micro-batch, read, added to (acc + g, as the host accumulators do) and
// written back in the later ones. The last flush of a chunk also takes its squared norm and
// finiteness, so that the step knows the global norm without reading the gradients again;
// the pipelined step then reads them with the state. Host memory: the chunks being filled
// (backward fills them in order, so a few, plus those of the largest parameter) instead of
// four bytes per parameter. The flushes are synchronous on the engine's thread, and the
// overlapped step is off with gradients on NVMe (both use the optimizer's staging buffers).
//
// Thread-safety: one thread (the engine's).
#ifndef ZINF_ZERO_NVME_GRADIENTS_H_
#define ZINF_ZERO_NVME_GRADIENTS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "offload/pipelined_optimizer.h"
#include "zinf/cpu_optimizer.h"
#include "zinf/status.h"

namespace zinf {

class NvmeGradients {
 public:
  // `optimizer`'s shard `shard` keeps its own fp32 gradients (ShardSpec::host_grads null);
  // `cpu` takes the norms. Both must outlive this object.
  static StatusOr<std::unique_ptr<NvmeGradients>> Create(PipelinedOptimizer* optimizer, int shard,
                                                         CpuOptimizer* cpu, int accumulation_steps);

  // Adds `size` reduced gradient elements of the flat shard, at `flat_offset`: each element
  // once per micro-batch.
  Status Add(uint64_t flat_offset, const float* grads, uint64_t size);
  // The accumulated gradients' squared norm and finiteness, once every chunk has received
  // all of the batch's micro-batches (FailedPrecondition before).
  StatusOr<GradStats> Stats() const;
  // The next batch starts from zero.
  void EndBatch();
  // Host bytes of the staging buffers at most (this batch and before).
  uint64_t peak_staging_bytes() const { return peak_staging_bytes_; }

 private:
  struct Chunk {
    ChunkInfo info;
    std::vector<float> staging;  // empty while no gradient of this micro-batch has arrived
    uint64_t arrived = 0;        // elements of this micro-batch
    int flushes = 0;             // micro-batches written this batch
    GradStats stats;             // after the batch's last flush
  };
  NvmeGradients(PipelinedOptimizer* optimizer, int shard, CpuOptimizer* cpu, int steps)
      : optimizer_(optimizer), shard_(shard), cpu_(cpu), accumulation_steps_(steps) {}
  Status Flush(size_t c);

  PipelinedOptimizer* const optimizer_;
  const int shard_;
  CpuOptimizer* const cpu_;
  const int accumulation_steps_;
  std::vector<Chunk> chunks_;
  std::vector<float> previous_;  // a chunk's accumulator read back
  uint64_t staging_bytes_ = 0, peak_staging_bytes_ = 0;
};

}  // namespace zinf

#endif  // ZINF_ZERO_NVME_GRADIENTS_H_
