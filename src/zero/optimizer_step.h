// OptimizerStep: the optimizer's room in the engine. It owns what the step reads and writes:
// the CPU optimizer and its schedule, this rank's flat shard's fp32 master, the gradient
// accumulators and the optimizer state (host memory, or NVMe chunks stepped by the
// PipelinedOptimizer), and the update in each of its schedules: after backward, beside
// backward (Note [Overlapped step] in optimizer_overlap.h), beside the next forward (Note [Step
// in the next forward's order] in step_beside_forward.h) and a batch late (Note [Delayed parameter
// update] in optimizer_step.cc). What it asks of the engine is the parameter tier, which it
// writes with the new parameters, and the store its arrays live in.
//
// The engine talks to it in the order of a batch:
//   fetches      BeforeFetch(module): a step beside the forward waits for that module's
//                parameters only;
//   gradients    BeforeGradients; the buckets hand it each reduced gradient (it is their
//                GradientSink), or backward writes the accumulator itself (Accumulator, then
//                GradientWritten);
//   last micro   BeginLastMicroBatch: the overlapped step may begin;
//   step         BeforeGradients and LandLastStep; the engine computes the norm over every
//                rank from GradientStats, decides skipping and clipping, and calls Run with
//                the scale (nullopt: skipped); NvmeMetersAtStepEnd for its summary; EndBatch.
// Outside a batch, Quiesce makes sure nothing runs before the engine reads or replaces state
// (checkpoints, parameters, the learning rate).
//
// Thread-safety: the engine's thread drives it; the overlapped step, a step beside the forward
// and a delayed update run on threads of their own inside it.
#ifndef ZINF_ZERO_OPTIMIZER_STEP_H_
#define ZINF_ZERO_OPTIMIZER_STEP_H_

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "offload/pipelined_optimizer.h"
#include "zero/gradient_buckets.h"
#include "zero/nvme_gradients.h"
#include "zero/optimizer_overlap.h"
#include "zero/param_tier.h"
#include "zero/partition.h"
#include "zero/step_beside_forward.h"
#include "zero/store_array.h"
#include "zinf/cpu_optimizer.h"
#include "zinf/engine.h"
#include "zinf/tiered_store.h"

namespace zinf {

// Where the step's arrays live and what they are laid over; all of it outlives the
// OptimizerStep.
struct OptimizerPlacement {
  TieredStore* store = nullptr;
  ParamTier* param_tier = nullptr;
  std::vector<Param>* params = nullptr;    // laid out over the flat shard
  std::vector<Module>* modules = nullptr;  // for the order of a step beside the forward
  int rank = 0;                            // names the shard in errors
  uint64_t shard_elements = 0;
  ElementType param_type = ElementType::kFp32;  // the parameter tier's
  bool host_master = true;  // the fp32 master stays in host memory (else only on NVMe)
  bool params_on_nvme = false;
  uint64_t speculative_chunks = 0;  // the overlapped step's room on NVMe, in chunks
};

// Elements [begin, begin + count) of the flat shard's initial values into `out`.
using ShardFill = std::function<Status(uint64_t begin, uint64_t count, float* out)>;

// One stretch of the flat shard's fp32 arrays, as checkpoints see them: `arrays` are the
// parameters, then the optimizer's state_count() state arrays, each `count` elements of the
// flat shard from `offset`.
struct ShardArrays {
  uint64_t offset = 0;
  uint64_t count = 0;
  float* arrays[3] = {nullptr, nullptr, nullptr};
};
using ShardArraysVisitor = std::function<Status(const ShardArrays& stretch)>;

class OptimizerStep final : public GradientSink {
 public:
  // The CPU optimizer with the config's hyper-parameters and the first step's learning rate
  // (the schedule's). The arrays come with Open.
  static StatusOr<std::unique_ptr<OptimizerStep>> Create(const EngineConfig& config,
                                                         int optimizer_threads);
  // Stops a step beside the forward at its next chunk (its result goes with the engine).
  ~OptimizerStep() override;
  OptimizerStep(const OptimizerStep&) = delete;
  OptimizerStep& operator=(const OptimizerStep&) = delete;

  // The NVMe step's options (but its pool), which the store's host tier is sized for before
  // Open.
  static PipelinedOptimizerOptions NvmeOptions(const EngineConfig& config, uint64_t shard_elements);

  // Makes the arrays on `placement.store` and fills the master (or, without one, the NVMe
  // state and the parameter tier) from `initial`. With a host master the caller then writes
  // the parameter tier (WriteParamTierFromMaster).
  Status Open(const OptimizerPlacement& placement, const ShardFill& initial);

  // ---- Hyper-parameters ----
  // Note [Parameter groups]: group 0 is the config's optimizer; AddParamGroup (before Open)
  // adds group 1, 2, ... with hyper-parameters of its own (the config's type: InvalidArgument
  // otherwise), which a Param names in spec.optimizer_group.
  StatusOr<int> AddParamGroup(const OptimizerHyperParams& hyper_params);
  int num_groups() const { return static_cast<int>(initial_lrs_.size()); }
  // Group `group`'s hyper-parameters now (InvalidArgument for a bad index).
  StatusOr<OptimizerHyperParams> hyper_params(int group) const;
  int state_count() const;
  int64_t steps() const { return steps_; }
  // The learning rate the next step applies, group 0's or `group`'s (NaN for a bad index).
  double learning_rate(int group = 0) const;
  // Every group's, or one group's, learning rate. InvalidArgument for a negative or non-finite
  // lr or a bad index, FailedPrecondition where the config's scheduler drives it.
  Status SetLearningRate(double lr);
  Status SetGroupLearningRate(int group, double lr);
  // The optimizer's hyper-parameters and step counts of every group (a checkpoint's
  // "optimizer" section), and back with the engine's step count; FailedPrecondition naming
  // both counts when the blob's groups are not this run's.
  std::string SaveHyperState() const;
  Status LoadHyperState(const std::string& blob, int64_t steps);

  // ---- Gradients ----
  // GradientSink: this rank's reduced gradient of the parameter at `flat_offset` (its whole
  // shard), copied into its accumulator when it is the batch's first, else added (host
  // memory, or NVMe chunks with zinf.gradients_on_nvme). Note [First gradient copied] in
  // optimizer_step.cc.
  Status Add(uint64_t flat_offset, const float* reduced, uint64_t size) override;
  // The accumulators of [first, first + count) when it covers whole parameters none of which
  // has anything of the batch yet, in host memory (not with zinf.gradients_on_nvme).
  float* LandingFor(uint64_t first, uint64_t count) override;
  Status Landed(uint64_t first, uint64_t count) override;
  // Parameter `p`'s accumulator in host memory, which backward may write directly while it
  // holds nothing of the batch (one rank, the batch's first micro-batch, host-addressable
  // memory); null where the accumulators are on NVMe. What it holds is an earlier batch's:
  // ZeroAccumulator(p) first for a backward that adds into it. GradientWritten(pi) then tells
  // that the gradient is in.
  float* Accumulator(const Param& p);
  void ZeroAccumulator(const Param& p);
  void GradientWritten(int pi);
  // This rank's accumulated gradient of `p` (shard_size elements, unscaled) into `out`: zeros
  // while none of the batch has arrived.
  Status ReadGradient(const Param& p, float* out);
  // The accumulators' squared norm and finiteness; first zeroes those of parameters that got
  // no gradient in the batch, which the step then reads as zeros.
  StatusOr<GradStats> GradientStats();
  // The first parameter, in registration order, with a non-finite accumulated element on this
  // rank; params.size() for none, or when the accumulators are on NVMe.
  size_t FirstNonFinite() const;

  // ---- The batch ----
  // The batch's last micro-batch begins its reductions: the overlapped step begins, with
  // `mean_scale` (the scale of a step neither clipped nor skipped).
  Status BeginLastMicroBatch(double mean_scale);
  // Before module `module` is fetched: a step beside the forward waits for its parameters.
  Status BeforeFetch(int module);
  // Before backward writes the accumulators or the engine reads them (Gradients,
  // GatherGradient, Step): what of the last step still reads them (a step beside the
  // forward) finishes.
  Status BeforeGradients();
  // Waits for a step beside the forward and a delayed update, and does what Step left for
  // after them; then FailedPrecondition naming `what` while the overlapped step is under way.
  Status Quiesce(std::string_view what);
  // At Step, what the last step left for this one: the time of its part beside the forward
  // (which ran during this batch) into `summary`, and a delayed update (Note [Delayed
  // parameter update]) landed in the parameter tier, its time into `summary` too.
  Status LandLastStep(StepSummary* summary);
  // The update with gradient scale `grad_scale` (nullopt: a skipped step, which undoes what
  // was speculated), its parameters written to the parameter tier (or, delayed or beside the
  // forward, on their way), the step count and the schedule advanced. `delay`: run the update
  // during the next batch. The schedule's error goes to `scheduled`: the step itself stands,
  // and the caller ends the batch before it reports it.
  Status Run(std::optional<float> grad_scale, bool delay, StepSummary* summary, Status* scheduled);
  // Whether the next step speculates: the last one was applied unclipped (Note [Overlapped
  // step]).
  void SpeculateNext(bool speculate) { speculate_ = speculate; }
  // The batch is over, its step applied, skipped or refused: the next batch's first gradient
  // of each parameter replaces what its accumulator holds.
  void EndBatch();
  // After Run, the store's NVMe meters where this step's traffic ends, from `now`: `now`'s,
  // or where the part of the step beside the next forward began (the next step's summary
  // counts the rest), so that each summary holds one step's traffic, whatever the timing.
  void NvmeMetersAtStepEnd(const TieredStoreStats& now, LinkStats* read, LinkStats* written) const;

  // ---- The master ----
  // This rank's fp32 master shard of `p` into `out` (shard_size values): from the host master,
  // else from the parameter tier when it is fp32, else from the optimizer's state (a pass).
  Status ReadMaster(const Param& p, float* out);
  // Replaces `p`'s master shard with `shard` (shard_size values); the caller writes the
  // parameter tier. Where the master is only on NVMe in the chunks this is a whole pass.
  Status WriteMaster(const Param& p, const float* shard);
  // Writes every shard of the parameter tier from the host master, in the compute precision.
  Status WriteParamTierFromMaster();
  bool host_master() const { return placement_.host_master; }

  // ---- Checkpoints ----
  // Visits the flat shard's parameters and state arrays in order, in host memory at once or
  // chunk by chunk from NVMe; with `write_back` what the visitor wrote is stored (a load),
  // into the host master too. Where the parameter tier is the master, the parameters'
  // stretches are stored there (the caller writes the rest of the tier).
  Status VisitArrays(const ShardArraysVisitor& visit, bool write_back);
  // Replaces the fp32 master from `read` (a load of weights alone): the optimizer state and
  // step counts stay. Where the master is the parameter tier's, nothing: the caller writes it.
  Status LoadMaster(const ShardFill& read);

 private:
  OptimizerStep(const EngineConfig& config, std::unique_ptr<CpuOptimizer> optimizer);
  Status OpenNvme(const ShardFill& initial);
  // The whole shard (or a delayed update's `span` over it) stepped group by group.
  Status StepHost(const OptimizerSpan& span, float grad_scale);
  // Where the NVMe step's chunks hand their new parameters: tier_writer_ or master_writer_.
  ParamWriter* param_writer() const;
  Status ApplySchedule();
  OptimizerSpan WholeShard();
  float* Master(const Param& p) { return master_.as<float>() + p.flat_offset; }
  // The parameters whose shards cover [first, first + count) exactly, as [begin, end) indices
  // (begin == end where it starts or ends inside one).
  std::pair<int, int> ParamsCovering(uint64_t first, uint64_t count) const;
  // The accumulators ready for the next batch (on NVMe: their chunks' bookkeeping; in host
  // memory nothing, Note [First gradient copied]).
  void ResetGradients();
  // Zeroes the accumulators of parameters with no gradient in the batch (final_adds_ 0).
  void ZeroGradientsNotWritten();
  // The step over NVMe-resident state, finishing what ran alongside backward (NVMe step in
  // optimizer_step_nvme.cc).
  Status RunNvme(std::optional<float> grad_scale, StepSummary* summary);
  // Whether the step's last part still runs beside the next forward.
  bool step_in_flight() const { return beside_ != nullptr && beside_->in_flight(); }
  // The step beside the forward finished, and what Run left for after it done.
  Status FinishStepBesideForward();
  Status WaitDelayedUpdate();
  Status Context(Status s, std::string_view what) const;

  const EngineConfig& config_;
  std::unique_ptr<CpuOptimizer> optimizer_;
  // Per group (the optimizer's group index): the lr it was given, which the config's scheduler
  // scales or replaces. The shard's runs of each group, made at Open from the parameters.
  std::vector<double> initial_lrs_;
  std::vector<GroupRun> runs_;
  int64_t steps_ = 0;
  OptimizerPlacement placement_;

  // Host memory: master_ (empty without a host master), grad_acc_ (empty with the gradients
  // on NVMe), state0_/state1_ (empty with the state on NVMe).
  StoreArray master_, grad_acc_, state0_, state1_;
  // Per parameter: reductions in its accumulator this batch; 0: none, and what the
  // accumulator holds is stale (Note [First gradient copied]).
  std::vector<int> final_adds_;

  // offload_optimizer.device = nvme: the pipelined step over the shard's chunks, their
  // ParamWriter (the writes of the parameter tier from them, or with a host master the copy
  // into it: param_writer()), the step beside backward, zinf.gradients_on_nvme's accumulators
  // and the step beside the next forward (null where zinf.step_beside_forward does not apply:
  // it needs the parameter tier written from the step's chunks, and stage 3). Declared in the
  // order they use each other.
  std::unique_ptr<PipelinedOptimizer> pipelined_;
  int nvme_shard_ = -1;
  std::unique_ptr<ParamTier::ChunkWriter> tier_writer_;
  std::unique_ptr<ParamWriter> master_writer_;
  std::unique_ptr<OptimizerOverlap> overlap_;
  std::unique_ptr<NvmeGradients> nvme_grads_;
  std::unique_ptr<StepBesideForward> beside_;
  bool speculate_ = true;

  // zinf.delayed_param_update: the step's gradients, which the update in flight reads while
  // the next batch accumulates; the update; whether its parameters still have to reach the
  // parameter tier; its CPU time.
  StoreArray grad_step_;
  std::future<Status> delayed_;
  bool delayed_tier_write_ = false;
  double delayed_seconds_ = 0;
};

}  // namespace zinf

#endif  // ZINF_ZERO_OPTIMIZER_STEP_H_
