// StepBesideForward: the NVMe optimizer step's last part run beside the next batch's forward,
// in the order that forward fetches its parameters (zinf.step_beside_forward).
//
// Note [Step in the next forward's order]
// Once the norm is known, a step that did not run beside backward (nothing speculated, as in
// a run that clips every step, or the speculation dropped) need not finish before the next
// batch begins: Start steps its chunks on a thread in the order the next forward fetches their
// parameters, and WaitForModule lets each fetch wait for its own parameters only. The forward's
// compute then runs beside the optimizer's NVMe pass instead of after it, and since the step writes
// each parameter just before the forward reads it, the parameter tier keeps the written copy
// (TieredStore::WriteBackAsync) and the fetch takes it from memory instead of reading back
// from NVMe what was just written. The update is element-wise, so the order changes no bit.
// The step runs at most a lead (the next module, as a read-ahead would) past the furthest
// parameters the forward has asked for: a trainer that takes its time before the forward (a
// slow data loader) does not find the step done and every parameter it wrote held in memory.
// Waiting for the whole step lifts the bound, and the engine then keeps no copies, since no
// forward is coming for them. The pass cannot outlast that forward (its last module waits for
// it) nor start before backward's last gradient, so a clipped step takes at least
// max(forward, the pass's I/O) + backward, whatever the chunks' order.
//
// Thread-safety: one thread (the engine's) calls it, and the parameter tier's fetches on that
// thread ask it which modules are written; the step runs on a thread of its own inside.
#ifndef ZINF_ZERO_STEP_BESIDE_FORWARD_H_
#define ZINF_ZERO_STEP_BESIDE_FORWARD_H_

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "core/mutex.h"
#include "offload/pipelined_optimizer.h"
#include "zero/optimizer_overlap.h"
#include "zero/param_tier.h"
#include "zero/partition.h"
#include "zinf/engine.h"
#include "zinf/status.h"
#include "zinf/tiered_store.h"

namespace zinf {

// What the step works on; all of it outlives the StepBesideForward.
struct StepBesideForwardOptions {
  PipelinedOptimizer* optimizer = nullptr;
  int shard = 0;                                 // the pipelined optimizer's shard
  const std::vector<Param>* params = nullptr;    // laid out over the shard
  const std::vector<Module>* modules = nullptr;  // what a fetch asks for
  ParamTier* param_tier = nullptr;               // the next forward's order; its fetches
  ParamTier::ChunkWriter* writer = nullptr;      // the shard's: the step's new parameters
  TieredStore* store = nullptr;                  // its NVMe meters
  uint64_t prefetch_bucket_elements = 0;         // stage3_prefetch_bucket_size: the least lead
  int rank = 0;                                  // names the shard in errors
};

class StepBesideForward final : public ParamTier::StepWrites {
 public:
  static StatusOr<std::unique_ptr<StepBesideForward>> Create(
      const StepBesideForwardOptions& options);
  // Stops a step in flight at its next chunk (an engine closing: its state goes with it).
  ~StepBesideForward() override;
  StepBesideForward(const StepBesideForward&) = delete;
  StepBesideForward& operator=(const StepBesideForward&) = delete;

  // Ends the step `overlap` ran beside backward with gradient scale `scale` (resolving its
  // speculation) and steps the chunks left on a thread of its own, in the next forward's order
  // (Note [Step in the next forward's order]), the writer keeping the copies it writes for that
  // forward. Returns once the speculation is resolved (its errors); with nothing left to step
  // the writes are finished and no step is in flight.
  Status Start(OptimizerOverlap& overlap, float scale);
  // Whether a step begun by Start has not been finished.
  bool in_flight() const { return in_flight_; }
  // Before module `module`'s fetch: waits for its parameters (the step's error, if it failed)
  // and writes its persistent ones. OK at once when no step is in flight.
  Status WaitForModule(int module);
  // Waits for the whole step and finishes the parameter tier's writes; the step's first error.
  // The writer keeps no copies from here on (no forward takes them: the end of a run, a
  // checkpoint). Nothing when no step is in flight.
  Status Finish();
  // Stops the step at its next chunk and waits for it: the chunks it has not stepped stay as
  // they were.
  void Cancel();

  // ParamTier::StepWrites: whether module `module`'s shards hold their new values.
  bool Written(int module) override;

  // Adds the time of the steps finished since the last call to `summary` (a step is reported
  // by the next step's summary: it ran during the next batch).
  void TakeTimes(StepSummary* summary);
  // The store's NVMe meters where the step in flight began (the traffic of the step it belongs
  // to ends there).
  const LinkStats& nvme_read_at_start() const { return nvme_read_at_start_; }
  const LinkStats& nvme_written_at_start() const { return nvme_written_at_start_; }

 private:
  // Stands in for the writer on the step's thread: hands each chunk on at most the lead ahead
  // of the forward, and marks it done.
  class PacedWriter;
  explicit StepBesideForward(const StepBesideForwardOptions& options) : options_(options) {}
  // The chunks of the parameters of the next forward's modules, in the order that forward
  // fetches them as the first batch recorded it (flat order before that), each once, then the
  // others in flat order; and the lead: the next module's elements (or
  // prefetch_bucket_elements).
  std::vector<size_t> NextForwardOrder(uint64_t* lead) const;
  // Waits for the step's thread; its first error.
  Status Join();
  // Whether every chunk the parameters touch is stepped.
  bool SteppedLocked(const std::vector<int>& params) const ZINF_REQUIRES(mu_);
  Status Context(Status s, std::string_view what) const;

  const StepBesideForwardOptions options_;
  std::vector<ChunkInfo> chunks_;        // in flat order
  std::vector<std::vector<size_t>> of_;  // per parameter: the chunks it touches
  bool in_flight_ = false;
  LinkStats nvme_read_at_start_, nvme_written_at_start_;
  // The time of the steps finished since TakeTimes.
  double compute_seconds_ = 0, overlapped_seconds_ = 0;

  // Shared with the step's thread.
  mutable Mutex mu_;
  std::vector<bool> done_ ZINF_GUARDED_BY(mu_);  // per chunk
  // Per chunk: the elements of the chunks before it in the step's order, and with it.
  std::vector<uint64_t> begins_at_ ZINF_GUARDED_BY(mu_);
  std::vector<uint64_t> ends_at_ ZINF_GUARDED_BY(mu_);
  // The furthest ends_at_ of the chunks WaitForModule asked for.
  uint64_t asked_ ZINF_GUARDED_BY(mu_) = 0;
  uint64_t lead_ ZINF_GUARDED_BY(mu_) = UINT64_MAX;
  bool cancel_ ZINF_GUARDED_BY(mu_) = false;
  CondVar asked_moved_;  // asked_ grew
  CondVar progress_;     // a chunk was done, or the step ended
  Status error_ ZINF_GUARDED_BY(mu_);
  double seconds_ ZINF_GUARDED_BY(mu_) = 0;  // the last step's, on its thread
  bool running_ ZINF_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace zinf

#endif  // ZINF_ZERO_STEP_BESIDE_FORWARD_H_
