// The optimizer step over NVMe-resident state (offload_optimizer.device = nvme): the shard's
// chunks in the PipelinedOptimizer, the parameter tier written from them, and the step beside
// backward and beside the next forward (Notes [Overlapped step] and [Step in the next
// forward's order] in optimizer_overlap.h). See optimizer_step.h.
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
    // A chunk's gradients are final when its last write of the batch is on disk.
    ZINF_ASSIGN_OR_RETURN(
        nvme_grads_,
        NvmeGradients::Create(pipelined_.get(), nvme_shard_, optimizer_.get(), at.store,
                              config_.ReductionsPerStep(),
                              [o = overlap_.get()](size_t c) { o->MarkChunkFinal(c); }));
  }
  return OkStatus();
}

bool OptimizerStep::StepsBesideForward() const {
  return config_.step_beside_forward && tier_writer_ != nullptr && config_.zero_stage == 3;
}

std::vector<int> OptimizerStep::NextForwardOrder(uint64_t* lead) const {
  // The parameters in the order the next forward fetches their modules, as the first batch
  // recorded it (flat order before that). The step keeps the parameters it writes in memory
  // for the forward, but only the next module's (or stage3_prefetch_bucket_size elements)
  // ahead of it, as a read-ahead would.
  const std::vector<Module>& modules = *placement_.modules;
  std::vector<int> order;
  std::vector<char> seen(modules.size(), 0);
  *lead = config_.stage3_prefetch_bucket_size;
  for (int module : placement_.param_tier->fetch_order()) {
    if (std::exchange(seen[module], 1) != 0) continue;
    const std::vector<int>& mine = modules[module].params;
    order.insert(order.end(), mine.begin(), mine.end());
    uint64_t elements = 0;
    for (int pi : mine) elements += (*placement_.params)[pi].shard_size;
    *lead = std::max(*lead, elements);
  }
  return order;
}

Status OptimizerStep::RunNvme(std::optional<float> grad_scale, StepSummary* summary) {
  if (tier_writer_ != nullptr && !overlap_->armed()) tier_writer_->Begin();
  if (grad_scale && StepsBesideForward() && !overlap_->KeepsSpeculation(*grad_scale)) {
    // Note [Step in the next forward's order].
    uint64_t lead = 0;
    const std::vector<int> order = NextForwardOrder(&lead);
    tier_writer_->KeepWrittenCopies(true);
    const TieredStoreStats before = placement_.store->stats();
    nvme_read_beside_ = before.nvme_to_host;
    nvme_written_beside_ = before.host_to_nvme;
    ZINF_RETURN_IF_ERROR(overlap_->Start(grad_scale, overlap_->ChunkOrder(order), lead));
    summary->seconds_optimizer_overlapped += overlap_->overlapped_seconds();
    if (!overlap_->in_flight()) {  // nothing was left to step
      tier_writer_->KeepWrittenCopies(false);
      return tier_writer_->Finish();
    }
    step_in_flight_ = true;
    // The parameter tier's fetches wait for the step only where it has not written yet, and
    // drop what it kept for them once they have taken it.
    placement_.param_tier->SetWritten([this](int module) {
      return overlap_->ParamsStepped((*placement_.modules)[module].params);
    });
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
  *read = step_in_flight_ ? nvme_read_beside_ : now.nvme_to_host;
  *written = step_in_flight_ ? nvme_written_beside_ : now.host_to_nvme;
}

Status OptimizerStep::WaitForStep(int module) {
  if (!step_in_flight_) return OkStatus();
  if (module >= 0) {
    const std::vector<int>& mine = (*placement_.modules)[module].params;
    ZINF_RETURN_IF_ERROR(overlap_->WaitForParams(mine));
    return tier_writer_->WritePersistent(mine);
  }
  step_in_flight_ = false;
  placement_.param_tier->SetWritten(nullptr);
  // No forward takes what the step writes from here on (the end of a run, a checkpoint).
  tier_writer_->KeepWrittenCopies(false);
  Status stepped = overlap_->Wait();
  Status written = tier_writer_->Finish();
  // The next step's summary reports it: it ran during the next batch.
  beside_compute_seconds_ += pipelined_->last_step_stats().compute_seconds;
  beside_overlapped_seconds_ += overlap_->started_seconds();
  ZINF_RETURN_IF_ERROR(Context(std::move(stepped), "the optimizer step beside forward"));
  ZINF_RETURN_IF_ERROR(Context(std::move(written), "writing the parameter tier"));
  ResetGradients();
  return ApplySchedule();
}

}  // namespace zinf
