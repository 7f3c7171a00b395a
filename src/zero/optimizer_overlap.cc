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

Status MapShardChunks(PipelinedOptimizer& optimizer, int shard, const std::vector<Param>& params,
                      std::vector<ChunkInfo>* chunks, std::vector<std::vector<size_t>>* of) {
  ZINF_ASSIGN_OR_RETURN(*chunks, optimizer.Chunks(shard));
  of->assign(params.size(), {});
  size_t c = 0;
  // Params and chunks both in flat order; frozen params lie past every chunk, in none.
  for (size_t pi = 0; pi < params.size(); ++pi) {
    const Param& p = params[pi];
    while (c < chunks->size() && (*chunks)[c].offset + (*chunks)[c].count <= p.flat_offset) ++c;
    for (size_t d = c; d < chunks->size() && (*chunks)[d].offset < p.flat_offset + p.shard_size;
         ++d) {
      (*of)[pi].push_back(d);
    }
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<OptimizerOverlap>> OptimizerOverlap::Create(const OverlapOptions& options,
                                                                     ParamWriter* writer) {
  if (options.optimizer == nullptr || options.cpu == nullptr || options.params == nullptr ||
      writer == nullptr) {
    return InvalidArgument("optimizer overlap: optimizer, cpu, params and writer must be set");
  }
  std::unique_ptr<OptimizerOverlap> self(new OptimizerOverlap(options, writer));
  ZINF_RETURN_IF_ERROR(MapShardChunks(*options.optimizer, options.shard, *options.params,
                                      &self->chunks_, &self->of_));
  return self;
}

OptimizerOverlap::OptimizerOverlap(const OverlapOptions& options, ParamWriter* writer)
    : options_(options), writer_(writer) {}

OptimizerOverlap::~OptimizerOverlap() {
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

}  // namespace zinf
