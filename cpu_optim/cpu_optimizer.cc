// CpuOptimizer: parameter groups, argument checks, per-step scalars, and the threaded calls
// into the kernels chosen by dispatch.cc.
#include "zinf/cpu_optimizer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/mutex.h"
#include "cpu_optim/dispatch.h"
#include "cpu_optim/kernels.h"
#include "cpu_optim/parallel.h"
#include "zinf/cpu_info.h"

namespace zinf {

// Note [Optimizer overflow contract]
// An in-place step cannot be rolled back, and a check fused into the update pass would find
// an Inf in chunk k after chunks 0..k-1 were already written. So the non-finite check is its
// own read-only pass over the gradients (4 bytes per parameter for fp32, 2 for bf16/fp16,
// against the step's 28-30), and it is the same pass that yields the sum of squares the
// engine needs for the global gradient norm and the clip coefficient. The engine's order is:
//   1. stats = ComputeGradStats(grads) on each rank's shard (all-reduce sum_squares and the
//      finite flag across ranks);
//   2. if any rank saw a non-finite value: skip the step everywhere (no BeginStep, no Update)
//      and lower the loss scale;
//   3. else grad_scale = clip_coef / loss_scale, BeginStep(group), Update(group, chunk,
//      grad_scale) for every chunk.
// Update itself never checks: given non-finite gradients it writes non-finite values, as torch
// would. Step(..., {check_finite = true}) packages 1-3 for a single shard on one rank.

// ---------------------------------------------------------------------------
// CpuOptimizer

// Note [Store mode tuning]
// Whether streaming (non-temporal) stores beat ordinary ones for the in-place update depends on
// the machine, and on the development VM it even flips between runs: with cached stores the
// write-backs sometimes crawl (13 GB/s against 36 GB/s streaming) and sometimes are the faster
// way (44 against 35 GB/s), always over the same bytes. Software prefetch is the same kind of
// bet: on a 2-vCPU AVX-512 EPYC, prefetching 1 KiB ahead (the default distance) made the step
// and the bandwidth kernel alike 15-30% slower than leaving the streams to the hardware
// prefetchers, with one thread or two (bench/RESULTS.md, 2026-12-02), while the bench's limit
// took its best variant without it.
// Every mode gives the same values, so with StoreMode::kAuto the first large calls take turns
// over the candidate modes, {cached, streaming} x {options.prefetch_bytes, no prefetch}
// (kTuneTrials calls each), timing each call, and every later large call uses the mode with
// the highest median bandwidth. These are the variants `zinf bench adam` takes its limit from,
// so the step is held to the best of the same choices. Small calls (below nt_store_min_bytes
// written) always use cached stores and the configured prefetch: their lines are likely to be
// read again soon. The tuning costs a few steps at the start of training, at worst the
// difference between the best mode and the others on three quarters of them.
struct AccessMode {
  bool non_temporal = false;
  size_t prefetch_bytes = 0;
};

class AccessTuner {
 public:
  // Five, not three: on the shared 2-vCPU development VM, whose bandwidth swings by a fifth
  // from one call to the next, three trials each kept the 1 KiB prefetch where it was 15-30%
  // the slower in 7 of 36 runs, five trials in 3 of 32 (bench/RESULTS.md, 2026-12-02).
  static constexpr int kTuneTrials = 5;

  // Under StoreMode::kAuto: cached and streaming stores, each with the configured prefetch
  // distance and without (one candidate per store kind when that distance is 0). Otherwise the
  // one mode the options name, and nothing to tune.
  explicit AccessTuner(const CpuOptimizerOptions& options) {
    const size_t pf = options.prefetch_bytes;
    if (options.store_mode != StoreMode::kAuto) {
      candidates_.push_back({options.store_mode == StoreMode::kNonTemporal, pf});
      decided_ = 0;
      return;
    }
    for (bool nt : {false, true}) {
      candidates_.push_back({nt, pf});
      if (pf != 0) candidates_.push_back({nt, 0});
    }
    rates_.resize(candidates_.size());
  }

  // The candidate for the next large call: the decided one, or the next to try (in turn, so
  // that a slow spell of the machine falls on every candidate alike).
  int Choose() const {
    MutexLock lock(&mu_);
    if (decided_ >= 0) return decided_;
    size_t next = 0;
    for (size_t i = 1; i < rates_.size(); ++i) {
      if (rates_[i].size() < rates_[next].size()) next = i;
    }
    return static_cast<int>(next);
  }
  void Record(int candidate, double bytes_per_s) {
    MutexLock lock(&mu_);
    if (decided_ >= 0) return;
    std::vector<double>& r = rates_[candidate];
    if (static_cast<int>(r.size()) < kTuneTrials) r.push_back(bytes_per_s);
    int best = 0;
    for (size_t i = 0; i < rates_.size(); ++i) {
      if (static_cast<int>(rates_[i].size()) < kTuneTrials) return;
      if (Median(rates_[i]) > Median(rates_[best])) best = static_cast<int>(i);
    }
    decided_ = best;
  }
  const AccessMode& mode(int candidate) const { return candidates_[candidate]; }
  bool decided() const {
    MutexLock lock(&mu_);
    return decided_ >= 0;
  }
  // The decided mode; the first candidate while undecided.
  const AccessMode& in_use() const {
    MutexLock lock(&mu_);
    return candidates_[decided_ >= 0 ? decided_ : 0];
  }

 private:
  static double Median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
  std::vector<AccessMode> candidates_;  // fixed at construction
  mutable Mutex mu_;
  std::vector<std::vector<double>> rates_ ZINF_GUARDED_BY(mu_);  // per candidate, bytes/s
  int decided_ ZINF_GUARDED_BY(mu_) = -1;  // the chosen candidate; -1 while tuning
};

struct CpuOptimizer::Impl {
  explicit Impl(const CpuOptimizerOptions& o) : options(o), tuner(o) {}
  CpuOptimizerOptions options;
  AccessTuner tuner;
  CpuKernelIsa isa = CpuKernelIsa::kScalar;
  const cpu_optim::KernelTable* kernels = nullptr;
  std::unique_ptr<cpu_optim::Parallel> parallel;
  size_t nt_min_bytes = 0;
  std::vector<ParamGroupState> groups;

  Status CheckGroup(int group) const {
    if (group < 0 || static_cast<size_t>(group) >= groups.size()) {
      return InvalidArgument("parameter group " + std::to_string(group) + " does not exist (" +
                             std::to_string(groups.size()) + " groups)");
    }
    return OkStatus();
  }
};

CpuOptimizer::CpuOptimizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CpuOptimizer::~CpuOptimizer() = default;

StatusOr<std::unique_ptr<CpuOptimizer>> CpuOptimizer::Create(const CpuOptimizerOptions& options) {
  ZINF_RETURN_IF_ERROR(options.Validate());
  auto impl = std::make_unique<Impl>(options);
  ZINF_ASSIGN_OR_RETURN(impl->isa, cpu_optim::ResolveIsa(options.isa));
  impl->kernels = &cpu_optim::KernelsFor(impl->isa);
  const CpuInfo& cpu = GetCpuInfo();
  int threads = options.threads;
  if (threads == 0) threads = std::max(1, cpu.usable_cpus);
  ZINF_ASSIGN_OR_RETURN(impl->parallel, cpu_optim::Parallel::Create(threads, options.workers));
  impl->nt_min_bytes = options.nt_store_min_bytes != 0 ? options.nt_store_min_bytes
                       : cpu.l3_bytes != 0             ? cpu.l3_bytes
                                                       : size_t{32} << 20;
  return std::unique_ptr<CpuOptimizer>(new CpuOptimizer(std::move(impl)));
}

CpuKernelIsa CpuOptimizer::isa() const { return impl_->isa; }
int CpuOptimizer::threads() const { return impl_->parallel->threads(); }
CpuWorkers CpuOptimizer::workers() const { return impl_->parallel->workers(); }
const CpuOptimizerOptions& CpuOptimizer::options() const { return impl_->options; }

StoreMode CpuOptimizer::store_mode_in_use() const {
  if (impl_->options.store_mode != StoreMode::kAuto) return impl_->options.store_mode;
  if (!impl_->tuner.decided()) return StoreMode::kAuto;
  return impl_->tuner.in_use().non_temporal ? StoreMode::kNonTemporal : StoreMode::kCached;
}

size_t CpuOptimizer::prefetch_bytes_in_use() const { return impl_->tuner.in_use().prefetch_bytes; }

StatusOr<int> CpuOptimizer::AddParamGroup(const OptimizerHyperParams& hyper_params) {
  ZINF_RETURN_IF_ERROR(hyper_params.Validate());
  impl_->groups.push_back(ParamGroupState{hyper_params, 0});
  return static_cast<int>(impl_->groups.size() - 1);
}

int CpuOptimizer::num_groups() const { return static_cast<int>(impl_->groups.size()); }

StatusOr<ParamGroupState> CpuOptimizer::group(int index) const {
  ZINF_RETURN_IF_ERROR(impl_->CheckGroup(index));
  return impl_->groups[index];
}

Status CpuOptimizer::SetHyperParams(int group, const OptimizerHyperParams& hyper_params) {
  ZINF_RETURN_IF_ERROR(impl_->CheckGroup(group));
  ZINF_RETURN_IF_ERROR(hyper_params.Validate());
  ParamGroupState& g = impl_->groups[group];
  if (hyper_params.type != g.hyper_params.type) {
    return InvalidArgument("parameter group " + std::to_string(group) + " is " +
                           std::string(OptimizerTypeName(g.hyper_params.type)) +
                           "; its type cannot change to " +
                           std::string(OptimizerTypeName(hyper_params.type)));
  }
  g.hyper_params = hyper_params;
  return OkStatus();
}

Status CpuOptimizer::SetStep(int group, int64_t step) {
  ZINF_RETURN_IF_ERROR(impl_->CheckGroup(group));
  if (step < 0) return InvalidArgument("optimizer step must be >= 0, got " + std::to_string(step));
  impl_->groups[group].step = step;
  return OkStatus();
}

namespace {

Status CheckSpan(const OptimizerHyperParams& hp, const OptimizerSpan& s) {
  const int g = static_cast<int>(s.grad_type);
  if (g < 0 || g > 2) {
    return InvalidArgument("span grad_type must be fp32, bf16 or fp16, got " + std::to_string(g));
  }
  if (s.param_copy != nullptr && s.param_copy_type != ElementType::kBf16 &&
      s.param_copy_type != ElementType::kFp16) {
    return InvalidArgument("span param_copy_type must be bf16 or fp16, got " +
                           std::string(ElementTypeName(s.param_copy_type)));
  }
  if (s.count == 0) return OkStatus();
  if (s.params == nullptr)
    return InvalidArgument("span params is null with count " + std::to_string(s.count));
  if (s.grads == nullptr)
    return InvalidArgument("span grads is null with count " + std::to_string(s.count));
  if (reinterpret_cast<uintptr_t>(s.params) % alignof(float) != 0 ||
      reinterpret_cast<uintptr_t>(s.state0) % alignof(float) != 0 ||
      reinterpret_cast<uintptr_t>(s.state1) % alignof(float) != 0) {
    return InvalidArgument("span params and state arrays must be 4-byte aligned");
  }
  if (s.state0 == nullptr) {
    return InvalidArgument("span state0 is null; " + std::string(OptimizerTypeName(hp.type)) +
                           " needs " + std::to_string(hp.state_count()) + " state arrays");
  }
  if (hp.state_count() == 2 && s.state1 == nullptr) {
    return InvalidArgument("span state1 (exp_avg_sq) is null; " +
                           std::string(OptimizerTypeName(hp.type)) + " needs it");
  }
  if (hp.state_count() == 1 && s.state1 != nullptr) {
    return InvalidArgument("span state1 must be null for " +
                           std::string(OptimizerTypeName(hp.type)) + ", which has one state array");
  }
  return OkStatus();
}

cpu_optim::StepCoeffs MakeCoeffs(const OptimizerHyperParams& hp, int64_t step, float grad_scale) {
  cpu_optim::StepCoeffs c;
  c.kind = static_cast<cpu_optim::Kind>(hp.type);
  c.grad_scale = grad_scale;
  const double t = static_cast<double>(step);
  c.beta1 = static_cast<float>(hp.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - hp.beta1);
  c.beta2 = static_cast<float>(hp.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - hp.beta2);
  c.eps = static_cast<float>(hp.eps);
  switch (hp.type) {
    case OptimizerType::kAdamW:
    case OptimizerType::kAdam: {
      double bc1 = 1.0, bc2 = 1.0;
      if (hp.bias_correction) {
        bc1 = 1.0 - std::pow(hp.beta1, t);
        bc2 = 1.0 - std::pow(hp.beta2, t);
      }
      c.neg_step_size = static_cast<float>(-(hp.lr / bc1));
      c.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
      c.inv_bc2_sqrt = 1.0f / c.bc2_sqrt;
      if (hp.type == OptimizerType::kAdamW) {
        c.param_decay = static_cast<float>(1.0 - hp.lr * hp.weight_decay);
      } else {
        c.has_l2 = hp.weight_decay != 0.0;
        c.l2 = static_cast<float>(hp.weight_decay);
      }
      break;
    }
    case OptimizerType::kAdagrad: {
      const double clr = hp.lr / (1.0 + (t - 1.0) * hp.lr_decay);
      c.neg_step_size = static_cast<float>(-clr);
      c.has_l2 = hp.weight_decay != 0.0;
      c.l2 = static_cast<float>(hp.weight_decay);
      break;
    }
    case OptimizerType::kLion:
      c.neg_step_size = static_cast<float>(-hp.lr);
      c.param_decay = static_cast<float>(1.0 - hp.lr * hp.weight_decay);
      break;
  }
  return c;
}

cpu_optim::StepArrays ToArrays(const OptimizerSpan& s) {
  cpu_optim::StepArrays a;
  a.params = s.params;
  a.grads = s.grads;
  a.state0 = s.state0;
  a.state1 = s.state1;
  a.copy = s.param_copy;
  a.count = s.count;
  a.grad_type = static_cast<cpu_optim::Elem>(s.grad_type);
  a.copy_type = static_cast<cpu_optim::Elem>(s.param_copy_type);
  return a;
}

cpu_optim::StepArrays SubArrays(const cpu_optim::StepArrays& a, size_t begin, size_t end) {
  cpu_optim::StepArrays s = a;
  const size_t gsize = a.grad_type == cpu_optim::Elem::kFp32 ? 4 : 2;
  s.params = a.params + begin;
  s.grads = static_cast<const char*>(a.grads) + begin * gsize;
  s.state0 = a.state0 + begin;
  s.state1 = a.state1 ? a.state1 + begin : nullptr;
  s.copy = a.copy ? static_cast<char*>(a.copy) + begin * 2 : nullptr;
  s.count = end - begin;
  return s;
}

}  // namespace

Status CpuOptimizer::ApplyStep(const OptimizerHyperParams& hp, int64_t step, float grad_scale,
                               const OptimizerSpan& span) const {
  const SteppedSpan one[] = {{step, span}};
  return ApplySteps(hp, grad_scale, one);
}

Status CpuOptimizer::ApplySteps(const OptimizerHyperParams& hp, float grad_scale,
                                std::span<const SteppedSpan> spans) const {
  ZINF_RETURN_IF_ERROR(hp.Validate());
  if (!std::isfinite(grad_scale)) {
    return InvalidArgument("grad_scale must be finite, got " + std::to_string(grad_scale));
  }
  std::vector<cpu_optim::StepCoeffs> coeffs;
  std::vector<cpu_optim::StepArrays> arrays;
  std::vector<size_t> counts;
  coeffs.reserve(spans.size());
  arrays.reserve(spans.size());
  counts.reserve(spans.size());
  size_t bytes_written = 0;
  for (const SteppedSpan& s : spans) {
    ZINF_RETURN_IF_ERROR(CheckSpan(hp, s.span));
    if (s.step < 1) {
      return InvalidArgument("optimizer step must be >= 1, got " + std::to_string(s.step));
    }
    coeffs.push_back(MakeCoeffs(hp, s.step, grad_scale));
    arrays.push_back(ToArrays(s.span));
    counts.push_back(s.span.count);
    bytes_written +=
        s.span.count * (4 * (1 + hp.state_count()) + (s.span.param_copy != nullptr ? 2 : 0));
  }
  // Note [Store mode tuning]: under kAuto, small calls keep cached stores and the configured
  // prefetch; a forced store mode is the tuner's one candidate, for every call.
  const bool use_tuner =
      impl_->options.store_mode != StoreMode::kAuto || bytes_written >= impl_->nt_min_bytes;
  const bool tune = use_tuner && !impl_->tuner.decided();
  const int candidate = use_tuner ? impl_->tuner.Choose() : -1;
  const AccessMode access =
      use_tuner ? impl_->tuner.mode(candidate) : AccessMode{false, impl_->options.prefetch_bytes};
  const bool nt = access.non_temporal;
  const size_t pf = access.prefetch_bytes;
  const cpu_optim::KernelTable* k = impl_->kernels;
  const auto start = std::chrono::steady_clock::now();
  ZINF_RETURN_IF_ERROR(impl_->parallel->ForEach(counts, [&](size_t i, size_t begin, size_t end) {
    k->step(coeffs[i], SubArrays(arrays[i], begin, end), nt, pf);
  }));
  if (tune) {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s > 0) impl_->tuner.Record(candidate, static_cast<double>(bytes_written) / s);
  }
  return OkStatus();
}

StatusOr<int64_t> CpuOptimizer::BeginStep(int group) {
  ZINF_RETURN_IF_ERROR(impl_->CheckGroup(group));
  return ++impl_->groups[group].step;
}

Status CpuOptimizer::Update(int group, const OptimizerSpan& chunk, float grad_scale) {
  ZINF_RETURN_IF_ERROR(impl_->CheckGroup(group));
  const ParamGroupState& g = impl_->groups[group];
  if (g.step < 1) {
    return FailedPrecondition("parameter group " + std::to_string(group) +
                              " is at step 0: call BeginStep before Update");
  }
  return ApplyStep(g.hyper_params, g.step, grad_scale, chunk)
      .WithContext("updating parameter group " + std::to_string(group));
}

StatusOr<StepResult> CpuOptimizer::Step(int group, const OptimizerSpan& shard,
                                        const StepOptions& options) {
  ZINF_RETURN_IF_ERROR(impl_->CheckGroup(group));
  ParamGroupState& g = impl_->groups[group];
  ZINF_RETURN_IF_ERROR(CheckSpan(g.hyper_params, shard));
  StepResult result;
  if (options.check_finite) {
    ZINF_ASSIGN_OR_RETURN(result.grad_stats,
                          ComputeGradStats(shard.grads, shard.grad_type, shard.count));
    if (!result.grad_stats.finite) {
      result.skipped = true;
      result.step = g.step;
      return result;
    }
  }
  const int64_t step = g.step + 1;
  ZINF_RETURN_IF_ERROR(ApplyStep(g.hyper_params, step, options.grad_scale, shard)
                           .WithContext("stepping parameter group " + std::to_string(group)));
  g.step = step;
  result.step = step;
  return result;
}

Status CpuOptimizer::Accumulate(float* acc, const float* x, size_t count, bool overwrite) const {
  if (count != 0 && (acc == nullptr || x == nullptr)) {
    return InvalidArgument("Accumulate: a null array with count " + std::to_string(count));
  }
  const cpu_optim::KernelTable* k = impl_->kernels;
  return impl_->parallel->For(count, [&](size_t begin, size_t end) {
    if (overwrite) {
      std::memcpy(acc + begin, x + begin, (end - begin) * sizeof(float));
    } else {
      k->accumulate(acc + begin, x + begin, end - begin);
    }
  });
}

StatusOr<GradStats> CpuOptimizer::ComputeGradStats(const void* grads, ElementType type,
                                                   size_t count) const {
  const int t = static_cast<int>(type);
  if (t < 0 || t > 2) {
    return InvalidArgument("grad type must be fp32, bf16 or fp16, got " + std::to_string(t));
  }
  if (count != 0 && grads == nullptr) {
    return InvalidArgument("grads is null with count " + std::to_string(count));
  }
  const size_t esize = ElementSize(type);
  const auto elem = static_cast<cpu_optim::Elem>(type);
  const cpu_optim::KernelTable* k = impl_->kernels;
  ZINF_ASSIGN_OR_RETURN(double sum, impl_->parallel->Sum(count, [&](size_t begin, size_t end) {
    return k->grad_sum_squares(static_cast<const char*>(grads) + begin * esize, elem, end - begin);
  }));
  GradStats stats;
  stats.sum_squares = sum;
  stats.finite = std::isfinite(sum);
  return stats;
}

Status CpuOptimizer::InitState(int group, const OptimizerSpan& span) {
  ZINF_RETURN_IF_ERROR(impl_->CheckGroup(group));
  const OptimizerHyperParams& hp = impl_->groups[group].hyper_params;
  if (span.count != 0 && span.state0 == nullptr) {
    return InvalidArgument("span state0 is null with count " + std::to_string(span.count));
  }
  if (span.count != 0 && hp.state_count() == 2 && span.state1 == nullptr) {
    return InvalidArgument("span state1 is null; " + std::string(OptimizerTypeName(hp.type)) +
                           " needs it");
  }
  const float init0 =
      hp.type == OptimizerType::kAdagrad ? static_cast<float>(hp.initial_accumulator_value) : 0.0f;
  float* s0 = span.state0;
  float* s1 = hp.state_count() == 2 ? span.state1 : nullptr;
  return impl_->parallel->For(span.count, [&](size_t begin, size_t end) {
    std::fill(s0 + begin, s0 + end, init0);
    if (s1 != nullptr) std::fill(s1 + begin, s1 + end, 0.0f);
  });
}

// ---------------------------------------------------------------------------
// Checkpoints: "ZINFOPT1", u32 version, u32 groups, per group {i32 type, 7 x f64, u8 bias
// correction, i64 step}, then u64 FNV-1a of everything before it. Little-endian host order.

namespace {
constexpr char kMagic[8] = {'Z', 'I', 'N', 'F', 'O', 'P', 'T', '1'};
constexpr uint32_t kVersion = 1;

uint64_t Fnv1a(std::string_view bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

template <typename T>
void Put(std::string* out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out->append(buf, sizeof(T));
}

class Reader {
 public:
  explicit Reader(std::string_view b) : b_(b) {}
  template <typename T>
  bool Get(T* v) {
    if (b_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};
}  // namespace

std::string CpuOptimizer::SaveState() const {
  std::string out(kMagic, sizeof(kMagic));
  Put<uint32_t>(&out, kVersion);
  Put<uint32_t>(&out, static_cast<uint32_t>(impl_->groups.size()));
  for (const ParamGroupState& g : impl_->groups) {
    const OptimizerHyperParams& hp = g.hyper_params;
    Put<int32_t>(&out, static_cast<int32_t>(hp.type));
    for (double v : {hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, hp.lr_decay,
                     hp.initial_accumulator_value}) {
      Put<double>(&out, v);
    }
    Put<uint8_t>(&out, hp.bias_correction ? 1 : 0);
    Put<int64_t>(&out, g.step);
  }
  Put<uint64_t>(&out, Fnv1a(out));
  return out;
}

Status CpuOptimizer::LoadState(std::string_view bytes) {
  if (bytes.size() < sizeof(kMagic) + 16 ||
      std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return DataLoss("optimizer state is not a zinf optimizer checkpoint (" +
                    std::to_string(bytes.size()) + " bytes, bad magic or too short)");
  }
  uint64_t stored_sum;
  std::memcpy(&stored_sum, bytes.data() + bytes.size() - 8, 8);
  const std::string_view body = bytes.substr(0, bytes.size() - 8);
  if (Fnv1a(body) != stored_sum) {
    return DataLoss("optimizer state checksum mismatch (" + std::to_string(bytes.size()) +
                    " bytes): truncated or corrupt");
  }
  Reader r(body.substr(sizeof(kMagic)));
  uint32_t version = 0, count = 0;
  if (!r.Get(&version) || !r.Get(&count)) return DataLoss("optimizer state header is truncated");
  if (version != kVersion) {
    return InvalidArgument("optimizer state version " + std::to_string(version) +
                           " is not readable by this build (reads " + std::to_string(kVersion) +
                           ")");
  }
  std::vector<ParamGroupState> groups;
  for (uint32_t i = 0; i < count; ++i) {
    ParamGroupState g;
    OptimizerHyperParams& hp = g.hyper_params;
    int32_t type = 0;
    uint8_t bc = 0;
    bool ok = r.Get(&type);
    for (double* v : {&hp.lr, &hp.beta1, &hp.beta2, &hp.eps, &hp.weight_decay, &hp.lr_decay,
                      &hp.initial_accumulator_value}) {
      ok = ok && r.Get(v);
    }
    ok = ok && r.Get(&bc) && r.Get(&g.step);
    if (!ok) return DataLoss("optimizer state is truncated in group " + std::to_string(i));
    hp.type = static_cast<OptimizerType>(type);
    hp.bias_correction = bc != 0;
    ZINF_RETURN_IF_ERROR_CTX(hp.Validate(), "optimizer state group " + std::to_string(i));
    if (g.step < 0)
      return DataLoss("optimizer state group " + std::to_string(i) + " has a negative step");
    groups.push_back(g);
  }
  if (sizeof(kMagic) + r.pos() != body.size()) {
    return DataLoss("optimizer state has " +
                    std::to_string(body.size() - sizeof(kMagic) - r.pos()) +
                    " unexpected trailing bytes");
  }
  impl_->groups = std::move(groups);
  return OkStatus();
}

}  // namespace zinf
