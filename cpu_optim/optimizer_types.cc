// The plain types of zinf/cpu_optimizer.h: optimizer and ISA names, spans, hyper-parameters with
// their defaults and checks, and the optimizer's options; and, on the best kernels for this CPU,
// the element conversions of zinf/dtype.h and AccumulateFp32. The optimizer itself is
// cpu_optimizer.cc.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cpu_optim/dispatch.h"
#include "cpu_optim/kernels.h"
#include "zinf/cpu_optimizer.h"
#include "zinf/dtype.h"

namespace zinf {
std::string_view OptimizerTypeName(OptimizerType type) {
  switch (type) {
    case OptimizerType::kAdamW:
      return "adamw";
    case OptimizerType::kAdam:
      return "adam";
    case OptimizerType::kAdagrad:
      return "adagrad";
    case OptimizerType::kLion:
      return "lion";
  }
  return "unknown";
}

namespace {
// The best kernels this CPU runs, for the conversions.
const cpu_optim::KernelTable& BestKernels() {
  static const cpu_optim::KernelTable& table =
      cpu_optim::KernelsFor(cpu_optim::ResolveIsa(CpuKernelIsa::kAuto).value());
  return table;
}
}  // namespace

void ConvertFromFp32(const float* src, ElementType type, void* dst, size_t count) {
  if (type == ElementType::kFp32) {
    std::memcpy(dst, src, count * sizeof(float));
    return;
  }
  BestKernels().from_fp32(src, static_cast<cpu_optim::Elem>(type), dst, count);
}

void ConvertToFp32(const void* src, ElementType type, float* dst, size_t count) {
  if (type == ElementType::kFp32) {
    std::memcpy(dst, src, count * sizeof(float));
    return;
  }
  BestKernels().to_fp32(src, static_cast<cpu_optim::Elem>(type), dst, count);
}

void AccumulateFp32(float* acc, const float* x, size_t count) {
  BestKernels().accumulate(acc, x, count);
}

std::string_view CpuKernelIsaName(CpuKernelIsa isa) {
  switch (isa) {
    case CpuKernelIsa::kAuto:
      return "auto";
    case CpuKernelIsa::kScalar:
      return "scalar";
    case CpuKernelIsa::kAvx2:
      return "avx2";
    case CpuKernelIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

std::vector<CpuKernelIsa> SupportedCpuKernelIsas() {
  std::vector<CpuKernelIsa> out;
  for (CpuKernelIsa isa : {CpuKernelIsa::kScalar, CpuKernelIsa::kAvx2, CpuKernelIsa::kAvx512}) {
    if (cpu_optim::IsaSupported(isa)) out.push_back(isa);
  }
  return out;
}

OptimizerSpan OptimizerSpan::Slice(size_t offset, size_t n) const {
  OptimizerSpan s = *this;
  const size_t gsize = ElementSize(grad_type);
  s.params = params ? params + offset : nullptr;
  s.grads = grads ? static_cast<const char*>(grads) + offset * gsize : nullptr;
  s.state0 = state0 ? state0 + offset : nullptr;
  s.state1 = state1 ? state1 + offset : nullptr;
  s.param_copy =
      param_copy ? static_cast<char*>(param_copy) + offset * ElementSize(param_copy_type) : nullptr;
  s.count = n;
  return s;
}

// ---------------------------------------------------------------------------
// Hyper-parameters and options

OptimizerHyperParams OptimizerHyperParams::Defaults(OptimizerType type) {
  OptimizerHyperParams hp;
  hp.type = type;
  switch (type) {
    case OptimizerType::kAdamW:
      hp.weight_decay = 1e-2;  // torch.optim.AdamW's default
      break;
    case OptimizerType::kAdam:
      break;
    case OptimizerType::kAdagrad:
      hp.lr = 1e-2;
      hp.eps = 1e-10;
      break;
    case OptimizerType::kLion:
      hp.lr = 1e-4;
      hp.beta1 = 0.9;
      hp.beta2 = 0.99;
      break;
  }
  return hp;
}

namespace {
std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}
bool FiniteNonNeg(double v) { return std::isfinite(v) && v >= 0.0; }
}  // namespace

Status OptimizerHyperParams::Validate() const {
  const int t = static_cast<int>(type);
  if (t < 0 || t > 3) {
    return InvalidArgument("optimizer type must be adamw, adam, adagrad or lion, got " +
                           std::to_string(t));
  }
  if (!FiniteNonNeg(lr))
    return InvalidArgument("optimizer lr must be finite and >= 0, got " + Num(lr));
  if (!FiniteNonNeg(weight_decay)) {
    return InvalidArgument("optimizer weight_decay must be finite and >= 0, got " +
                           Num(weight_decay));
  }
  if (type != OptimizerType::kAdagrad) {
    if (!(beta1 >= 0.0 && beta1 < 1.0)) {
      return InvalidArgument("optimizer beta1 must be in [0, 1), got " + Num(beta1));
    }
    if (!(beta2 >= 0.0 && beta2 < 1.0)) {
      return InvalidArgument("optimizer beta2 must be in [0, 1), got " + Num(beta2));
    }
  }
  if (type != OptimizerType::kLion && !FiniteNonNeg(eps)) {
    return InvalidArgument("optimizer eps must be finite and >= 0, got " + Num(eps));
  }
  if (type == OptimizerType::kAdagrad) {
    if (!FiniteNonNeg(lr_decay)) {
      return InvalidArgument("optimizer lr_decay must be finite and >= 0, got " + Num(lr_decay));
    }
    if (!FiniteNonNeg(initial_accumulator_value)) {
      return InvalidArgument("optimizer initial_accumulator_value must be finite and >= 0, got " +
                             Num(initial_accumulator_value));
    }
  }
  return OkStatus();
}

int OptimizerHyperParams::state_count() const {
  return type == OptimizerType::kAdamW || type == OptimizerType::kAdam ? 2 : 1;
}

Status CpuOptimizerOptions::Validate() const {
  if (threads < 0 || threads > 4096) {
    return InvalidArgument("cpu optimizer threads must be in [0, 4096] (0: all CPUs), got " +
                           std::to_string(threads));
  }
  const int isa_value = static_cast<int>(isa);
  if (isa_value < 0 || isa_value > 3) {
    return InvalidArgument("cpu optimizer isa must be auto, scalar, avx2 or avx512, got " +
                           std::to_string(isa_value));
  }
  const int store = static_cast<int>(store_mode);
  if (store < 0 || store > 2) {
    return InvalidArgument("cpu optimizer store_mode must be auto, cached or non_temporal, got " +
                           std::to_string(store));
  }
  const int workers_value = static_cast<int>(workers);
  if (workers_value < 0 || workers_value > 1) {
    return InvalidArgument("cpu optimizer workers must be onetbb or process_openmp, got " +
                           std::to_string(workers_value));
  }
  if (prefetch_bytes > (size_t{1} << 20)) {
    return InvalidArgument("cpu optimizer prefetch_bytes must be <= 1 MiB, got " +
                           std::to_string(prefetch_bytes));
  }
  return OkStatus();
}

}  // namespace zinf
