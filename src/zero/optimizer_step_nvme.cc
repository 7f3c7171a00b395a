// The optimizer step over NVMe-resident state (offload_optimizer.device = nvme): the shard's
// chunks in the PipelinedOptimizer, the parameter tier written from them, and the step beside
// backward and beside the next forward (Note [Overlapped step] in optimizer_overlap.h, Note
// [Step in the next forward's order] in step_beside_forward.h). See optimizer_step.h.
#include <fmt/core.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "zero/optimizer_step.h"
#include "zero/tier_budgets.h"

namespace zinf {

// With the fp32 master in host memory the step's writer copies each chunk's new parameters
// into it; the engine writes the parameter tier from the master after the step
// (WriteParamTierFromMaster).
namespace {

class MasterWriter final : public ParamWriter {
 public:
  explicit MasterWriter(const StoreArray& master) : master_(master) {}
  Status Updated(const ChunkView& c) override {
    std::memcpy(master_.as<float>() + c.offset, c.params, c.count * 4);
    return OkStatus();
  }

 private:
  const StoreArray& master_;
};

}  // namespace

ParamWriter* OptimizerStep::param_writer() const {
  if (tier_writer_ != nullptr) return tier_writer_.get();
  return master_writer_.get();
}

Status OptimizerStep::OpenNvme(const ShardFill& initial) {
  const OptimizerPlacement& at = placement_;
  // Its chunks live in the store's swap files and host tier (the engine sized both for them).
  ZINF_ASSIGN_OR_RETURN(pipelined_,
                        PipelinedOptimizer::Create(optimizer_.get(), *at.store,
                                                   NvmeOptions(config_, at.shard_elements)));
  // The new parameters of each chunk the step updates go to the host master, or with none
  // straight into the parameter tier: 16-bit copies written by the update itself, or, where
  // an fp32 tier is the master, the parameters stepped in place there (the chunks keep only
  // the state: Note [Parameters kept by the caller]), so each parameter has one copy on NVMe.
  if (at.host_master) {
    master_writer_ = std::make_unique<MasterWriter>(master_);
  } else {
    tier_writer_ =
        std::make_unique<ParamTier::ChunkWriter>(at.param_tier, ParamTierIsMaster(config_));
    // Initialization writes the parameter tier like a step does.
    tier_writer_->Begin();
  }
  ShardSpec spec{.name = fmt::format("rank {} shard", at.rank),
                 .runs = runs_,  // Note [Parameter groups]
                 .count = at.shard_elements,
                 // Host accumulators are read where they are; with gradients on NVMe the
                 // shard keeps them in its chunks' tensors (Note [Gradients on NVMe]).
                 .host_grads = grad_acc_.empty() ? nullptr : grad_acc_.data(),
                 .writer = param_writer()};
  if (tier_writer_ != nullptr) {
    spec.handoff = tier_writer_->handoff();
    spec.param_copy_type = tier_writer_->param_type();
  }
  StatusOr<int> shard = pipelined_->AddShard(spec, [&](const ChunkView& c) {
    if (at.host_master) {
      std::memcpy(c.params, master_.as<float>() + c.offset, c.count * 4);
      return OkStatus();
    }
    ZINF_RETURN_IF_ERROR(initial(c.offset, c.count, c.params));
    return at.params_on_nvme ? tier_writer_->Updated(c) : OkStatus();
  });
  Status written = tier_writer_ != nullptr ? tier_writer_->Finish() : OkStatus();
  ZINF_RETURN_IF_ERROR(shard.status());
  ZINF_RETURN_IF_ERROR(written);
  nvme_shard_ = *shard;
  ZINF_ASSIGN_OR_RETURN(overlap_,
                        OptimizerOverlap::Create({.optimizer = pipelined_.get(),
                                                  .cpu = optimizer_.get(),
                                                  .shard = nvme_shard_,
                                                  .params = at.params,
                                                  .enabled = config_.overlap_optimizer,
                                                  .speculation_limit = at.speculative_chunks},
                                                 param_writer()));
  if (config_.gradients_on_nvme) {
    // A chunk's gradients are final for the step beside backward when its last write of the
    // batch is on disk.
    ZINF_ASSIGN_OR_RETURN(
        nvme_grads_, NvmeGradients::Create(pipelined_.get(), nvme_shard_, optimizer_.get(),
                                           at.store, config_.ReductionsPerStep(), overlap_.get()));
  }
  if (config_.step_beside_forward && tier_writer_ != nullptr && config_.zero_stage == 3) {
    ZINF_ASSIGN_OR_RETURN(
        beside_,
        StepBesideForward::Create({.optimizer = pipelined_.get(),
                                   .shard = nvme_shard_,
                                   .params = at.params,
                                   .modules = at.modules,
                                   .param_tier = at.param_tier,
                                   .writer = tier_writer_.get(),
                                   .store = at.store,
                                   .prefetch_bucket_elements = config_.stage3_prefetch_bucket_size,
                                   .rank = at.rank}));
  }
  return OkStatus();
}

Status OptimizerStep::RunNvme(std::optional<float> grad_scale, StepSummary* summary) {
  if (tier_writer_ != nullptr && !overlap_->armed()) tier_writer_->Begin();
  if (grad_scale && beside_ != nullptr && !overlap_->KeepsSpeculation(*grad_scale)) {
    // Note [Step in the next forward's order].
    ZINF_RETURN_IF_ERROR(beside_->Start(*overlap_, *grad_scale));
    summary->seconds_optimizer_overlapped += overlap_->overlapped_seconds();
    return OkStatus();
  }
  Status stepped = overlap_->Finish(grad_scale);
  summary->seconds_optimizer_overlapped += overlap_->overlapped_seconds();
  Status written;
  if (tier_writer_ != nullptr) {
    written = tier_writer_->Finish();
  } else if (grad_scale && stepped.ok()) {
    written = WriteParamTierFromMaster();
  }
  summary->seconds_optimizer_compute = pipelined_->last_step_stats().compute_seconds;
  // Its NVMe bytes, and the gradient accumulators', are the store's: the engine's summary
  // counts them from the store's meters.
  ZINF_RETURN_IF_ERROR(stepped);
  return written;
}

void OptimizerStep::NvmeMetersAtStepEnd(const TieredStoreStats& now, LinkStats* read,
                                        LinkStats* written) const {
  const bool beside = step_in_flight();
  *read = beside ? beside_->nvme_read_at_start() : now.nvme_to_host;
  *written = beside ? beside_->nvme_written_at_start() : now.host_to_nvme;
}

Status OptimizerStep::FinishStepBesideForward() {
  if (!step_in_flight()) return OkStatus();
  ZINF_RETURN_IF_ERROR(beside_->Finish());
  ResetGradients();
  return ApplySchedule();
}

}  // namespace zinf
