// See src/zero/optimizer_overlap.h and Note [Overlapped step].
#include "zero/optimizer_overlap.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <utility>

#include "core/thread_name.h"
#include "zinf/cpu_optimizer.h"

namespace zinf {

class OptimizerOverlap::PacedWriter final : public ParamWriter {
 public:
  explicit PacedWriter(OptimizerOverlap* overlap) : o_(*overlap) {}
  StatusOr<std::vector<CopyTarget>> Targets(const ChunkView& c) override {
    return o_.writer_->Targets(c);
  }
  void Prefetch(const ChunkInfo& c) override { o_.writer_->Prefetch(c); }
  Status Read(const ChunkView& c) override { return o_.writer_->Read(c); }
  Status Store(const ChunkView& c) override { return o_.writer_->Store(c); }
  Status Restart() override { return o_.writer_->Restart(); }
  Status Updated(const ChunkView& c) override {
    // chunks_ is in flat order: the chunk is the last one starting at or before c.offset.
    auto it = std::upper_bound(o_.chunks_.begin(), o_.chunks_.end(), c.offset,
                               [](size_t offset, const ChunkInfo& k) { return offset < k.offset; });
    const size_t chunk = std::prev(it) - o_.chunks_.begin();
    {
      // Note [Step in the next forward's order]: at most `lead` elements ahead of the forward.
      MutexLock lock(&o_.mu_);
      while (o_.begins_at_[chunk] - std::min(o_.begins_at_[chunk], o_.asked_) > o_.lead_) {
        o_.asked_moved_.Wait(&o_.mu_);
      }
      if (o_.cancel_) return Cancelled("the engine is closing");
    }
    Status s = o_.writer_->Updated(c);
    if (s.ok()) {
      MutexLock lock(&o_.mu_);
      o_.done_[chunk] = true;
    }
    o_.progress_.SignalAll();
    return s;
  }

 private:
  OptimizerOverlap& o_;
};

StatusOr<std::unique_ptr<OptimizerOverlap>> OptimizerOverlap::Create(const OverlapOptions& options,
                                                                     ParamWriter* writer) {
  if (options.optimizer == nullptr || options.cpu == nullptr || options.params == nullptr ||
      writer == nullptr) {
    return InvalidArgument("optimizer overlap: optimizer, cpu, params and writer must be set");
  }
  std::unique_ptr<OptimizerOverlap> self(new OptimizerOverlap(options, writer));
  ZINF_ASSIGN_OR_RETURN(self->chunks_, options.optimizer->Chunks(options.shard));
  const std::vector<Param>& params = *options.params;
  self->of_.resize(params.size());
  size_t c = 0;
  for (size_t pi = 0; pi < params.size(); ++pi) {  // params and chunks both in flat order
    const Param& p = params[pi];
    while (c < self->chunks_.size() &&
           self->chunks_[c].offset + self->chunks_[c].count <= p.flat_offset) {
      ++c;
    }
    for (size_t d = c;
         d < self->chunks_.size() && self->chunks_[d].offset < p.flat_offset + p.shard_size; ++d) {
      self->of_[pi].push_back(d);
    }
  }
  return self;
}

OptimizerOverlap::OptimizerOverlap(const OverlapOptions& options, ParamWriter* writer)
    : options_(options), writer_(writer) {}

OptimizerOverlap::~OptimizerOverlap() {
  Cancel();
  if (!armed_) return;
  Stop().IgnoreError();
  Abandon().IgnoreError();
}

Status OptimizerOverlap::Arm(float scale) {
  if (!options_.enabled || armed_) return OkStatus();
  ZINF_ASSIGN_OR_RETURN(const std::vector<int> groups, options_.optimizer->Groups(options_.shard));
  step_before_.clear();
  for (int g : groups) {
    ZINF_ASSIGN_OR_RETURN(ParamGroupState group, options_.cpu->group(g));
    step_before_.emplace_back(g, group.step);
  }
  ZINF_RETURN_IF_ERROR(options_.optimizer->BeginPartialStep(options_.shard));
  scale_ = scale;
  remaining_.assign(chunks_.size(), 0);
  const std::vector<Param>& params = *options_.params;
  for (size_t pi = 0; pi < params.size(); ++pi) {
    for (size_t c : of_[pi]) {
      const auto [first, last] = Overlap(chunks_[c].offset, chunks_[c].count, params[pi]);
      remaining_[c] += last - first;
    }
  }
  {
    MutexLock lock(&mu_);
    overlapped_seconds_ = 0;
    stepped_.assign(chunks_.size(), false);
    ready_.clear();
    speculated_ = 0;
    stop_ = false;
    worker_error_ = OkStatus();
  }
  armed_ = true;
  worker_ = std::thread([this] {
    NameThisThread("zinf-optim");
    TransferCounters::MarkWorkerThread();  // Note [Transfer counters]
    Work();
  });
  return OkStatus();
}

void OptimizerOverlap::MarkFinal(int param) {
  if (!armed_) return;
  const Param& p = (*options_.params)[param];
  for (size_t c : of_[param]) {
    const auto [first, last] = Overlap(chunks_[c].offset, chunks_[c].count, p);
    remaining_[c] -= last - first;
    if (remaining_[c] == 0) MarkChunkFinal(c);
  }
}

void OptimizerOverlap::MarkChunkFinal(size_t chunk) {
  // Host chunks cannot be speculated on (nothing keeps their old state): Finish steps them.
  if (!armed_ || chunk >= chunks_.size() || !chunks_[chunk].on_nvme) return;
  {
    MutexLock lock(&mu_);
    ready_.push_back(chunk);
  }
  wake_.Signal();
}

void OptimizerOverlap::Work() {
  MutexLock lock(&mu_);
  while (true) {
    const uint64_t limit = options_.speculation_limit;
    while (!stop_ && (ready_.empty() || speculated_ >= limit)) wake_.Wait(&mu_);
    if (stop_) return;
    // Up to the limit; chunks beyond it stay for Finish.
    const size_t take = std::min<uint64_t>(ready_.size(), limit - speculated_);
    std::vector<size_t> batch(ready_.begin(), ready_.begin() + take);
    ready_.erase(ready_.begin(), ready_.begin() + take);
    speculated_ += take;
    mu_.Unlock();
    const auto t0 = std::chrono::steady_clock::now();
    Status stepped =
        options_.optimizer->StepChunks(options_.shard, batch, scale_, /*speculative=*/true);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    mu_.Lock();
    overlapped_seconds_ += seconds;
    if (!stepped.ok()) {
      worker_error_ = std::move(stepped).WithContext("the optimizer step overlapped with backward");
      return;
    }
    for (size_t c : batch) stepped_[c] = true;
  }
}

Status OptimizerOverlap::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  wake_.Signal();
  if (worker_.joinable()) worker_.join();
  armed_ = false;
  MutexLock lock(&mu_);
  return worker_error_;
}

Status OptimizerOverlap::Abandon() {
  StatusOr<std::vector<size_t>> undone =
      options_.optimizer->ResolveSpeculation(options_.shard, /*commit=*/false);
  Status restored = undone.status();
  if (restored.ok() && !undone->empty()) {
    // The old values again for every parameter an undone chunk touched, whole: a parameter
    // the worker began writing has other chunks, not stepped, whose part must be written too.
    std::vector<bool> visit(chunks_.size(), false);
    for (size_t c : *undone) visit[c] = true;
    for (const std::vector<size_t>& touched : of_) {
      bool any = false;
      for (size_t c : touched) any = any || visit[c];
      if (!any) continue;
      for (size_t c : touched) visit[c] = true;
    }
    std::vector<size_t> chunks;
    for (size_t c = 0; c < visit.size(); ++c) {
      if (visit[c]) chunks.push_back(c);
    }
    restored = options_.optimizer->VisitChunks(
        options_.shard, chunks, [this](const ChunkView& c) { return writer_->Updated(c); });
  }
  Status reset;
  for (const auto& [group, step] : step_before_) {
    Status set = options_.cpu->SetStep(group, step);
    if (reset.ok()) reset = set;
  }
  return restored.ok() ? reset : restored;
}

StatusOr<std::vector<size_t>> OptimizerOverlap::Resolve(std::optional<float> scale) {
  std::vector<size_t> rest;
  if (!armed_) {
    {
      MutexLock lock(&mu_);
      overlapped_seconds_ = 0;
    }
    if (!scale) return rest;  // skipped: nothing was begun
    ZINF_RETURN_IF_ERROR(options_.optimizer->BeginPartialStep(options_.shard));
    for (size_t c = 0; c < chunks_.size(); ++c) rest.push_back(c);
    return rest;
  }
  Status worker = Stop();
  if (!worker.ok() || !scale) {
    Status abandoned = Abandon();
    ZINF_RETURN_IF_ERROR(worker);
    ZINF_RETURN_IF_ERROR(abandoned);
    return rest;
  }
  // Kept when the step took the scale speculated with; else dropped and stepped again.
  const bool keep = *scale == scale_;  // (armed until Stop above)
  StatusOr<std::vector<size_t>> undone =
      options_.optimizer->ResolveSpeculation(options_.shard, keep);
  if (!undone.ok()) {
    Abandon().IgnoreError();
    return undone.status();
  }
  MutexLock lock(&mu_);
  for (size_t c = 0; c < chunks_.size(); ++c) {
    if (!keep || !stepped_[c]) rest.push_back(c);
  }
  return rest;
}

Status OptimizerOverlap::Finish(std::optional<float> scale) {
  ZINF_ASSIGN_OR_RETURN(std::vector<size_t> rest, Resolve(scale));
  if (rest.empty()) return OkStatus();
  return options_.optimizer->StepChunks(options_.shard, rest, *scale, false);
}

std::vector<size_t> OptimizerOverlap::ChunkOrder(const std::vector<int>& params) const {
  std::vector<size_t> order;
  std::vector<bool> taken(chunks_.size(), false);
  auto take = [&](size_t c) {
    if (!taken[c]) order.push_back(c);
    taken[c] = true;
  };
  for (int pi : params) {
    if (pi >= 0 && static_cast<size_t>(pi) < of_.size()) {
      for (size_t c : of_[pi]) take(c);
    }
  }
  for (size_t c = 0; c < chunks_.size(); ++c) take(c);
  return order;
}

Status OptimizerOverlap::Start(std::optional<float> scale, const std::vector<size_t>& order,
                               uint64_t lead) {
  ZINF_RETURN_IF_ERROR(Wait());
  ZINF_ASSIGN_OR_RETURN(std::vector<size_t> rest, Resolve(scale));
  if (rest.empty()) return OkStatus();
  std::vector<bool> left(chunks_.size(), false);
  for (size_t c : rest) left[c] = true;
  std::vector<size_t> ordered;
  for (size_t c : order) {
    if (c < left.size() && left[c]) ordered.push_back(c);
    if (c < left.size()) left[c] = false;
  }
  for (size_t c = 0; c < left.size(); ++c) {
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
    beside_forward_error_ = OkStatus();
    beside_forward_seconds_ = 0;
    beside_forward_running_ = true;
  }
  beside_forward_ = std::thread([this, ordered = std::move(ordered), scale = *scale] {
    NameThisThread("zinf-optim");
    TransferCounters::MarkWorkerThread();  // Note [Transfer counters]
    PacedWriter paced(this);
    const auto t0 = std::chrono::steady_clock::now();
    Status s = options_.optimizer->StepChunks(options_.shard, ordered, scale, false, &paced);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
      MutexLock lock(&mu_);
      beside_forward_seconds_ = seconds;
      if (!s.ok())
        beside_forward_error_ = std::move(s).WithContext("the optimizer step beside forward");
      beside_forward_running_ = false;
    }
    progress_.SignalAll();
  });
  return OkStatus();
}

bool OptimizerOverlap::SteppedLocked(const std::vector<int>& params) const {
  for (int pi : params) {
    for (size_t c : of_[pi]) {
      if (!done_[c]) return false;
    }
  }
  return true;
}

bool OptimizerOverlap::ParamsStepped(const std::vector<int>& params) {
  if (!beside_forward_.joinable()) return true;
  MutexLock lock(&mu_);
  return SteppedLocked(params);
}

Status OptimizerOverlap::WaitForParams(const std::vector<int>& params) {
  if (!beside_forward_.joinable()) return OkStatus();
  MutexLock lock(&mu_);
  for (int pi : params) {
    for (size_t c : of_[pi]) asked_ = std::max(asked_, ends_at_[c]);
  }
  asked_moved_.SignalAll();
  while (beside_forward_running_ && !SteppedLocked(params)) progress_.Wait(&mu_);
  return beside_forward_error_;
}

void OptimizerOverlap::Cancel() {
  if (!beside_forward_.joinable()) return;
  {
    MutexLock lock(&mu_);
    cancel_ = true;
  }
  Wait().IgnoreError();
  MutexLock lock(&mu_);
  cancel_ = false;
}

Status OptimizerOverlap::Wait() {
  if (!beside_forward_.joinable()) return OkStatus();
  {
    MutexLock lock(&mu_);
    asked_ = UINT64_MAX;
  }
  asked_moved_.SignalAll();
  beside_forward_.join();
  MutexLock lock(&mu_);
  return std::exchange(beside_forward_error_, OkStatus());
}

}  // namespace zinf
