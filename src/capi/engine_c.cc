// The C ABI of the ZeRO engine (zinf_engine_*), over zinf::Engine. The handle also keeps the
// element counts of the registered parameters, so that C gets sizes with each pointer and
// output buffers are checked before a collective starts.
//
// Thread-safety: one thread drives an engine, as zinf::Engine requires.
#include <fmt/core.h>

#include <cmath>
#include <cstddef>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "capi/capi_internal.h"
#include "zinf/c_api.h"
#include "zinf/engine.h"

namespace zinf::capi {
namespace {

struct EngineHandle {
  std::unique_ptr<Engine> engine;
  std::map<int, std::vector<uint64_t>> module_numels;  // by module id, one per parameter
  std::unordered_map<std::string, uint64_t> param_numels;

  StatusOr<const std::vector<uint64_t>*> Module(int module) const {
    auto it = module_numels.find(module);
    if (it == module_numels.end()) {
      return InvalidArgument("module " + std::to_string(module) + " is not registered (" +
                             std::to_string(module_numels.size()) + " modules are)");
    }
    return &it->second;
  }

  StatusOr<uint64_t> Numel(const char* name) const {
    ZINF_RETURN_IF_ERROR(CheckNotNull(name, "name"));
    auto it = param_numels.find(name);
    if (it == param_numels.end()) {
      return InvalidArgument(std::string("parameter '") + name + "' is not registered");
    }
    return it->second;
  }
};

// Checks `out`/`capacity` for `count` tensors of the module.
Status CheckTensorArray(const zinf_tensor_t* out, size_t capacity, size_t count, int module,
                        const char* arg) {
  if (count > 0) ZINF_RETURN_IF_ERROR(CheckNotNull(out, arg));
  if (capacity < count) {
    return InvalidArgument(std::string(arg) + " has room for " + std::to_string(capacity) +
                           " tensors; module " + std::to_string(module) + " has " +
                           std::to_string(count) + " parameters");
  }
  return OkStatus();
}

zinf_tensor_t HostFp32Tensor(float* data, uint64_t numel) {
  zinf_tensor_t t{};
  t.data = data;
  t.dtype = ZINF_DTYPE_FP32;
  t.device_kind = ZINF_DEVICE_KIND_HOST;
  t.device_index = 0;
  t.numel = numel;
  return t;
}

Status CheckOutput(const float* out, uint64_t capacity, uint64_t numel, const char* name) {
  if (numel > 0) ZINF_RETURN_IF_ERROR(CheckNotNull(out, "out"));
  if (capacity < numel) {
    return InvalidArgument("out has room for " + std::to_string(capacity) + " elements; '" + name +
                           "' has " + std::to_string(numel));
  }
  return OkStatus();
}

StatusOr<ParamSpec> ToParamSpec(const zinf_param_spec_t* in, size_t index, uint64_t* numel) {
  const std::string arg = "params[" + std::to_string(index) + "]";
  zinf_param_spec_t c;
  zinf_param_spec_init(&c);
  ZINF_RETURN_IF_ERROR(ReadStruct(in, arg.c_str(), "zinf_param_spec_t", "zinf_param_spec_init", &c,
                                  offsetof(zinf_param_spec_t, optimizer_group)));
  if (c.name == nullptr) return InvalidArgument(arg + ".name is NULL");
  if (c.ndim > 0 && c.shape == nullptr) {
    return InvalidArgument(arg + ".shape is NULL with ndim " + std::to_string(c.ndim));
  }
  if (c.init < ZINF_PARAM_INIT_NORMAL || c.init > ZINF_PARAM_INIT_ONES) {
    return InvalidArgument(arg + ".init must be ZINF_PARAM_INIT_NORMAL (0), _ZEROS (1) or " +
                           "_ONES (2), got " + std::to_string(c.init));
  }
  ParamSpec spec;
  spec.name = c.name;
  spec.shape.assign(c.shape, c.shape + c.ndim);
  spec.init = static_cast<ParamInit>(c.init);
  spec.init_std = c.init_std;
  spec.optimizer_group = c.optimizer_group;
  spec.trainable = c.trainable != 0;
  // Non-positive dimensions are the engine's to refuse, with its message; only the product's
  // overflow is ours.
  uint64_t n = 1;
  for (int64_t d : spec.shape) {
    if (d > 0 && __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) {
      return InvalidArgument(arg + " ('" + spec.name + "') has more than 2^64 elements");
    }
  }
  *numel = n;
  return spec;
}

}  // namespace

template <>
struct HandleTraits<zinf_engine_t> {
  using Object = EngineHandle;
  static constexpr HandleKind kKind = HandleKind::kEngine;
};

}  // namespace zinf::capi

using zinf::OkStatus;
using zinf::Status;
using zinf::capi::CheckNotNull;
using zinf::capi::Run;

namespace {

// GatherParameter or GatherGradient of parameter `name` into the caller's `out`.
zinf_code_t GatherInto(const char* func, zinf_engine_t* engine, const char* name, float* out,
                       uint64_t capacity, char** errptr,
                       zinf::Status (zinf::Engine::*gather)(const std::string&,
                                                            std::vector<float>*)) {
  return Run(func, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    ZINF_ASSIGN_OR_RETURN(uint64_t numel, e->Numel(name));
    ZINF_RETURN_IF_ERROR(zinf::capi::CheckOutput(out, capacity, numel, name));
    std::vector<float> values;
    ZINF_RETURN_IF_ERROR(((*e->engine).*gather)(name, &values));
    std::copy(values.begin(), values.end(), out);
    return OkStatus();
  });
}

}  // namespace

extern "C" {

void zinf_engine_options_init(zinf_engine_options_t* options) {
  if (options == nullptr) return;
  const zinf::EngineOptions d;
  *options = zinf_engine_options_t{};
  options->struct_size = sizeof(*options);
  options->rank = d.rank;
  options->world_size = d.world_size;
  options->master_addr = nullptr;
  options->master_port = d.master_port;
  options->optimizer_threads = d.optimizer_threads;
  options->timeout_ms = static_cast<int64_t>(d.timeout.count());
}

void zinf_param_spec_init(zinf_param_spec_t* spec) {
  if (spec == nullptr) return;
  const zinf::ParamSpec d;
  *spec = zinf_param_spec_t{};
  spec->struct_size = sizeof(*spec);
  spec->init = static_cast<int32_t>(d.init);
  spec->init_std = d.init_std;
  spec->trainable = d.trainable ? 1 : 0;
}

void zinf_trainer_values_init(zinf_trainer_values_t* values) {
  if (values == nullptr) return;
  *values = zinf_trainer_values_t{};
  values->struct_size = sizeof(*values);
  values->micro_batch_size = values->gradient_accumulation_steps = -1;
  values->total_num_steps = values->warmup_num_steps = values->hidden_size = -1;
  values->gradient_clipping = values->lr = values->beta1 = values->beta2 = values->eps =
      values->weight_decay = std::nan("");
  values->fp16 = values->bf16 = -1;
}

namespace {

// The C struct's "not given" (-1, NaN) as an empty optional; anything else must be in range.
Status ToTrainerValues(const zinf_trainer_values_t& c, zinf::TrainerValues* t) {
  auto count = [](const char* name, int64_t v, int64_t max, auto* out) -> Status {
    if (v == -1) return OkStatus();
    if (v < 0 || v > max) {
      return zinf::InvalidArgument(fmt::format(
          "options->trainer->{} must be -1 (not given) or in [0, {}], got {}", name, max, v));
    }
    *out = static_cast<typename std::remove_reference_t<decltype(*out)>::value_type>(v);
    return OkStatus();
  };
  ZINF_RETURN_IF_ERROR(
      count("micro_batch_size", c.micro_batch_size, 1 << 30, &t->micro_batch_size));
  ZINF_RETURN_IF_ERROR(count("gradient_accumulation_steps", c.gradient_accumulation_steps, 1 << 20,
                             &t->gradient_accumulation_steps));
  ZINF_RETURN_IF_ERROR(
      count("total_num_steps", c.total_num_steps, INT64_MAX / 2, &t->total_num_steps));
  ZINF_RETURN_IF_ERROR(
      count("warmup_num_steps", c.warmup_num_steps, INT64_MAX / 2, &t->warmup_num_steps));
  ZINF_RETURN_IF_ERROR(count("hidden_size", c.hidden_size, int64_t{1} << 31, &t->hidden_size));
  for (auto [name, v, out] :
       {std::tuple{"gradient_clipping", c.gradient_clipping, &t->gradient_clipping},
        std::tuple{"lr", c.lr, &t->lr}, std::tuple{"beta1", c.beta1, &t->beta1},
        std::tuple{"beta2", c.beta2, &t->beta2}, std::tuple{"eps", c.eps, &t->eps},
        std::tuple{"weight_decay", c.weight_decay, &t->weight_decay}}) {
    if (!std::isnan(v)) *out = v;  // range-checked where the config's own value would be
  }
  for (auto [name, v, out] :
       {std::tuple{"fp16", c.fp16, &t->fp16}, std::tuple{"bf16", c.bf16, &t->bf16}}) {
    if (v == -1) continue;
    if (v != 0 && v != 1) {
      return zinf::InvalidArgument(
          fmt::format("options->trainer->{} must be -1 (not given), 0 or 1, got {}", name, v));
    }
    *out = v == 1;
  }
  return OkStatus();
}

}  // namespace

zinf_code_t zinf_engine_create(const char* config_json, const zinf_engine_options_t* options,
                               zinf_engine_t** engine, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(CheckNotNull(engine, "engine"));
    *engine = nullptr;
    ZINF_RETURN_IF_ERROR(CheckNotNull(config_json, "config_json"));
    zinf_engine_options_t c;
    zinf_engine_options_init(&c);
    if (options != nullptr) {
      ZINF_RETURN_IF_ERROR(zinf::capi::ReadStruct(options, "options", "zinf_engine_options_t",
                                                  "zinf_engine_options_init", &c,
                                                  offsetof(zinf_engine_options_t, trainer)));
    }
    zinf::TrainerValues trainer;
    if (c.trainer != nullptr) {
      zinf_trainer_values_t t;
      zinf_trainer_values_init(&t);
      ZINF_RETURN_IF_ERROR(zinf::capi::ReadStruct(
          c.trainer, "options->trainer", "zinf_trainer_values_t", "zinf_trainer_values_init", &t));
      ZINF_RETURN_IF_ERROR(ToTrainerValues(t, &trainer));
    }
    zinf::EngineOptions o;
    o.rank = c.rank;
    o.world_size = c.world_size;
    if (c.master_addr != nullptr) o.master_addr = c.master_addr;
    o.master_port = c.master_port;
    o.device = "host";  // this ABI hands out host memory (zinf_engine_fetch's views)
    o.optimizer_threads = c.optimizer_threads;
    if (c.timeout_ms <= 0) {
      return zinf::InvalidArgument("options->timeout_ms must be > 0, got " +
                                   std::to_string(c.timeout_ms));
    }
    o.timeout = std::chrono::milliseconds(c.timeout_ms);
    if (c.data_parallel_rank_count > 0 && c.data_parallel_ranks == nullptr) {
      return zinf::InvalidArgument("options->data_parallel_ranks is NULL with count " +
                                   std::to_string(c.data_parallel_rank_count));
    }
    o.data_parallel_ranks.assign(c.data_parallel_ranks,
                                 c.data_parallel_ranks + c.data_parallel_rank_count);
    ZINF_ASSIGN_OR_RETURN(zinf::EngineConfig config,
                          zinf::EngineConfig::FromJson(config_json, trainer));
    auto handle = std::make_shared<zinf::capi::EngineHandle>();
    ZINF_ASSIGN_OR_RETURN(handle->engine, zinf::Engine::Create(config, o));
    *engine = zinf::capi::NewHandle<zinf_engine_t>(std::move(handle));
    return OkStatus();
  });
}

void zinf_engine_destroy(zinf_engine_t* engine) {
  try {
    zinf::capi::TakeHandle(engine).reset();
  } catch (...) {
  }
}

zinf_code_t zinf_engine_register_module(zinf_engine_t* engine, const char* name,
                                        const zinf_param_spec_t* params, size_t param_count,
                                        int* module, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    ZINF_RETURN_IF_ERROR(CheckNotNull(name, "name"));
    ZINF_RETURN_IF_ERROR(CheckNotNull(module, "module"));
    if (param_count > 0) ZINF_RETURN_IF_ERROR(CheckNotNull(params, "params"));
    // See the header: elements are read with the stride of the first one's struct_size.
    const size_t stride = param_count > 0 ? params[0].struct_size : 0;
    std::vector<zinf::ParamSpec> specs;
    std::vector<uint64_t> numels(param_count);
    for (size_t i = 0; i < param_count; ++i) {
      const auto* p = reinterpret_cast<const zinf_param_spec_t*>(
          reinterpret_cast<const char*>(params) + i * stride);
      if (p->struct_size != stride) {
        return zinf::InvalidArgument("params[" + std::to_string(i) + "].struct_size is " +
                                     std::to_string(p->struct_size) + ", params[0]'s is " +
                                     std::to_string(stride) + ": they must be equal");
      }
      ZINF_ASSIGN_OR_RETURN(auto spec, zinf::capi::ToParamSpec(p, i, &numels[i]));
      specs.push_back(std::move(spec));
    }
    ZINF_ASSIGN_OR_RETURN(int id, e->engine->RegisterModule(name, specs));
    e->module_numels[id] = numels;
    for (size_t i = 0; i < specs.size(); ++i) e->param_numels[specs[i].name] = numels[i];
    *module = id;
    return OkStatus();
  });
}

zinf_code_t zinf_engine_initialize(zinf_engine_t* engine, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    return e->engine->Initialize();
  });
}

zinf_code_t zinf_engine_module_param_count(zinf_engine_t* engine, int module, size_t* count,
                                           char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    ZINF_RETURN_IF_ERROR(CheckNotNull(count, "count"));
    ZINF_ASSIGN_OR_RETURN(auto numels, e->Module(module));
    *count = numels->size();
    return OkStatus();
  });
}

zinf_code_t zinf_engine_fetch(zinf_engine_t* engine, int module, zinf_tensor_t* params,
                              size_t capacity, size_t* count, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    ZINF_RETURN_IF_ERROR(CheckNotNull(count, "count"));
    ZINF_ASSIGN_OR_RETURN(auto numels, e->Module(module));
    ZINF_RETURN_IF_ERROR(
        zinf::capi::CheckTensorArray(params, capacity, numels->size(), module, "params"));
    ZINF_ASSIGN_OR_RETURN(zinf::FetchedModule fetched, e->engine->Fetch(module));
    if (fetched.params.size() != numels->size()) {
      return zinf::Internal("module " + std::to_string(module) + " fetched " +
                            std::to_string(fetched.params.size()) + " parameters, registered " +
                            std::to_string(numels->size()));
    }
    for (size_t i = 0; i < numels->size(); ++i) {
      params[i] = zinf::capi::HostFp32Tensor(fetched.params[i], (*numels)[i]);
    }
    *count = numels->size();
    return OkStatus();
  });
}

zinf_code_t zinf_engine_release(zinf_engine_t* engine, int module, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    return e->engine->Release(module);
  });
}

zinf_code_t zinf_engine_gradients(zinf_engine_t* engine, int module, zinf_tensor_t* grads,
                                  size_t capacity, size_t* count, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    ZINF_RETURN_IF_ERROR(CheckNotNull(count, "count"));
    ZINF_ASSIGN_OR_RETURN(auto numels, e->Module(module));
    ZINF_RETURN_IF_ERROR(
        zinf::capi::CheckTensorArray(grads, capacity, numels->size(), module, "grads"));
    ZINF_ASSIGN_OR_RETURN(std::vector<float*> buffers, e->engine->Gradients(module));
    if (buffers.size() != numels->size()) {
      return zinf::Internal("module " + std::to_string(module) + " has " +
                            std::to_string(buffers.size()) + " gradient buffers, registered " +
                            std::to_string(numels->size()) + " parameters");
    }
    for (size_t i = 0; i < numels->size(); ++i) {
      grads[i] = zinf::capi::HostFp32Tensor(buffers[i], (*numels)[i]);
    }
    *count = numels->size();
    return OkStatus();
  });
}

zinf_code_t zinf_engine_reduce_gradients(zinf_engine_t* engine, int module, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    return e->engine->ReduceGradients(module);
  });
}

zinf_code_t zinf_engine_step(zinf_engine_t* engine, zinf_step_summary_t* summary, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    // Checked before the step (a collective) so that a bad struct fails on this rank early.
    if (summary != nullptr) {
      ZINF_RETURN_IF_ERROR(zinf::capi::CheckOutputStruct(
          summary, "summary", "zinf_step_summary_t", offsetof(zinf_step_summary_t, learning_rate)));
    }
    ZINF_ASSIGN_OR_RETURN(zinf::StepSummary s, e->engine->Step());
    if (summary == nullptr) return OkStatus();
    zinf_step_summary_t c{};
    c.step = s.step;
    c.skipped = s.skipped ? 1 : 0;
    c.grad_norm = s.grad_norm;
    c.loss_scale = s.loss_scale;
    c.clip_coefficient = s.clip_coefficient;
    c.bytes_gathered = s.bytes_gathered;
    c.bytes_reduce_scattered = s.bytes_reduce_scattered;
    c.bytes_nvme_read = s.bytes_nvme_read;
    c.bytes_nvme_written = s.bytes_nvme_written;
    c.peak_live_parameters = s.peak_live_parameters;
    c.seconds_gather = s.seconds_gather;
    c.seconds_reduce = s.seconds_reduce;
    c.seconds_optimizer = s.seconds_optimizer;
    c.seconds_optimizer_compute = s.seconds_optimizer_compute;
    c.host_bytes = s.host_bytes;
    c.nvme_bytes = s.nvme_bytes;
    c.learning_rate = s.learning_rate;
    c.unix_time_s = s.unix_time_s;
    c.host_waits = s.host_waits;
    c.worker_waits = s.worker_waits;
    c.copies_down = s.copies_down;
    c.bytes_down = s.bytes_down;
    c.copies_up = s.copies_up;
    c.bytes_up = s.bytes_up;
    c.copies_on_device = s.copies_on_device;
    c.bytes_on_device = s.bytes_on_device;
    c.copies_host = s.copies_host;
    c.bytes_host = s.bytes_host;
    c.device_bytes_set = s.device_bytes_set;
    c.host_bytes_set = s.host_bytes_set;
    c.host_bytes_copied = s.host_bytes_copied;
    c.device_budget_bytes = s.device_budget_bytes;
    c.device_peak_bytes = s.device_peak_bytes;
    return zinf::capi::WriteStruct(c, "summary", "zinf_step_summary_t", summary,
                                   offsetof(zinf_step_summary_t, learning_rate));
  });
}

zinf_code_t zinf_engine_info(zinf_engine_t* engine, zinf_engine_info_t* info, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    const zinf::Engine& en = *e->engine;
    zinf_engine_info_t c{};
    c.rank = en.rank();
    c.world_size = en.world_size();
    c.local_rank = en.local_rank();
    c.zero_stage = en.config().zero_stage;
    c.micro_batch_size = en.config().micro_batch_size;
    c.gradient_accumulation_steps = en.config().gradient_accumulation_steps;
    c.loss_scale = en.loss_scale();
    c.learning_rate = en.learning_rate();
    c.train_batch_size = en.config().train_batch_size;
    c.parameters_resident = en.parameters_resident() ? 1 : 0;
    return zinf::capi::WriteStruct(c, "info", "zinf_engine_info_t", info,
                                   offsetof(zinf_engine_info_t, train_batch_size));
  });
}

zinf_code_t zinf_engine_set_learning_rate(zinf_engine_t* engine, double lr, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    return e->engine->SetLearningRate(lr);
  });
}

zinf_code_t zinf_engine_add_param_group(zinf_engine_t* engine, const zinf_hyper_params_t* params,
                                        int* group, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    ZINF_RETURN_IF_ERROR(CheckNotNull(group, "group"));
    ZINF_ASSIGN_OR_RETURN(zinf::OptimizerHyperParams hp,
                          zinf::capi::HyperParamsFromC(params, "params"));
    ZINF_ASSIGN_OR_RETURN(*group, e->engine->AddParamGroup(hp));
    return OkStatus();
  });
}

zinf_code_t zinf_engine_param_group_count(zinf_engine_t* engine, int* count, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    ZINF_RETURN_IF_ERROR(CheckNotNull(count, "count"));
    *count = e->engine->num_param_groups();
    return OkStatus();
  });
}

zinf_code_t zinf_engine_get_param_group(zinf_engine_t* engine, int group,
                                        zinf_hyper_params_t* params, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    ZINF_ASSIGN_OR_RETURN(zinf::OptimizerHyperParams hp, e->engine->param_group(group));
    return zinf::capi::WriteStruct(zinf::capi::HyperParamsToC(hp), "params", "zinf_hyper_params_t",
                                   params);
  });
}

zinf_code_t zinf_engine_set_group_learning_rate(zinf_engine_t* engine, int group, double lr,
                                                char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    return e->engine->SetGroupLearningRate(group, lr);
  });
}

zinf_code_t zinf_engine_mean_over_ranks(zinf_engine_t* engine, double value, double* mean,
                                        char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    ZINF_RETURN_IF_ERROR(CheckNotNull(mean, "mean"));
    ZINF_ASSIGN_OR_RETURN(*mean, e->engine->MeanOverRanks(value));
    return OkStatus();
  });
}

zinf_code_t zinf_engine_param_numel(zinf_engine_t* engine, const char* name, uint64_t* numel,
                                    char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    ZINF_RETURN_IF_ERROR(CheckNotNull(numel, "numel"));
    ZINF_ASSIGN_OR_RETURN(*numel, e->Numel(name));
    return OkStatus();
  });
}

zinf_code_t zinf_engine_gather_parameter(zinf_engine_t* engine, const char* name, float* out,
                                         uint64_t capacity, char** errptr) {
  return GatherInto(__func__, engine, name, out, capacity, errptr, &zinf::Engine::GatherParameter);
}

zinf_code_t zinf_engine_set_parameter(zinf_engine_t* engine, const char* name, const float* values,
                                      uint64_t count, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    ZINF_RETURN_IF_ERROR(CheckNotNull(name, "name"));
    ZINF_RETURN_IF_ERROR(CheckNotNull(values, "values"));
    return e->engine->SetParameter(name, values, count);
  });
}

zinf_code_t zinf_engine_load_safetensors(zinf_engine_t* engine, const char* path, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    ZINF_RETURN_IF_ERROR(CheckNotNull(path, "path"));
    return e->engine->LoadSafetensors(path);
  });
}

zinf_code_t zinf_engine_gather_gradient(zinf_engine_t* engine, const char* name, float* out,
                                        uint64_t capacity, char** errptr) {
  return GatherInto(__func__, engine, name, out, capacity, errptr, &zinf::Engine::GatherGradient);
}

zinf_code_t zinf_engine_shard(zinf_engine_t* engine, const char* name, uint64_t* offset,
                              uint64_t* size, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    ZINF_RETURN_IF_ERROR(CheckNotNull(name, "name"));
    ZINF_RETURN_IF_ERROR(CheckNotNull(offset, "offset"));
    ZINF_RETURN_IF_ERROR(CheckNotNull(size, "size"));
    ZINF_ASSIGN_OR_RETURN(zinf::Engine::ShardRange range, e->engine->Shard(name));
    *offset = range.offset;
    *size = range.size;
    return OkStatus();
  });
}

zinf_code_t zinf_engine_set_buffer(zinf_engine_t* engine, const char* name, const char* dtype,
                                   const int64_t* shape, size_t ndim, const void* data,
                                   uint64_t bytes, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    ZINF_RETURN_IF_ERROR(CheckNotNull(name, "name"));
    ZINF_RETURN_IF_ERROR(CheckNotNull(dtype, "dtype"));
    if (ndim > 0) ZINF_RETURN_IF_ERROR(CheckNotNull(shape, "shape"));
    if (bytes > 0) ZINF_RETURN_IF_ERROR(CheckNotNull(data, "data"));
    if (ndim > 64) {
      return zinf::InvalidArgument("ndim must be at most 64, got " + std::to_string(ndim));
    }
    return e->engine->SetBuffer(name, dtype, std::vector<int64_t>(shape, shape + ndim), data,
                                bytes);
  });
}

zinf_code_t zinf_engine_set_checkpoint_metadata(zinf_engine_t* engine, const char* json_object,
                                                char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    ZINF_RETURN_IF_ERROR(CheckNotNull(json_object, "json_object"));
    return e->engine->SetCheckpointMetadata(json_object);
  });
}

zinf_code_t zinf_engine_get_buffer(zinf_engine_t* engine, const char* name, void* out,
                                   uint64_t bytes, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    ZINF_RETURN_IF_ERROR(CheckNotNull(name, "name"));
    if (bytes > 0) ZINF_RETURN_IF_ERROR(CheckNotNull(out, "out"));
    return e->engine->GetBuffer(name, out, bytes);
  });
}

zinf_code_t zinf_engine_save_checkpoint(zinf_engine_t* engine, const char* dir, const char* tag,
                                        const char* client_state, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    ZINF_RETURN_IF_ERROR(CheckNotNull(dir, "dir"));
    ZINF_RETURN_IF_ERROR(CheckNotNull(tag, "tag"));
    return e->engine->SaveCheckpoint(dir, tag, client_state != nullptr ? client_state : "{}");
  });
}

zinf_code_t zinf_engine_load_checkpoint(zinf_engine_t* engine, const char* dir, char** client_state,
                                        char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto e, zinf_engine_t, engine);
    ZINF_RETURN_IF_ERROR(CheckNotNull(dir, "dir"));
    ZINF_ASSIGN_OR_RETURN(std::string state, e->engine->LoadCheckpoint(dir));
    if (client_state != nullptr) {
      char* copy = zinf::capi::MallocString(state);
      if (copy == nullptr) return zinf::ResourceExhausted("out of memory for the client state");
      *client_state = copy;
    }
    return OkStatus();
  });
}

}  // extern "C"
