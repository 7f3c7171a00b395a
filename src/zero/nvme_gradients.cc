// See src/zero/nvme_gradients.h and Note [Gradients on NVMe].
#include "zero/nvme_gradients.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace zinf {

StatusOr<std::unique_ptr<NvmeGradients>> NvmeGradients::Create(
    PipelinedOptimizer* optimizer, int shard, CpuOptimizer* cpu, TieredStore* store,
    int accumulation_steps, FinalChunks* final, uint64_t max_staging_bytes) {
  std::unique_ptr<NvmeGradients> self(new NvmeGradients(
      optimizer, shard, cpu, store, accumulation_steps, final, max_staging_bytes));
  ZINF_ASSIGN_OR_RETURN(std::vector<ChunkInfo> chunks, optimizer->Chunks(shard));
  self->chunks_.resize(chunks.size());
  for (size_t c = 0; c < chunks.size(); ++c) {
    self->chunks_[c].info = chunks[c];
    self->buffer_bytes_ =
        std::max(self->buffer_bytes_, PipelinedOptimizer::GradientBufferBytes(chunks[c].count));
  }
  return self;
}

NvmeGradients::~NvmeGradients() {
  for (Chunk& chunk : chunks_) Settle(chunk).IgnoreError();
}

StatusOr<StoreArray> NvmeGradients::TakeBuffer() {
  // Writes slower than backward would pile buffers up: wait for the oldest instead.
  while (staging_bytes_ + buffer_bytes_ > max_staging_bytes_ && !in_flight_.empty()) {
    const size_t oldest = in_flight_.front();
    in_flight_.pop_front();
    ZINF_RETURN_IF_ERROR(Settle(chunks_[oldest]));
  }
  staging_bytes_ += buffer_bytes_;
  peak_staging_bytes_ = std::max(peak_staging_bytes_, staging_bytes_);
  if (!free_.empty()) {
    StoreArray b = std::move(free_.back());
    free_.pop_back();
    return b;
  }
  // Page-aligned (the store's blocks are), as O_DIRECT writes need; every byte is written
  // before it is read.
  StatusOr<StoreArray> b = StoreArray::Scratch(store_, "gradient staging", buffer_bytes_,
                                               Tier::kHost, Access::kOverwrite);
  if (!b.ok()) staging_bytes_ -= buffer_bytes_;
  return b;
}

Status NvmeGradients::Settle(Chunk& chunk) {
  if (chunk.writing == nullptr) return OkStatus();
  Status written = chunk.writing->Wait();
  chunk.writing.reset();
  free_.push_back(std::move(chunk.written));
  staging_bytes_ -= buffer_bytes_;
  return written;
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
      ZINF_ASSIGN_OR_RETURN(chunk.staging, TakeBuffer());
    }
    std::memcpy(static_cast<float*>(chunk.staging.data()) + (first - chunk.info.offset),
                grads + (first - flat_offset), (last - first) * 4);
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
  ZINF_RETURN_IF_ERROR(Settle(chunk));  // the previous micro-batch's write
  float* g = static_cast<float*>(chunk.staging.data());
  if (chunk.flushes > 0) {  // acc + g, as AccumulateFp32 adds into host accumulators
    ZINF_ASSIGN_OR_RETURN(StoreArray previous, TakeBuffer());
    Status read = optimizer_->ReadChunkGradients(shard_, c, previous.data());
    if (read.ok()) AccumulateFp32(static_cast<float*>(previous.data()), g, chunk.info.count);
    free_.push_back(std::exchange(chunk.staging, std::move(previous)));
    staging_bytes_ -= buffer_bytes_;
    ZINF_RETURN_IF_ERROR(read);
  }
  const bool last = ++chunk.flushes == accumulation_steps_;
  if (last) {
    ZINF_ASSIGN_OR_RETURN(
        chunk.stats,
        cpu_->ComputeGradStats(chunk.staging.data(), ElementType::kFp32, chunk.info.count));
  }
  chunk.writing = std::make_unique<IoWaiter>();
  chunk.writing->Add(1);
  in_flight_.push_back(c);
  chunk.written = std::move(chunk.staging);
  chunk.arrived = 0;
  optimizer_->WriteChunkGradientsAsync(
      shard_, c, chunk.written.data(),
      [waiter = chunk.writing.get(), final = last ? final_ : nullptr, c](Status s) {
        if (s.ok() && final != nullptr) final->MarkChunkFinal(c);
        waiter->Done(std::move(s));
      });
  return OkStatus();
}

StatusOr<GradStats> NvmeGradients::Stats() {
  Status written;
  for (Chunk& chunk : chunks_) {
    Status s = Settle(chunk);
    if (written.ok()) written = std::move(s);
  }
  in_flight_.clear();
  ZINF_RETURN_IF_ERROR(written);
  // Note [Short last window] (engine_step.cc): a batch may end after fewer micro-batches, the
  // same number for every chunk; their statistics were not taken at a last flush, so they are
  // taken from the gradients written.
  const int flushes = chunks_.empty() ? accumulation_steps_ : chunks_.front().flushes;
  const bool short_window = flushes >= 1 && flushes < accumulation_steps_;
  GradStats total;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    Chunk& chunk = chunks_[c];
    if (chunk.flushes != (short_window ? flushes : accumulation_steps_)) {
      return FailedPrecondition(
          fmt::format("the gradients of elements {}..{} have {} of the batch's {} micro-batches",
                      chunk.info.offset, chunk.info.offset + chunk.info.count, chunk.flushes,
                      short_window ? flushes : accumulation_steps_));
    }
    if (short_window) ZINF_RETURN_IF_ERROR(ReadStats(c));
    total.sum_squares += chunk.stats.sum_squares;
    total.finite = total.finite && chunk.stats.finite;
  }
  // Every buffer is back: the host tier has them back until the next batch's gradients.
  free_.clear();
  return total;
}

Status NvmeGradients::ReadStats(size_t c) {
  Chunk& chunk = chunks_[c];
  ZINF_ASSIGN_OR_RETURN(StoreArray buffer, TakeBuffer());
  Status read = optimizer_->ReadChunkGradients(shard_, c, buffer.data());
  StatusOr<GradStats> stats =
      read.ok() ? cpu_->ComputeGradStats(buffer.data(), ElementType::kFp32, chunk.info.count)
                : StatusOr<GradStats>(read);
  free_.push_back(std::move(buffer));
  staging_bytes_ -= buffer_bytes_;
  ZINF_ASSIGN_OR_RETURN(chunk.stats, std::move(stats));
  return OkStatus();
}

void NvmeGradients::EndBatch() {
  in_flight_.clear();
  for (Chunk& chunk : chunks_) {
    Settle(chunk).IgnoreError();  // a batch abandoned after an error
    chunk.flushes = 0;
    chunk.arrived = 0;
    chunk.stats = GradStats();
    if (!chunk.staging.empty()) {
      free_.push_back(std::move(chunk.staging));
      staging_bytes_ -= buffer_bytes_;
    }
  }
}

}  // namespace zinf
