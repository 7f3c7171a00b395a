// The C ABI of the CPU optimizers (zinf_cpu_optimizer_*, zinf_convert_*), over
// zinf::CpuOptimizer.
//
// Thread-safety: as CpuOptimizer: zinf_cpu_optimizer_update, _init_state and _grad_stats may run
// concurrently on disjoint spans; calls that change groups must not race with any other.
#include <string>

#include "capi/capi_internal.h"
#include "zinf/c_api.h"
#include "zinf/cpu_optimizer.h"
#include "zinf/dtype.h"

namespace zinf::capi {

template <>
struct HandleTraits<zinf_cpu_optimizer_t> {
  using Object = CpuOptimizer;
  static constexpr HandleKind kKind = HandleKind::kCpuOptimizer;
};

namespace {

StatusOr<ElementType> ToElementType(int dtype, const char* arg) {
  if (dtype < ZINF_DTYPE_FP32 || dtype > ZINF_DTYPE_FP16) {
    return InvalidArgument(std::string(arg) + " must be ZINF_DTYPE_FP32 (0), ZINF_DTYPE_BF16 (1) " +
                           "or ZINF_DTYPE_FP16 (2), got " + std::to_string(dtype));
  }
  return static_cast<ElementType>(dtype);
}

StatusOr<OptimizerHyperParams> ToHyperParams(const zinf_hyper_params_t* in, const char* arg) {
  zinf_hyper_params_t c;
  zinf_hyper_params_init(&c, ZINF_OPTIMIZER_ADAMW);
  ZINF_RETURN_IF_ERROR(ReadStruct(in, arg, "zinf_hyper_params_t", "zinf_hyper_params_init", &c));
  if (c.type < ZINF_OPTIMIZER_ADAMW || c.type > ZINF_OPTIMIZER_LION) {
    return InvalidArgument(std::string(arg) +
                           "->type must be ZINF_OPTIMIZER_ADAMW (0), _ADAM (1), " +
                           "_ADAGRAD (2) or _LION (3), got " + std::to_string(c.type));
  }
  OptimizerHyperParams hp;
  hp.type = static_cast<OptimizerType>(c.type);
  hp.lr = c.lr;
  hp.beta1 = c.beta1;
  hp.beta2 = c.beta2;
  hp.eps = c.eps;
  hp.weight_decay = c.weight_decay;
  hp.bias_correction = c.bias_correction != 0;
  hp.lr_decay = c.lr_decay;
  hp.initial_accumulator_value = c.initial_accumulator_value;
  return hp;
}

zinf_hyper_params_t ToC(const OptimizerHyperParams& hp) {
  zinf_hyper_params_t c{};
  c.struct_size = sizeof(c);
  c.type = static_cast<int32_t>(hp.type);
  c.bias_correction = hp.bias_correction ? 1 : 0;
  c.lr = hp.lr;
  c.beta1 = hp.beta1;
  c.beta2 = hp.beta2;
  c.eps = hp.eps;
  c.weight_decay = hp.weight_decay;
  c.lr_decay = hp.lr_decay;
  c.initial_accumulator_value = hp.initial_accumulator_value;
  return c;
}

// The span's arrays are checked by CpuOptimizer itself, by name ("span params is null ...").
StatusOr<OptimizerSpan> ToSpan(const zinf_optimizer_span_t* in, const char* arg) {
  zinf_optimizer_span_t c;
  zinf_optimizer_span_init(&c);
  ZINF_RETURN_IF_ERROR(
      ReadStruct(in, arg, "zinf_optimizer_span_t", "zinf_optimizer_span_init", &c));
  OptimizerSpan s;
  s.params = c.params;
  s.grads = c.grads;
  ZINF_ASSIGN_OR_RETURN(s.grad_type, ToElementType(c.grad_type, "span->grad_type"));
  s.state0 = c.state0;
  s.state1 = c.state1;
  s.param_copy = c.param_copy;
  ZINF_ASSIGN_OR_RETURN(s.param_copy_type,
                        ToElementType(c.param_copy_type, "span->param_copy_type"));
  s.count = c.count;
  return s;
}

}  // namespace

StatusOr<OptimizerHyperParams> HyperParamsFromC(const zinf_hyper_params_t* in, const char* arg) {
  return ToHyperParams(in, arg);
}
zinf_hyper_params_t HyperParamsToC(const OptimizerHyperParams& hp) { return ToC(hp); }

}  // namespace zinf::capi

using zinf::OkStatus;
using zinf::Status;
using zinf::capi::CheckNotNull;
using zinf::capi::Run;
using zinf::capi::ToElementType;
using zinf::capi::ToHyperParams;
using zinf::capi::ToSpan;

extern "C" {

void zinf_cpu_optimizer_options_init(zinf_cpu_optimizer_options_t* options) {
  if (options == nullptr) return;
  const zinf::CpuOptimizerOptions d;
  *options = zinf_cpu_optimizer_options_t{};
  options->struct_size = sizeof(*options);
  options->threads = d.threads;
  options->isa = static_cast<int32_t>(d.isa);
  options->store_mode = static_cast<int32_t>(d.store_mode);
  options->workers = static_cast<int32_t>(d.workers);
  options->nt_store_min_bytes = d.nt_store_min_bytes;
  options->prefetch_bytes = d.prefetch_bytes;
}

void zinf_hyper_params_init(zinf_hyper_params_t* params, zinf_optimizer_type_t type) {
  if (params == nullptr) return;
  zinf::OptimizerHyperParams hp;
  if (type >= ZINF_OPTIMIZER_ADAMW && type <= ZINF_OPTIMIZER_LION) {
    hp = zinf::OptimizerHyperParams::Defaults(static_cast<zinf::OptimizerType>(type));
  } else {
    // Kept as given, so that creating a group with it names the bad type.
    hp = zinf::OptimizerHyperParams::Defaults(zinf::OptimizerType::kAdamW);
  }
  *params = zinf::capi::ToC(hp);
  params->type = type;
}

void zinf_optimizer_span_init(zinf_optimizer_span_t* span) {
  if (span == nullptr) return;
  *span = zinf_optimizer_span_t{};
  span->struct_size = sizeof(*span);
  span->grad_type = ZINF_DTYPE_FP32;
  span->param_copy_type = ZINF_DTYPE_BF16;
}

zinf_code_t zinf_cpu_optimizer_create(const zinf_cpu_optimizer_options_t* options,
                                      zinf_cpu_optimizer_t** optimizer, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(CheckNotNull(optimizer, "optimizer"));
    *optimizer = nullptr;
    zinf_cpu_optimizer_options_t c;
    zinf_cpu_optimizer_options_init(&c);
    ZINF_RETURN_IF_ERROR(zinf::capi::ReadStruct(options, "options", "zinf_cpu_optimizer_options_t",
                                                "zinf_cpu_optimizer_options_init", &c));
    zinf::CpuOptimizerOptions o;
    o.threads = c.threads;
    // Out-of-range enumerators are caught by Validate, which names the field.
    o.isa = static_cast<zinf::CpuKernelIsa>(c.isa);
    o.store_mode = static_cast<zinf::StoreMode>(c.store_mode);
    o.workers = static_cast<zinf::CpuWorkers>(c.workers);
    o.nt_store_min_bytes = c.nt_store_min_bytes;
    o.prefetch_bytes = c.prefetch_bytes;
    ZINF_ASSIGN_OR_RETURN(std::shared_ptr<zinf::CpuOptimizer> created,
                          zinf::CpuOptimizer::Create(o));
    *optimizer = zinf::capi::NewHandle<zinf_cpu_optimizer_t>(std::move(created));
    return OkStatus();
  });
}

void zinf_cpu_optimizer_destroy(zinf_cpu_optimizer_t* optimizer) {
  try {
    zinf::capi::TakeHandle(optimizer).reset();
  } catch (...) {
  }
}

zinf_code_t zinf_cpu_optimizer_info(zinf_cpu_optimizer_t* optimizer, const char** isa, int* threads,
                                    char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto o, zinf_cpu_optimizer_t, optimizer);
    // CpuKernelIsaName returns views of string literals, so data() is a static C string.
    if (isa != nullptr) *isa = zinf::CpuKernelIsaName(o->isa()).data();
    if (threads != nullptr) *threads = o->threads();
    return OkStatus();
  });
}

zinf_code_t zinf_cpu_optimizer_add_param_group(zinf_cpu_optimizer_t* optimizer,
                                               const zinf_hyper_params_t* params, int* group,
                                               char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto o, zinf_cpu_optimizer_t, optimizer);
    ZINF_RETURN_IF_ERROR(CheckNotNull(group, "group"));
    ZINF_ASSIGN_OR_RETURN(auto hp, ToHyperParams(params, "params"));
    ZINF_ASSIGN_OR_RETURN(*group, o->AddParamGroup(hp));
    return OkStatus();
  });
}

zinf_code_t zinf_cpu_optimizer_set_hyper_params(zinf_cpu_optimizer_t* optimizer, int group,
                                                const zinf_hyper_params_t* params, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto o, zinf_cpu_optimizer_t, optimizer);
    ZINF_ASSIGN_OR_RETURN(auto hp, ToHyperParams(params, "params"));
    return o->SetHyperParams(group, hp);
  });
}

zinf_code_t zinf_cpu_optimizer_get_group(zinf_cpu_optimizer_t* optimizer, int group,
                                         zinf_hyper_params_t* params, int64_t* step,
                                         char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto o, zinf_cpu_optimizer_t, optimizer);
    ZINF_ASSIGN_OR_RETURN(zinf::ParamGroupState state, o->group(group));
    if (params != nullptr) {
      ZINF_RETURN_IF_ERROR(zinf::capi::WriteStruct(zinf::capi::ToC(state.hyper_params), "params",
                                                   "zinf_hyper_params_t", params));
    }
    if (step != nullptr) *step = state.step;
    return OkStatus();
  });
}

zinf_code_t zinf_cpu_optimizer_set_step(zinf_cpu_optimizer_t* optimizer, int group, int64_t step,
                                        char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto o, zinf_cpu_optimizer_t, optimizer);
    return o->SetStep(group, step);
  });
}

zinf_code_t zinf_cpu_optimizer_init_state(zinf_cpu_optimizer_t* optimizer, int group,
                                          const zinf_optimizer_span_t* span, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto o, zinf_cpu_optimizer_t, optimizer);
    ZINF_ASSIGN_OR_RETURN(auto s, ToSpan(span, "span"));
    return o->InitState(group, s);
  });
}

zinf_code_t zinf_cpu_optimizer_step(zinf_cpu_optimizer_t* optimizer, int group,
                                    const zinf_optimizer_span_t* span, float grad_scale,
                                    int check_finite, zinf_optimizer_step_result_t* result,
                                    char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto o, zinf_cpu_optimizer_t, optimizer);
    ZINF_ASSIGN_OR_RETURN(auto s, ToSpan(span, "span"));
    // Checked before stepping: a bad result struct must not leave a step half reported.
    if (result != nullptr) {
      ZINF_RETURN_IF_ERROR(
          zinf::capi::CheckOutputStruct(result, "result", "zinf_optimizer_step_result_t"));
    }
    zinf::StepOptions options;
    options.grad_scale = grad_scale;
    options.check_finite = check_finite != 0;
    ZINF_ASSIGN_OR_RETURN(zinf::StepResult r, o->Step(group, s, options));
    if (result == nullptr) return OkStatus();
    zinf_optimizer_step_result_t c{};
    c.step = r.step;
    c.skipped = r.skipped ? 1 : 0;
    c.finite = r.grad_stats.finite ? 1 : 0;
    c.sum_squares = r.grad_stats.sum_squares;
    return zinf::capi::WriteStruct(c, "result", "zinf_optimizer_step_result_t", result);
  });
}

zinf_code_t zinf_cpu_optimizer_begin_step(zinf_cpu_optimizer_t* optimizer, int group, int64_t* step,
                                          char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto o, zinf_cpu_optimizer_t, optimizer);
    ZINF_ASSIGN_OR_RETURN(int64_t s, o->BeginStep(group));
    if (step != nullptr) *step = s;
    return OkStatus();
  });
}

zinf_code_t zinf_cpu_optimizer_update(zinf_cpu_optimizer_t* optimizer, int group,
                                      const zinf_optimizer_span_t* chunk, float grad_scale,
                                      char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto o, zinf_cpu_optimizer_t, optimizer);
    ZINF_ASSIGN_OR_RETURN(auto s, ToSpan(chunk, "chunk"));
    return o->Update(group, s, grad_scale);
  });
}

zinf_code_t zinf_cpu_optimizer_grad_stats(zinf_cpu_optimizer_t* optimizer, const void* grads,
                                          zinf_dtype_t dtype, uint64_t count, double* sum_squares,
                                          int* finite, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto o, zinf_cpu_optimizer_t, optimizer);
    if (count > 0) ZINF_RETURN_IF_ERROR(CheckNotNull(grads, "grads"));
    ZINF_ASSIGN_OR_RETURN(auto type, ToElementType(dtype, "dtype"));
    ZINF_ASSIGN_OR_RETURN(zinf::GradStats stats, o->ComputeGradStats(grads, type, count));
    if (sum_squares != nullptr) *sum_squares = stats.sum_squares;
    if (finite != nullptr) *finite = stats.finite ? 1 : 0;
    return OkStatus();
  });
}

zinf_code_t zinf_cpu_optimizer_save_state(zinf_cpu_optimizer_t* optimizer, char** data,
                                          size_t* size, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto o, zinf_cpu_optimizer_t, optimizer);
    ZINF_RETURN_IF_ERROR(CheckNotNull(data, "data"));
    ZINF_RETURN_IF_ERROR(CheckNotNull(size, "size"));
    const std::string blob = o->SaveState();
    char* copy = static_cast<char*>(std::malloc(blob.size() > 0 ? blob.size() : 1));
    if (copy == nullptr) return zinf::ResourceExhausted("out of memory for the optimizer state");
    std::memcpy(copy, blob.data(), blob.size());
    *data = copy;
    *size = blob.size();
    return OkStatus();
  });
}

zinf_code_t zinf_cpu_optimizer_load_state(zinf_cpu_optimizer_t* optimizer, const char* data,
                                          size_t size, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto o, zinf_cpu_optimizer_t, optimizer);
    if (size > 0) ZINF_RETURN_IF_ERROR(CheckNotNull(data, "data"));
    return o->LoadState(std::string_view(data != nullptr ? data : "", size));
  });
}

zinf_code_t zinf_convert_from_fp32(const float* src, zinf_dtype_t dtype, void* dst, uint64_t count,
                                   char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_ASSIGN_OR_RETURN(auto type, ToElementType(dtype, "dtype"));
    if (count == 0) return OkStatus();
    ZINF_RETURN_IF_ERROR(CheckNotNull(src, "src"));
    ZINF_RETURN_IF_ERROR(CheckNotNull(dst, "dst"));
    zinf::ConvertFromFp32(src, type, dst, count);
    return OkStatus();
  });
}

zinf_code_t zinf_convert_to_fp32(const void* src, zinf_dtype_t dtype, float* dst, uint64_t count,
                                 char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_ASSIGN_OR_RETURN(auto type, ToElementType(dtype, "dtype"));
    if (count == 0) return OkStatus();
    ZINF_RETURN_IF_ERROR(CheckNotNull(src, "src"));
    ZINF_RETURN_IF_ERROR(CheckNotNull(dst, "dst"));
    zinf::ConvertToFp32(src, type, dst, count);
    return OkStatus();
  });
}

}  // extern "C"
