// zinf._zinf.Engine: the ZeRO engine (zinf/engine.h) for zinf.zero, which drives it from
// nn.Module hooks. On the host device, gathered parameters and gradient buffers are handed
// out as writable memoryviews over the engine's memory: valid until the module's Release
// (parameters) or ReduceGradients (gradients). zinf.zero copies out of and into them and keeps
// no view past those calls.
//
// On a GPU ("cuda:N") they are handed out as (address, dtype, numel) of device memory, which
// zinf.zero wraps as torch CUDA tensors without a copy, and each call names the torch stream
// (a cudaStream_t as an integer) it is ordered with: *_on_stream. The stream waits for the
// gather before it computes with the parameters; Release and ReduceGradients record it, so
// that the engine reuses or reads the memory only after the work queued on it so far.
//
// Calls that may block on peers or on I/O (Initialize, Fetch, ReduceGradients, Step,
// collectives, checkpoints) release the GIL.
//
// Thread-safety: one thread drives an Engine (zinf/engine.h).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "python/csrc/binding.h"
#include "zinf/device.h"
#include "zinf/engine.h"

namespace zinf::python {
namespace {

template <typename F>
auto WithoutGil(F&& f) {
  py::gil_scoped_release release;
  return f();
}

// (address, dtype, numel) of device tensors, the dtype as torch names it.
py::list DeviceTensors(const std::vector<ParamTensor>& tensors) {
  py::list out;
  for (const ParamTensor& t : tensors) {
    const char* dtype = t.dtype == ElementType::kBf16   ? "bfloat16"
                        : t.dtype == ElementType::kFp16 ? "float16"
                                                        : "float32";
    out.append(py::make_tuple(reinterpret_cast<uintptr_t>(t.data), dtype, t.numel));
  }
  return out;
}

py::list Views(const std::vector<float*>& data, const std::vector<uint64_t>& numel) {
  py::list out;
  for (size_t i = 0; i < data.size(); ++i) {
    if (data[i] == nullptr) {  // a frozen parameter's gradient: none
      out.append(py::none());
      continue;
    }
    out.append(py::memoryview::from_memory(static_cast<void*>(data[i]),
                                           static_cast<py::ssize_t>(numel[i] * sizeof(float)),
                                           /*readonly=*/false));
  }
  return out;
}

// TrainerValues from a dict of its field names (zinf.zero maps Hugging Face's names to these);
// an unknown name is an error naming it.
TrainerValues ToTrainerValues(const py::dict& d) {
  TrainerValues t;
  for (const auto& [key_object, value] : d) {
    const std::string key = py::str(key_object);
    if (value.is_none()) continue;
    if (key == "micro_batch_size") {
      t.micro_batch_size = value.cast<int>();
    } else if (key == "gradient_accumulation_steps") {
      t.gradient_accumulation_steps = value.cast<int>();
    } else if (key == "total_num_steps") {
      t.total_num_steps = value.cast<int64_t>();
    } else if (key == "warmup_num_steps") {
      t.warmup_num_steps = value.cast<int64_t>();
    } else if (key == "hidden_size") {
      t.hidden_size = value.cast<int64_t>();
    } else if (key == "gradient_clipping") {
      t.gradient_clipping = value.cast<double>();
    } else if (key == "lr") {
      t.lr = value.cast<double>();
    } else if (key == "beta1") {
      t.beta1 = value.cast<double>();
    } else if (key == "beta2") {
      t.beta2 = value.cast<double>();
    } else if (key == "eps") {
      t.eps = value.cast<double>();
    } else if (key == "weight_decay") {
      t.weight_decay = value.cast<double>();
    } else if (key == "fp16") {
      t.fp16 = value.cast<bool>();
    } else if (key == "bf16") {
      t.bf16 = value.cast<bool>();
    } else {
      throw StatusError(InvalidArgument("trainer value '" + key + "' is not one zinf knows"));
    }
  }
  return t;
}

class PyEngine {
 public:
  PyEngine(const std::string& config_json, int rank, int world_size, int optimizer_threads,
           double timeout_s, const py::dict& trainer, int master_port, const std::string& device) {
    EngineConfig config =
        ValueOrThrow(EngineConfig::FromJson(config_json, ToTrainerValues(trainer)));
    EngineOptions options;
    // "host": the hooks read and write the tensors as host memoryviews; "cuda:N": as torch
    // CUDA tensors over the engine's memory, which need no fp32 copy of 16-bit parameters.
    options.device = device;
    options.fp32_view = device == "host";
    options.rank = rank;
    options.world_size = world_size;
    options.master_port = master_port;  // 0: from the environment
    options.optimizer_threads = optimizer_threads;
    if (!(timeout_s > 0)) throw StatusError(InvalidArgument("timeout_s must be > 0"));
    options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    engine_ = ValueOrThrow(WithoutGil([&] { return Engine::Create(config, options); }));
  }

  // `groups` (optional): each parameter's optimizer group (add_param_group's index; 0 for all
  // when empty). `trainable` (optional): false for each frozen parameter (all trainable when
  // empty).
  int RegisterModule(const std::string& name,
                     const std::vector<std::pair<std::string, std::vector<int64_t>>>& params,
                     const std::vector<int>& groups, const std::vector<bool>& trainable) {
    if ((!groups.empty() && groups.size() != params.size()) ||
        (!trainable.empty() && trainable.size() != params.size())) {
      throw StatusError(
          InvalidArgument("register_module: groups and trainable must have one entry a parameter"));
    }
    std::vector<ParamSpec> specs;
    std::vector<uint64_t> numel;
    for (const auto& [pname, shape] : params) {
      ParamSpec spec;
      spec.name = pname;
      spec.shape = shape;
      spec.optimizer_group = groups.empty() ? 0 : groups[specs.size()];
      spec.trainable = trainable.empty() || trainable[specs.size()];
      // zinf.zero overwrites every value with the module's own (SetParameter).
      spec.init = ParamInit::kZeros;
      uint64_t n = 1;
      for (int64_t d : shape) n *= d > 0 ? static_cast<uint64_t>(d) : 0;
      numel.push_back(n);
      specs.push_back(std::move(spec));
    }
    const int id = ValueOrThrow(engine_->RegisterModule(name, specs));
    if (static_cast<size_t>(id) >= numel_.size()) numel_.resize(id + 1);
    numel_[id] = std::move(numel);
    return id;
  }

  // A parameter group with the config's optimizer's hyper-parameters but those `hyper` names
  // (lr, weight_decay, betas, eps, bias_correction, lr_decay, initial_accumulator_value).
  int AddParamGroup(const std::map<std::string, py::object>& hyper) {
    OptimizerHyperParams hp = engine_->config().optimizer;
    for (const auto& [key, value] : hyper) {
      if (key == "betas") {
        std::tie(hp.beta1, hp.beta2) = value.cast<std::pair<double, double>>();
      } else if (key == "bias_correction") {
        hp.bias_correction = value.cast<bool>();
      } else {
        double* field = key == "lr"                          ? &hp.lr
                        : key == "weight_decay"              ? &hp.weight_decay
                        : key == "eps"                       ? &hp.eps
                        : key == "lr_decay"                  ? &hp.lr_decay
                        : key == "initial_accumulator_value" ? &hp.initial_accumulator_value
                                                             : nullptr;
        if (field == nullptr) {
          throw StatusError(
              InvalidArgument("add_param_group: unknown hyper-parameter '" + key + "'"));
        }
        *field = value.cast<double>();
      }
    }
    return ValueOrThrow(engine_->AddParamGroup(hp));
  }

  py::dict ParamGroup(int group) {
    const OptimizerHyperParams hp = ValueOrThrow(engine_->param_group(group));
    py::dict d;
    d["type"] = std::string(OptimizerTypeName(hp.type));
    d["lr"] = hp.lr;
    d["weight_decay"] = hp.weight_decay;
    d["betas"] = py::make_tuple(hp.beta1, hp.beta2);
    d["eps"] = hp.eps;
    d["bias_correction"] = hp.bias_correction;
    d["lr_decay"] = hp.lr_decay;
    d["initial_accumulator_value"] = hp.initial_accumulator_value;
    return d;
  }

  // `values` (optional): a callable (name, first, count, out) that writes elements
  // [first, first + count) of parameter `name` into `out`, a writable memoryview of count
  // floats valid during the call (zinf.zero hands over the model's values through it). An
  // exception it raises is raised from here, as it was.
  void Initialize(const py::object& values) {
    if (values.is_none()) {
      ThrowIfError(WithoutGil([&] { return engine_->Initialize(); }));
      return;
    }
    std::optional<py::error_already_set> raised;
    InitialValues source = [&](const std::string& name, uint64_t first, uint64_t count,
                               float* out) -> Status {
      py::gil_scoped_acquire gil;
      try {
        values(name, first, count,
               py::memoryview::from_memory(static_cast<void*>(out),
                                           static_cast<py::ssize_t>(count * sizeof(float)),
                                           /*readonly=*/false));
        return OkStatus();
      } catch (py::error_already_set& e) {
        raised.emplace(std::move(e));
        return Cancelled("the initial values raised a Python exception");
      }
    };
    Status s = WithoutGil([&] { return engine_->Initialize(source); });
    if (raised) throw std::move(*raised);
    ThrowIfError(std::move(s));
  }

  py::list Fetch(int module) {
    FetchedModule fetched = ValueOrThrow(WithoutGil([&] { return engine_->Fetch(module); }));
    return CachedViews(fetched_views_, module, fetched.params);
  }
  void Release(int module) { ThrowIfError(engine_->Release(module)); }
  // overwrite: the caller writes every element (GradientWrite::kOverwrite), so the buffers
  // come as they are; else zeros to add into.
  static GradientWrite Write(bool overwrite) {
    return overwrite ? GradientWrite::kOverwrite : GradientWrite::kAdd;
  }
  py::list Gradients(int module, bool overwrite) {
    std::vector<float*> grads = ValueOrThrow(engine_->Gradients(module, Write(overwrite)));
    return CachedViews(gradient_views_, module, grads);
  }
  void ReduceGradients(int module) {
    ThrowIfError(WithoutGil([&] { return engine_->ReduceGradients(module); }));
  }

  // ---- On a GPU (see the top of this file) ----
  py::list FetchOnStream(int module, uintptr_t stream) {
    Stream& on = Borrowed(stream);
    FetchedModule fetched = ValueOrThrow(WithoutGil([&]() -> StatusOr<FetchedModule> {
      ZINF_ASSIGN_OR_RETURN(FetchedModule f, engine_->Fetch(module));
      if (f.ready != nullptr) ZINF_RETURN_IF_ERROR(on.Wait(*f.ready));
      return f;
    }));
    return DeviceTensors(fetched.tensors);
  }
  void ReleaseOnStream(int module, uintptr_t stream) {
    ThrowIfError(engine_->Release(module, &RecordOn(stream)));
  }
  py::list GradientsOnDevice(int module, bool overwrite) {
    std::vector<float*> grads = ValueOrThrow(engine_->Gradients(module, Write(overwrite)));
    py::list out;
    for (size_t i = 0; i < grads.size(); ++i) {
      if (grads[i] == nullptr) {  // a frozen parameter's gradient: none
        out.append(py::none());
        continue;
      }
      out.append(py::make_tuple(reinterpret_cast<uintptr_t>(grads[i]), "float32",
                                numel_.at(module).at(i)));
    }
    return out;
  }
  void ReduceGradientsOnStream(int module, uintptr_t stream) {
    Event& ready = RecordOn(stream);
    ThrowIfError(WithoutGil([&] { return engine_->ReduceGradients(module, &ready); }));
  }

  py::dict Step() {
    StepSummary s = ValueOrThrow(WithoutGil([&] { return engine_->Step(); }));
    py::dict d;
    d["step"] = s.step;
    d["skipped"] = s.skipped;
    d["grad_norm"] = s.grad_norm;
    d["loss_scale"] = s.loss_scale;
    d["clip_coefficient"] = s.clip_coefficient;
    d["bytes_gathered"] = s.bytes_gathered;
    d["bytes_reduce_scattered"] = s.bytes_reduce_scattered;
    d["bytes_nvme_read"] = s.bytes_nvme_read;
    d["bytes_nvme_written"] = s.bytes_nvme_written;
    d["peak_live_parameters"] = s.peak_live_parameters;
    d["seconds_gather"] = s.seconds_gather;
    d["seconds_reduce"] = s.seconds_reduce;
    d["seconds_optimizer"] = s.seconds_optimizer;
    d["host_bytes"] = s.host_bytes;
    d["nvme_bytes"] = s.nvme_bytes;
    d["device_budget_bytes"] = s.device_budget_bytes;
    d["device_peak_bytes"] = s.device_peak_bytes;
    d["host_budget_bytes"] = s.host_budget_bytes;
    d["nvme_capacity_bytes"] = s.nvme_capacity_bytes;
    d["lr"] = s.learning_rate;
    d["time"] = s.unix_time_s;
    // The host's work around the device since the last step (zinf/engine.h, StepSummary).
    d["host_waits"] = s.host_waits;
    d["worker_waits"] = s.worker_waits;
    d["copies_down"] = s.copies_down;
    d["bytes_down"] = s.bytes_down;
    d["copies_up"] = s.copies_up;
    d["bytes_up"] = s.bytes_up;
    d["copies_on_device"] = s.copies_on_device;
    d["bytes_on_device"] = s.bytes_on_device;
    d["copies_host"] = s.copies_host;
    d["bytes_host"] = s.bytes_host;
    d["device_bytes_set"] = s.device_bytes_set;
    d["host_bytes_set"] = s.host_bytes_set;
    d["host_bytes_copied"] = s.host_bytes_copied;
    return d;
  }

  double MeanOverRanks(double value) {
    return ValueOrThrow(WithoutGil([&] { return engine_->MeanOverRanks(value); }));
  }
  py::bytes GatherParameter(const std::string& name) {
    std::vector<float> out;
    ThrowIfError(WithoutGil([&] { return engine_->GatherParameter(name, &out); }));
    return py::bytes(reinterpret_cast<const char*>(out.data()), out.size() * sizeof(float));
  }
  py::bytes GatherGradient(const std::string& name) {
    std::vector<float> out;
    ThrowIfError(WithoutGil([&] { return engine_->GatherGradient(name, &out); }));
    return py::bytes(reinterpret_cast<const char*>(out.data()), out.size() * sizeof(float));
  }
  void Broadcast(uintptr_t values, uint64_t count, int root_rank) {
    float* data = count > 0 ? static_cast<float*>(Pointer(values, "values")) : nullptr;
    ThrowIfError(WithoutGil([&] { return engine_->Broadcast(data, count, root_rank); }));
  }
  void SetParameter(const std::string& name, uintptr_t values, uint64_t count) {
    const float* data = static_cast<const float*>(Pointer(values, "values"));
    ThrowIfError(engine_->SetParameter(name, data, count));
  }
  void SetBuffer(const std::string& name, const std::string& dtype,
                 const std::vector<int64_t>& shape, uintptr_t data, uint64_t bytes) {
    const void* p = bytes > 0 ? Pointer(data, "data") : nullptr;
    ThrowIfError(engine_->SetBuffer(name, dtype, shape, p, bytes));
  }
  void GetBuffer(const std::string& name, uintptr_t out, uint64_t bytes) {
    void* p = bytes > 0 ? Pointer(out, "out") : nullptr;
    ThrowIfError(engine_->GetBuffer(name, p, bytes));
  }
  void SetCheckpointMetadata(const std::string& json_object) {
    ThrowIfError(engine_->SetCheckpointMetadata(json_object));
  }
  void SaveCheckpoint(const std::string& dir, const std::string& tag,
                      const std::string& client_state) {
    ThrowIfError(WithoutGil([&] { return engine_->SaveCheckpoint(dir, tag, client_state); }));
  }
  std::string LoadCheckpoint(const std::string& dir) {
    return ValueOrThrow(WithoutGil([&] { return engine_->LoadCheckpoint(dir); }));
  }

  Engine& engine() { return *engine_; }

 private:
  // torch's stream `handle` as a zinf Stream, borrowed once per handle.
  Stream& Borrowed(uintptr_t handle) {
    Device* device = engine_->compute_device();
    if (device == nullptr || device->kind() != DeviceKind::kCuda) {
      throw StatusError(FailedPrecondition("the engine's compute device is not a GPU"));
    }
    std::unique_ptr<Stream>& stream = borrowed_[handle];
    if (stream == nullptr) {
      stream = ValueOrThrow(device->BorrowStream(reinterpret_cast<void*>(handle)));
    }
    return *stream;
  }
  // The event of the work queued on `handle` so far. The engine's calls take it at once (its
  // streams wait on it then), so that one event serves every call.
  Event& RecordOn(uintptr_t handle) {
    Stream& stream = Borrowed(handle);
    if (done_ == nullptr) done_ = ValueOrThrow(engine_->compute_device()->CreateEvent());
    ThrowIfError(stream.Record(*done_));
    return *done_;
  }

  std::unique_ptr<Engine> engine_;
  std::vector<std::vector<uint64_t>> numel_;  // per module id, per parameter

  // The views Fetch or Gradients last gave for a module, with the memory they are over: a
  // module whose memory did not move gets the same list object again, for which zinf.zero
  // keeps the torch tensors it made (HostMemory), so a fetch makes none.
  struct ViewsOf {
    std::vector<float*> data;
    py::list views;
  };
  py::list CachedViews(std::vector<ViewsOf>& cache, int module, const std::vector<float*>& data) {
    if (static_cast<size_t>(module) >= cache.size()) cache.resize(module + 1);
    ViewsOf& cached = cache[module];
    if (cached.data != data || !cached.views) {
      cached.data = data;
      cached.views = Views(data, numel_.at(module));
    }
    return cached.views;
  }
  std::vector<ViewsOf> fetched_views_, gradient_views_;
  std::map<uintptr_t, std::unique_ptr<Stream>> borrowed_;
  std::unique_ptr<Event> done_;
};

}  // namespace

void BindEngine(py::module_& m) {
  py::class_<PyEngine>(m, "Engine", "zinf's ZeRO engine (zinf.zero.initialize uses it)")
      .def(py::init<const std::string&, int, int, int, double, const py::dict&, int,
                    const std::string&>(),
           py::arg("config_json"), py::arg("rank") = -1, py::arg("world_size") = -1,
           py::arg("optimizer_threads") = 0, py::arg("timeout_s") = 300.0,
           py::arg("trainer") = py::dict(), py::arg("master_port") = 0, py::arg("device") = "host")
      .def("register_module", &PyEngine::RegisterModule, py::arg("name"), py::arg("params"),
           py::arg("groups") = std::vector<int>(), py::arg("trainable") = std::vector<bool>())
      .def("add_param_group", &PyEngine::AddParamGroup, py::arg("hyper"))
      .def("param_group", &PyEngine::ParamGroup, py::arg("group"))
      .def_property_readonly("num_param_groups",
                             [](PyEngine& e) { return e.engine().num_param_groups(); })
      .def("set_group_learning_rate",
           [](PyEngine& e, int group, double lr) {
             ThrowIfError(e.engine().SetGroupLearningRate(group, lr));
           })
      .def("initialize", &PyEngine::Initialize, py::arg("values") = py::none())
      .def_property_readonly("parameters_resident",
                             [](PyEngine& e) { return e.engine().parameters_resident(); })
      .def("fetch", &PyEngine::Fetch, py::arg("module"))
      .def("release", &PyEngine::Release, py::arg("module"))
      .def("gradients", &PyEngine::Gradients, py::arg("module"), py::arg("overwrite") = false)
      .def("reduce_gradients", &PyEngine::ReduceGradients, py::arg("module"))
      .def("fetch_on_stream", &PyEngine::FetchOnStream, py::arg("module"), py::arg("stream"))
      .def("release_on_stream", &PyEngine::ReleaseOnStream, py::arg("module"), py::arg("stream"))
      .def("gradients_on_device", &PyEngine::GradientsOnDevice, py::arg("module"),
           py::arg("overwrite") = false)
      .def("reduce_gradients_on_stream", &PyEngine::ReduceGradientsOnStream, py::arg("module"),
           py::arg("stream"))
      .def_property_readonly("device", [](PyEngine& e) { return e.engine().compute_device_name(); })
      .def("step", &PyEngine::Step)
      .def("mean_over_ranks", &PyEngine::MeanOverRanks, py::arg("value"))
      .def("gather_parameter", &PyEngine::GatherParameter, py::arg("name"))
      .def("gather_gradient", &PyEngine::GatherGradient, py::arg("name"))
      .def("broadcast", &PyEngine::Broadcast, py::arg("values"), py::arg("count"),
           py::arg("root_rank"))
      .def("set_parameter", &PyEngine::SetParameter, py::arg("name"), py::arg("values"),
           py::arg("count"))
      .def("set_buffer", &PyEngine::SetBuffer, py::arg("name"), py::arg("dtype"), py::arg("shape"),
           py::arg("data"), py::arg("bytes"))
      .def("get_buffer", &PyEngine::GetBuffer, py::arg("name"), py::arg("out"), py::arg("bytes"))
      .def("set_checkpoint_metadata", &PyEngine::SetCheckpointMetadata, py::arg("json_object"))
      .def("save_checkpoint", &PyEngine::SaveCheckpoint, py::arg("dir"), py::arg("tag"),
           py::arg("client_state") = "{}")
      .def("load_checkpoint", &PyEngine::LoadCheckpoint, py::arg("dir"))
      .def_property_readonly("rank", [](PyEngine& e) { return e.engine().rank(); })
      .def_property_readonly("world_size", [](PyEngine& e) { return e.engine().world_size(); })
      .def_property_readonly("local_rank", [](PyEngine& e) { return e.engine().local_rank(); })
      .def_property_readonly("loss_scale", [](PyEngine& e) { return e.engine().loss_scale(); })
      .def_property_readonly("learning_rate",
                             [](PyEngine& e) { return e.engine().learning_rate(); })
      .def("set_learning_rate",
           [](PyEngine& e, double lr) { ThrowIfError(e.engine().SetLearningRate(lr)); })
      .def_property_readonly("micro_batch_size",
                             [](PyEngine& e) { return e.engine().config().micro_batch_size; })
      .def_property_readonly(
          "gradient_accumulation_steps",
          [](PyEngine& e) { return e.engine().config().gradient_accumulation_steps; })
      .def_property_readonly("train_batch_size",
                             [](PyEngine& e) { return e.engine().config().train_batch_size; })
      .def_property_readonly("resolved_config", [](PyEngine& e) {
        const EngineConfig& c = e.engine().config();
        py::dict d;
        d["zero_stage"] = c.zero_stage;
        d["fp16"] = c.fp16;
        d["bf16"] = c.bf16;
        d["gradient_clipping"] = c.gradient_clipping;
        d["layer_major"] = c.layer_major;
        d["stage3_param_persistence_threshold"] = c.stage3_param_persistence_threshold;
        return d;
      });
}

}  // namespace zinf::python
