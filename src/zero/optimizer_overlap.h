// OptimizerOverlap: the NVMe optimizer step run while backward goes on, chunk by chunk as the
// gradients become final, bitwise equal to the step run after backward. What is left of it
// once the norm is known runs after backward (Finish) or beside the next forward
// (StepBesideForward, step_beside_forward.h).
//
// Note [Overlapped step]
// The optimizer's NVMe pass (read each chunk's master and state, update, write back) is the
// longest part of a step with the state on NVMe, and needs only final gradients. In a
// batch's last micro-batch a parameter's gradient is final once its last reduction is in the
// accumulators; a chunk of the flat shard is ready once all of its parameters are. A worker
// thread steps ready chunks while backward computes the earlier layers (backward runs last
// layer first, so the shard's last chunks are ready first).
// The step needs the global gradient norm before any update (clipping scales every gradient
// by it; an fp16 overflow skips the step), and the norm needs every gradient. So the worker
// speculates: it steps with the scale the step has when it is neither clipped nor skipped,
// writing the new state beside the old (Note [Speculative step] in
// offload/pipelined_optimizer.h). At Step the norm decides: the speculation is kept, and the
// chunks not yet stepped are stepped; or it is dropped and the speculated chunks step again
// with the clipped scale; or, for a skipped step, they get their old parameters back. Either
// way every element receives the update the unoverlapped step gives it, with the same scale
// and step count: the result is bitwise the same. What it costs: swap space for the new
// state (the state once more, at most), and redone work on a clipped or skipped step. So the
// engine speculates only after a step that was applied unclipped: while every step clips
// (early training with gradient_clipping set, when the norm is far above it) the step runs
// after backward, as it would without overlap, and one unclipped step brings speculation
// back.
// While the step is under way (armed), what would read or change what the worker writes is
// refused: fetching a module already reduced for the last time, gathering or setting a
// parameter, the learning rate, checkpoints.
//
// Thread-safety: one thread (the engine's) calls it; the worker runs inside.
#ifndef ZINF_ZERO_OPTIMIZER_OVERLAP_H_
#define ZINF_ZERO_OPTIMIZER_OVERLAP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "core/mutex.h"
#include "offload/pipelined_optimizer.h"
#include "zero/nvme_gradients.h"
#include "zero/partition.h"
#include "zinf/status.h"

namespace zinf {

class CpuOptimizer;

struct OverlapOptions {
  PipelinedOptimizer* optimizer = nullptr;     // not owned
  CpuOptimizer* cpu = nullptr;                 // its optimizer, to set a skipped step's count back
  int shard = 0;                               // the pipelined optimizer's shard
  const std::vector<Param>* params = nullptr;  // laid out over the shard
  bool enabled = true;  // false: Finish steps every chunk (the unoverlapped step)
  // At most this many chunks stepped speculatively a step (the swap space for their new
  // state); Finish steps the others.
  uint64_t speculation_limit = UINT64_MAX;
};

// The pipelined optimizer's chunks of `shard`, in flat order, into `chunks`, and for each of
// `params` (laid out over the shard) the chunks it touches into `of`.
Status MapShardChunks(PipelinedOptimizer& optimizer, int shard, const std::vector<Param>& params,
                      std::vector<ChunkInfo>* chunks, std::vector<std::vector<size_t>>* of);

class OptimizerOverlap final : public FinalChunks {
 public:
  // `writer` is the shard's (ShardSpec::writer; not owned, it outlives this object): it sees
  // each chunk's new parameters (or its old ones again after a skipped step), from the worker
  // or the calling thread, one call at a time; a dropped speculation restarts it first
  // (PipelinedOptimizer::ResolveSpeculation).
  static StatusOr<std::unique_ptr<OptimizerOverlap>> Create(const OverlapOptions& options,
                                                            ParamWriter* writer);
  // Stops the worker and drops a speculation still open (an abandoned batch), best effort.
  ~OptimizerOverlap() override;
  OptimizerOverlap(const OptimizerOverlap&) = delete;
  OptimizerOverlap& operator=(const OptimizerOverlap&) = delete;

  // The batch's last micro-batch has begun its reductions: begins the step, speculating with
  // `scale` (the gradient scale of a step neither clipped nor skipped). No-op when disabled.
  Status Arm(float scale);
  bool armed() const { return armed_; }
  // Parameter `param`'s gradient is final. Only while armed; the engine's thread.
  void MarkFinal(int param);
  // FinalChunks: chunk `chunk`'s gradients are all final (gradients kept per chunk, on NVMe);
  // any thread, ignored while not armed.
  void MarkChunkFinal(size_t chunk) override;
  // Ends the step: `scale` the gradient scale it takes, nullopt for a skipped step (its
  // step count is not advanced). Steps what the worker has not, redoes what it speculated
  // wrongly, and returns the first error; after an error no chunk keeps a speculative state
  // and the step count is as before the step.
  Status Finish(std::optional<float> scale);
  // Finish's first part: resolves the speculation and says which chunks are left to step with
  // `*scale` (none for a skipped step, which it completes), for a caller that steps them
  // itself (StepBesideForward).
  StatusOr<std::vector<size_t>> Resolve(std::optional<float> scale);
  // Whether a step of this scale keeps what was speculated beside backward (most of the
  // step, then: the engine finishes such a step at once, so that a step runs either wholly
  // before the next batch or wholly beside its forward).
  bool KeepsSpeculation(float scale) const { return armed_ && scale == scale_; }
  // Seconds the worker spent stepping this step (hidden behind backward, when it was).
  double overlapped_seconds() const {
    MutexLock lock(&mu_);
    return overlapped_seconds_;
  }

 private:
  OptimizerOverlap(const OverlapOptions& options, ParamWriter* writer);
  void Work();
  // Stops the worker after the batch it is stepping; its error, if any.
  Status Stop();
  // Every chunk's speculative state dropped, their old parameters shown to the writer again,
  // and the step count set back.
  Status Abandon();

  const OverlapOptions options_;
  ParamWriter* const writer_;
  std::vector<ChunkInfo> chunks_;
  std::vector<uint64_t> remaining_;      // per chunk: elements whose gradient is not final
  std::vector<std::vector<size_t>> of_;  // per parameter: the chunks it touches
  std::atomic<bool> armed_{false};
  float scale_ = 1.0f;
  std::vector<std::pair<int, int64_t>> step_before_;  // each of the shard's groups' step

  // The worker's state shared with the engine's thread.
  mutable Mutex mu_;
  // Per chunk, this step (speculatively or not).
  std::vector<bool> stepped_ ZINF_GUARDED_BY(mu_);
  double overlapped_seconds_ ZINF_GUARDED_BY(mu_) = 0;
  CondVar wake_;                                    // ready_ or stop_ changed
  std::vector<size_t> ready_ ZINF_GUARDED_BY(mu_);  // chunks for the worker
  uint64_t speculated_ ZINF_GUARDED_BY(mu_) = 0;    // chunks taken by the worker this step
  bool stop_ ZINF_GUARDED_BY(mu_) = false;
  Status worker_error_ ZINF_GUARDED_BY(mu_);
  std::thread worker_;
};

}  // namespace zinf

#endif  // ZINF_ZERO_OPTIMIZER_OVERLAP_H_
