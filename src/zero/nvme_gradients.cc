// See src/zero/nvme_gradients.h and Note [Gradients on NVMe].
#include "zero/nvme_gradients.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>

namespace zinf {

StatusOr<std::unique_ptr<NvmeGradients>> NvmeGradients::Create(PipelinedOptimizer* optimizer,
                                                               int shard, CpuOptimizer* cpu,
                                                               int accumulation_steps) {
  std::unique_ptr<NvmeGradients> self(new NvmeGradients(optimizer, shard, cpu, accumulation_steps));
  ZINF_ASSIGN_OR_RETURN(std::vector<ChunkInfo> chunks, optimizer->Chunks(shard));
  for (const ChunkInfo& info : chunks) self->chunks_.push_back({.info = info});
  return self;
}

Status NvmeGradients::Add(uint64_t flat_offset, const float* grads, uint64_t size) {
  // The chunks [first, ...) that [flat_offset, flat_offset + size) touches.
  auto it = std::upper_bound(chunks_.begin(), chunks_.end(), flat_offset,
                             [](uint64_t at, const Chunk& c) { return at < c.info.offset; });
  for (size_t c = std::prev(it) - chunks_.begin();
       c < chunks_.size() && chunks_[c].info.offset < flat_offset + size; ++c) {
    Chunk& chunk = chunks_[c];
    const uint64_t first = std::max<uint64_t>(flat_offset, chunk.info.offset);
    const uint64_t last =
        std::min<uint64_t>(flat_offset + size, chunk.info.offset + chunk.info.count);
    if (chunk.staging.empty()) {
      chunk.staging.assign(chunk.info.count, 0.0f);
      staging_bytes_ += chunk.info.count * 4;
      peak_staging_bytes_ = std::max(peak_staging_bytes_, staging_bytes_);
    }
    std::memcpy(chunk.staging.data() + (first - chunk.info.offset), grads + (first - flat_offset),
                (last - first) * 4);
    chunk.arrived += last - first;
    if (chunk.arrived == chunk.info.count) ZINF_RETURN_IF_ERROR(Flush(c));
  }
  return OkStatus();
}

Status NvmeGradients::Flush(size_t c) {
  Chunk& chunk = chunks_[c];
  if (chunk.flushes == accumulation_steps_) {
    return FailedPrecondition(fmt::format(
        "gradients of elements {}..{} arrived for a micro-batch more than the {} of the batch",
        chunk.info.offset, chunk.info.offset + chunk.info.count, accumulation_steps_));
  }
  float* sum = chunk.staging.data();
  if (chunk.flushes > 0) {  // acc + g, as AccumulateFp32 adds into host accumulators
    previous_.resize(chunk.info.count);
    ZINF_RETURN_IF_ERROR(optimizer_->ReadChunkGradients(shard_, c, previous_.data()));
    AccumulateFp32(previous_.data(), chunk.staging.data(), chunk.info.count);
    sum = previous_.data();
  }
  ZINF_RETURN_IF_ERROR(optimizer_->WriteChunkGradients(shard_, c, sum));
  if (++chunk.flushes == accumulation_steps_) {
    ZINF_ASSIGN_OR_RETURN(chunk.stats,
                          cpu_->ComputeGradStats(sum, ElementType::kFp32, chunk.info.count));
  }
  staging_bytes_ -= chunk.info.count * 4;
  std::vector<float>().swap(chunk.staging);
  chunk.arrived = 0;
  return OkStatus();
}

StatusOr<GradStats> NvmeGradients::Stats() const {
  GradStats total;
  for (const Chunk& chunk : chunks_) {
    if (chunk.flushes != accumulation_steps_) {
      return FailedPrecondition(
          fmt::format("the gradients of elements {}..{} have {} of the batch's {} micro-batches",
                      chunk.info.offset, chunk.info.offset + chunk.info.count, chunk.flushes,
                      accumulation_steps_));
    }
    total.sum_squares += chunk.stats.sum_squares;
    total.finite = total.finite && chunk.stats.finite;
  }
  return total;
}

void NvmeGradients::EndBatch() {
  for (Chunk& chunk : chunks_) {
    chunk.flushes = 0;
    chunk.arrived = 0;
    chunk.stats = GradStats();
    std::vector<float>().swap(chunk.staging);
  }
  staging_bytes_ = 0;
}

}  // namespace zinf
