// See src/zero/step_beside_forward.h and Note [Step in the next forward's order].
#include "zero/step_beside_forward.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <utility>

#include "core/thread_name.h"

namespace zinf {

class StepBesideForward::PacedWriter final : public ParamWriter {
 public:
  explicit PacedWriter(StepBesideForward* step) : s_(*step), writer_(*step->options_.writer) {}
  StatusOr<std::vector<CopyTarget>> Targets(const ChunkView& c) override {
    return writer_.Targets(c);
  }
  void Prefetch(const ChunkInfo& c) override { writer_.Prefetch(c); }
  Status Read(const ChunkView& c) override { return writer_.Read(c); }
  Status Store(const ChunkView& c) override { return writer_.Store(c); }
  Status Restart() override { return writer_.Restart(); }
  Status Updated(const ChunkView& c) override {
    // chunks_ is in flat order: the chunk is the last one starting at or before c.offset.
    auto it = std::upper_bound(s_.chunks_.begin(), s_.chunks_.end(), c.offset,
                               [](size_t offset, const ChunkInfo& k) { return offset < k.offset; });
    const size_t chunk = std::prev(it) - s_.chunks_.begin();
    {
      // Note [Step in the next forward's order]: at most `lead` elements ahead of the forward.
      MutexLock lock(&s_.mu_);
      while (s_.begins_at_[chunk] - std::min(s_.begins_at_[chunk], s_.asked_) > s_.lead_) {
        s_.asked_moved_.Wait(&s_.mu_);
      }
      if (s_.cancel_) return Cancelled("the engine is closing");
    }
    Status s = writer_.Updated(c);
    if (s.ok()) {
      MutexLock lock(&s_.mu_);
      s_.done_[chunk] = true;
    }
    s_.progress_.SignalAll();
    return s;
  }

 private:
  StepBesideForward& s_;
  ParamWriter& writer_;
};

StatusOr<std::unique_ptr<StepBesideForward>> StepBesideForward::Create(
    const StepBesideForwardOptions& options) {
  if (options.optimizer == nullptr || options.params == nullptr || options.modules == nullptr ||
      options.param_tier == nullptr || options.writer == nullptr || options.store == nullptr) {
    return InvalidArgument(
        "step beside the forward: optimizer, params, modules, param_tier, writer and store must "
        "be set");
  }
  std::unique_ptr<StepBesideForward> self(new StepBesideForward(options));
  ZINF_RETURN_IF_ERROR(MapShardChunks(*options.optimizer, options.shard, *options.params,
                                      &self->chunks_, &self->of_));
  return self;
}

StepBesideForward::~StepBesideForward() {
  Cancel();
  if (in_flight_) options_.param_tier->SetStepWrites(nullptr);
}

Status StepBesideForward::Context(Status s, std::string_view what) const {
  return s.ok() ? s : std::move(s).WithContext(fmt::format("rank {}: {}", options_.rank, what));
}

std::vector<size_t> StepBesideForward::NextForwardOrder(uint64_t* lead) const {
  // The step keeps the parameters it writes in memory for the forward, but only the next
  // module's (or stage3_prefetch_bucket_size elements) ahead of it, as a read-ahead would.
  const std::vector<Module>& modules = *options_.modules;
  std::vector<size_t> order;
  std::vector<char> seen(modules.size(), 0);
  std::vector<bool> taken(chunks_.size(), false);
  auto take = [&](size_t c) {
    if (!taken[c]) order.push_back(c);
    taken[c] = true;
  };
  *lead = options_.prefetch_bucket_elements;
  for (int module : options_.param_tier->fetch_order()) {
    if (std::exchange(seen[module], 1) != 0) continue;
    uint64_t elements = 0;
    for (int pi : modules[module].params) {
      for (size_t c : of_[pi]) take(c);
      elements += (*options_.params)[pi].shard_size;
    }
    *lead = std::max(*lead, elements);
  }
  for (size_t c = 0; c < chunks_.size(); ++c) take(c);
  return order;
}

Status StepBesideForward::Start(OptimizerOverlap& overlap, float scale) {
  uint64_t lead = 0;
  const std::vector<size_t> order = NextForwardOrder(&lead);
  ParamTier::ChunkWriter& writer = *options_.writer;
  writer.KeepWrittenCopies(true);
  const TieredStoreStats before = options_.store->stats();
  nvme_read_at_start_ = before.nvme_to_host;
  nvme_written_at_start_ = before.host_to_nvme;
  ZINF_RETURN_IF_ERROR(Join());
  ZINF_ASSIGN_OR_RETURN(const std::vector<size_t> rest, overlap.Resolve(scale));
  if (rest.empty()) {  // nothing was left to step
    writer.KeepWrittenCopies(false);
    return writer.Finish();
  }
  std::vector<bool> left(chunks_.size(), false);
  for (size_t c : rest) left[c] = true;
  std::vector<size_t> ordered;
  for (size_t c : order) {
    if (left[c]) ordered.push_back(c);
  }
  {
    MutexLock lock(&mu_);
    done_.assign(chunks_.size(), true);
    for (size_t c : ordered) done_[c] = false;
    begins_at_.assign(chunks_.size(), 0);
    ends_at_.assign(chunks_.size(), 0);
    uint64_t at = 0;
    for (size_t c : ordered) {
      begins_at_[c] = at;
      ends_at_[c] = at += chunks_[c].count;
    }
    asked_ = 0;
    lead_ = lead;
    error_ = OkStatus();
    seconds_ = 0;
    running_ = true;
  }
  thread_ = std::thread([this, ordered = std::move(ordered), scale] {
    NameThisThread("zinf-optim");
    TransferCounters::MarkWorkerThread();  // Note [Transfer counters]
    PacedWriter paced(this);
    const auto t0 = std::chrono::steady_clock::now();
    Status s = options_.optimizer->StepChunks(options_.shard, ordered, scale, false, &paced);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
      MutexLock lock(&mu_);
      seconds_ = seconds;
      if (!s.ok()) error_ = std::move(s).WithContext("the optimizer step beside forward");
      running_ = false;
    }
    progress_.SignalAll();
  });
  in_flight_ = true;
  // The parameter tier's fetches wait for the step only where it has not written yet, and
  // drop what it kept for them once they have taken it.
  options_.param_tier->SetStepWrites(this);
  return OkStatus();
}

bool StepBesideForward::SteppedLocked(const std::vector<int>& params) const {
  for (int pi : params) {
    for (size_t c : of_[pi]) {
      if (!done_[c]) return false;
    }
  }
  return true;
}

bool StepBesideForward::Written(int module) {
  if (!thread_.joinable()) return true;
  MutexLock lock(&mu_);
  return SteppedLocked((*options_.modules)[module].params);
}

Status StepBesideForward::WaitForModule(int module) {
  if (!in_flight_) return OkStatus();
  const std::vector<int>& params = (*options_.modules)[module].params;
  if (thread_.joinable()) {
    MutexLock lock(&mu_);
    for (int pi : params) {
      for (size_t c : of_[pi]) asked_ = std::max(asked_, ends_at_[c]);
    }
    asked_moved_.SignalAll();
    while (running_ && !SteppedLocked(params)) progress_.Wait(&mu_);
    ZINF_RETURN_IF_ERROR(error_);
  }
  return options_.writer->WritePersistent(params);
}

Status StepBesideForward::Finish() {
  if (!in_flight_) return OkStatus();
  in_flight_ = false;
  options_.param_tier->SetStepWrites(nullptr);
  ParamTier::ChunkWriter& writer = *options_.writer;
  // No forward takes what the step writes from here on (the end of a run, a checkpoint).
  writer.KeepWrittenCopies(false);
  Status stepped = Join();
  Status written = writer.Finish();
  // The next step's summary reports it: it ran during the next batch.
  compute_seconds_ += options_.optimizer->last_step_stats().compute_seconds;
  {
    MutexLock lock(&mu_);
    overlapped_seconds_ += seconds_;
  }
  ZINF_RETURN_IF_ERROR(Context(std::move(stepped), "the optimizer step beside forward"));
  return Context(std::move(written), "writing the parameter tier");
}

void StepBesideForward::TakeTimes(StepSummary* summary) {
  summary->seconds_optimizer_compute += std::exchange(compute_seconds_, 0);
  summary->seconds_optimizer_overlapped += std::exchange(overlapped_seconds_, 0);
}

void StepBesideForward::Cancel() {
  if (!thread_.joinable()) return;
  {
    MutexLock lock(&mu_);
    cancel_ = true;
  }
  Join().IgnoreError();
  MutexLock lock(&mu_);
  cancel_ = false;
}

Status StepBesideForward::Join() {
  if (!thread_.joinable()) return OkStatus();
  {
    MutexLock lock(&mu_);
    asked_ = UINT64_MAX;
  }
  asked_moved_.SignalAll();
  thread_.join();
  MutexLock lock(&mu_);
  return std::exchange(error_, OkStatus());
}

}  // namespace zinf
