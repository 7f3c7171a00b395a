// zinf._zinf.CpuOptimizer: zinf's CPU optimizer kernels (zinf/cpu_optimizer.h) over the
// flat fp32 buffers of torch tensors, for zinf.optim. The Python side keeps the state tensors
// and step counts (so torch's state_dict works unchanged) and calls the stateless ApplySteps
// once per group, whose threads share out all its parameters' chunks, with the GIL released. Each
// parameter's step count is torch's float32 scalar tensor, read and advanced here through its
// pointer: a torch op per parameter per step (an item() and an add_) cost more than a 64K-element
// update.
//
// Thread-safety: one CpuOptimizer is driven by one Python thread at a time (the GIL is
// released only inside apply, which touches no Python object).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "python/csrc/binding.h"
#include "zinf/cpu_optimizer.h"

namespace zinf::python {
namespace {

OptimizerType TypeFromName(const std::string& name) {
  if (name == "adamw") return OptimizerType::kAdamW;
  if (name == "adam") return OptimizerType::kAdam;
  if (name == "adagrad") return OptimizerType::kAdagrad;
  if (name == "lion") return OptimizerType::kLion;
  throw StatusError(
      InvalidArgument("optimizer type must be adamw, adam, adagrad or lion, got " + name));
}

CpuKernelIsa IsaFromName(const std::string& name) {
  for (CpuKernelIsa isa :
       {CpuKernelIsa::kAuto, CpuKernelIsa::kScalar, CpuKernelIsa::kAvx2, CpuKernelIsa::kAvx512}) {
    if (CpuKernelIsaName(isa) == name) return isa;
  }
  throw StatusError(InvalidArgument("isa must be auto, scalar, avx2 or avx512, got " + name));
}

// (step_count, params, grads, grad_dtype, state0, state1, copy, copy_dtype, count); step_count
// points at the float32 count of steps taken, which apply advances by one.
using Item = std::tuple<uintptr_t, uintptr_t, uintptr_t, std::string, uintptr_t, uintptr_t,
                        uintptr_t, std::string, uint64_t>;

// The step after `taken` steps. float32 counts integers exactly up to 2^24.
int64_t NextStep(float taken) {
  constexpr float kMaxSteps = 1 << 24;
  if (!(taken >= 0 && taken < kMaxSteps) ||
      taken != static_cast<float>(static_cast<int64_t>(taken))) {
    throw StatusError(
        InvalidArgument("a parameter's step count must be a whole number in [0, 2^24), got " +
                        std::to_string(taken)));
  }
  return static_cast<int64_t>(taken) + 1;
}

class PyCpuOptimizer {
 public:
  PyCpuOptimizer(int threads, const std::string& isa, const std::string& workers) {
    CpuOptimizerOptions options;
    options.threads = threads;
    options.isa = IsaFromName(isa);
    if (workers != "openmp" && workers != "onetbb") {
      throw StatusError(InvalidArgument("workers must be openmp or onetbb, got " + workers));
    }
    options.workers = workers == "openmp" ? CpuWorkers::kProcessOpenMp : CpuWorkers::kOneTbb;
    optimizer_ = ValueOrThrow(CpuOptimizer::Create(options));
  }

  std::string isa() const { return std::string(CpuKernelIsaName(optimizer_->isa())); }
  int threads() const { return optimizer_->threads(); }
  std::string workers() const {
    return optimizer_->workers() == CpuWorkers::kProcessOpenMp ? "openmp" : "onetbb";
  }

  void Apply(const std::string& type, double lr, double beta1, double beta2, double eps,
             double weight_decay, bool bias_correction, double lr_decay,
             double initial_accumulator_value, float grad_scale, const std::vector<Item>& items) {
    OptimizerHyperParams hp = OptimizerHyperParams::Defaults(TypeFromName(type));
    hp.lr = lr;
    hp.beta1 = beta1;
    hp.beta2 = beta2;
    hp.eps = eps;
    hp.weight_decay = weight_decay;
    hp.bias_correction = bias_correction;
    hp.lr_decay = lr_decay;
    hp.initial_accumulator_value = initial_accumulator_value;
    ThrowIfError(hp.Validate());
    // Every pointer is checked before any parameter changes: a bad item leaves all untouched.
    std::vector<SteppedSpan> spans;
    std::vector<float*> step_counts;
    spans.reserve(items.size());
    step_counts.reserve(items.size());
    for (const Item& item : items) {
      const auto& [step_count, params, grads, grad_dtype, state0, state1, copy, copy_dtype, count] =
          item;
      OptimizerSpan span;
      span.count = count;
      span.params = static_cast<float*>(Pointer(params, "params"));
      span.grads = Pointer(grads, "grads");
      span.grad_type = ElementTypeFromName(grad_dtype, "gradient dtype");
      span.state0 = static_cast<float*>(Pointer(state0, "optimizer state"));
      if (hp.state_count() == 2)
        span.state1 = static_cast<float*>(Pointer(state1, "optimizer state"));
      if (copy != 0) {
        span.param_copy = reinterpret_cast<void*>(copy);
        span.param_copy_type = ElementTypeFromName(copy_dtype, "parameter copy dtype");
        if (span.param_copy_type == ElementType::kFp32) {
          throw StatusError(InvalidArgument("the parameter copy must be bfloat16 or float16"));
        }
      }
      step_counts.push_back(static_cast<float*>(Pointer(step_count, "step count")));
      spans.push_back({NextStep(*step_counts.back()), span});
    }
    Status status;
    {
      py::gil_scoped_release release;
      status = optimizer_->ApplySteps(hp, grad_scale, spans);
      if (status.ok()) {
        for (size_t i = 0; i < spans.size(); ++i) {
          *step_counts[i] = static_cast<float>(spans[i].step);
        }
      }
    }
    ThrowIfError(status);
  }

  std::pair<double, bool> GradStats(uintptr_t grads, const std::string& dtype, uint64_t count) {
    const void* data = Pointer(grads, "grads");
    const ElementType type = ElementTypeFromName(dtype, "gradient dtype");
    StatusOr<zinf::GradStats> stats = [&] {
      py::gil_scoped_release release;
      return optimizer_->ComputeGradStats(data, type, count);
    }();
    zinf::GradStats s = ValueOrThrow(std::move(stats));
    return {s.sum_squares, s.finite};
  }

 private:
  std::unique_ptr<CpuOptimizer> optimizer_;
};

}  // namespace

void BindOptim(py::module_& m) {
  py::class_<PyCpuOptimizer>(
      m, "CpuOptimizer", "zinf's vectorized, threaded CPU optimizer kernels (zinf.optim uses it)")
      .def(py::init<int, const std::string&, const std::string&>(), py::arg("threads") = 0,
           py::arg("isa") = "auto", py::arg("workers") = "onetbb")
      .def_property_readonly("isa", &PyCpuOptimizer::isa)
      .def_property_readonly("threads", &PyCpuOptimizer::threads)
      .def_property_readonly("workers", &PyCpuOptimizer::workers)
      .def("apply", &PyCpuOptimizer::Apply, py::arg("type"), py::arg("lr"), py::arg("beta1"),
           py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"), py::arg("bias_correction"),
           py::arg("lr_decay"), py::arg("initial_accumulator_value"), py::arg("grad_scale"),
           py::arg("items"))
      .def("grad_stats", &PyCpuOptimizer::GradStats, py::arg("grads"), py::arg("dtype"),
           py::arg("count"));
  m.def("supported_isas", [] {
    std::vector<std::string> names;
    for (CpuKernelIsa isa : SupportedCpuKernelIsas()) names.emplace_back(CpuKernelIsaName(isa));
    return names;
  });
}

}  // namespace zinf::python
