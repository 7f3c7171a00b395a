// See src/zero/optimizer_overlap.h and Note [Overlapped step].
#include "zero/optimizer_overlap.h"

#include <fmt/core.h>

#include <chrono>
#include <utility>

#include "core/thread_name.h"
#include "zinf/cpu_optimizer.h"

namespace zinf {

StatusOr<std::unique_ptr<OptimizerOverlap>> OptimizerOverlap::Create(
    const OverlapOptions& options, ChunkVisitor updated, std::function<Status()> restart) {
  if (options.optimizer == nullptr || options.cpu == nullptr || options.params == nullptr) {
    return InvalidArgument("optimizer overlap: optimizer, cpu and params must be set");
  }
  std::unique_ptr<OptimizerOverlap> self(
      new OptimizerOverlap(options, std::move(updated), std::move(restart)));
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

OptimizerOverlap::OptimizerOverlap(const OverlapOptions& options, ChunkVisitor updated,
                                   std::function<Status()> restart)
    : options_(options), updated_(std::move(updated)), restart_(std::move(restart)) {}

OptimizerOverlap::~OptimizerOverlap() {
  if (!armed_) return;
  Stop().IgnoreError();
  Abandon().IgnoreError();
}

Status OptimizerOverlap::Arm(float scale) {
  if (!options_.enabled || armed_) return OkStatus();
  ZINF_ASSIGN_OR_RETURN(ParamGroupState group, options_.cpu->group(options_.group));
  step_before_ = group.step;
  ZINF_RETURN_IF_ERROR(options_.optimizer->BeginPartialStep(options_.shard));
  scale_ = scale;
  overlapped_seconds_ = 0;
  remaining_.assign(chunks_.size(), 0);
  stepped_.assign(chunks_.size(), false);
  const std::vector<Param>& params = *options_.params;
  for (size_t pi = 0; pi < params.size(); ++pi) {
    for (size_t c : of_[pi]) {
      const auto [first, last] = Overlap(chunks_[c].offset, chunks_[c].count, params[pi]);
      remaining_[c] += last - first;
    }
  }
  {
    std::lock_guard lock(mu_);
    ready_.clear();
    speculated_ = 0;
    stop_ = false;
    worker_error_ = OkStatus();
  }
  armed_ = true;
  worker_ = std::thread([this] {
    NameThisThread("zinf-optim");
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
    std::lock_guard lock(mu_);
    ready_.push_back(chunk);
  }
  wake_.notify_one();
}

void OptimizerOverlap::Work() {
  std::unique_lock lock(mu_);
  while (true) {
    const uint64_t limit = options_.speculation_limit;
    wake_.wait(lock, [&] { return stop_ || (!ready_.empty() && speculated_ < limit); });
    if (stop_) return;
    // Up to the limit; chunks beyond it stay for Finish.
    const size_t take = std::min<uint64_t>(ready_.size(), limit - speculated_);
    std::vector<size_t> batch(ready_.begin(), ready_.begin() + take);
    ready_.erase(ready_.begin(), ready_.begin() + take);
    speculated_ += take;
    lock.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    Status stepped = options_.optimizer->StepChunks(options_.shard, batch, scale_,
                                                    /*speculative=*/true, updated_);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    lock.lock();
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
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_one();
  if (worker_.joinable()) worker_.join();
  armed_ = false;
  return worker_error_;
}

Status OptimizerOverlap::Abandon() {
  StatusOr<std::vector<size_t>> undone =
      options_.optimizer->ResolveSpeculation(options_.shard, /*commit=*/false);
  Status restored = undone.status();
  if (restored.ok() && restart_) restored = restart_();
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
    restored = options_.optimizer->VisitChunks(options_.shard, chunks, updated_);
  }
  Status reset = options_.cpu->SetStep(options_.group, step_before_);
  return restored.ok() ? reset : restored;
}

Status OptimizerOverlap::Finish(std::optional<float> scale) {
  std::vector<size_t> rest;
  if (!armed_) {
    overlapped_seconds_ = 0;
    if (!scale) return OkStatus();  // skipped: nothing was begun
    ZINF_RETURN_IF_ERROR(options_.optimizer->BeginPartialStep(options_.shard));
    for (size_t c = 0; c < chunks_.size(); ++c) rest.push_back(c);
    return options_.optimizer->StepChunks(options_.shard, rest, *scale, false, updated_);
  }
  Status worker = Stop();
  if (!worker.ok() || !scale) {
    Status abandoned = Abandon();
    return worker.ok() ? abandoned : worker;
  }
  // Kept when the step took the scale speculated with; else dropped and stepped again.
  const bool keep = *scale == scale_;
  StatusOr<std::vector<size_t>> undone =
      options_.optimizer->ResolveSpeculation(options_.shard, keep);
  if (!undone.ok()) {
    Abandon().IgnoreError();
    return undone.status();
  }
  if (!keep && restart_) {
    if (Status restarted = restart_(); !restarted.ok()) {
      Abandon().IgnoreError();
      return restarted;
    }
  }
  for (size_t c = 0; c < chunks_.size(); ++c) {
    if (!keep || !stepped_[c]) rest.push_back(c);
  }
  return options_.optimizer->StepChunks(options_.shard, rest, *scale, false, updated_);
}

}  // namespace zinf
