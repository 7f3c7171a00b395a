// The placements the plan compares, their names, and the DeepSpeed configs it writes.
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "core/config_reader.h"
#include "tools/plan_model.h"

namespace zinf::plan {

std::vector<EngineConfig> Placements(const EngineConfig& base, const std::string& nvme_path) {
  std::vector<EngineConfig> out;
  const OffloadDevice devices[] = {OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme};
  for (int precision = 0; precision < 3; ++precision) {
    for (OffloadDevice param : devices) {
      for (int optim = 0; optim < 5; ++optim) {
        EngineConfig c = base;
        c.zero_stage = 3;
        c.warnings.clear();
        c.bf16 = precision == 1;
        c.fp16 = precision == 2;
        c.offload_param_device = param;
        c.offload_optimizer_device = optim == 0   ? OffloadDevice::kNone
                                     : optim == 1 ? OffloadDevice::kCpu
                                                  : OffloadDevice::kNvme;
        c.optimizer_nvme_ratio = optim == 3 ? 0.5 : 1.0;
        // The gradients' tier: host memory, or with the optimizer on NVMe, NVMe too.
        c.gradients_on_nvme = optim == 4;
        // DPU is for an optimizer in host memory; on NVMe the step overlaps backward instead.
        if (optim >= 2) c.delayed_param_update = false;
        c.offload_param_nvme_path.clear();
        c.offload_optimizer_nvme_path.clear();
        if (param == OffloadDevice::kNvme) c.offload_param_nvme_path = {nvme_path};
        if (optim >= 2) c.offload_optimizer_nvme_path = {nvme_path};
        out.push_back(std::move(c));
      }
    }
  }
  return out;
}

std::string PlacementName(const EngineConfig& c) {
  std::string optim(OffloadDeviceName(c.offload_optimizer_device));
  if (c.offload_optimizer_device == OffloadDevice::kNvme && c.optimizer_nvme_ratio < 1.0) {
    optim += fmt::format(" {:g}", c.optimizer_nvme_ratio);
  }
  const bool grads_nvme = c.gradients_on_nvme && c.offload_optimizer_device == OffloadDevice::kNvme;
  return fmt::format("param {}, optim {}{}, {}", OffloadDeviceName(c.offload_param_device), optim,
                     grads_nvme ? ", grads nvme" : "",
                     c.bf16   ? "bf16"
                     : c.fp16 ? "fp16"
                              : "fp32");
}

StatusOr<std::string> DeepSpeedJson(const EngineConfig& c, std::string_view base_json) {
  ZINF_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(base_json, "the base config"));
  if (!j.is_object()) return InvalidArgument("the base config is not a JSON object");
  j.erase("model");
  nlohmann::json& zero = j["zero_optimization"];
  if (!zero.is_object()) zero = nlohmann::json::object();
  zero["stage"] = c.zero_stage;
  auto offload = [&](const char* key, OffloadDevice device, const std::vector<std::string>& paths) {
    nlohmann::json& o = zero[key];
    if (!o.is_object()) o = nlohmann::json::object();
    o["device"] = std::string(OffloadDeviceName(device));
    if (device == OffloadDevice::kNvme) {
      o["nvme_path"] = paths.size() == 1 ? nlohmann::json(paths[0]) : nlohmann::json(paths);
    } else {
      o.erase("nvme_path");
    }
  };
  offload("offload_param", c.offload_param_device, c.offload_param_nvme_path);
  offload("offload_optimizer", c.offload_optimizer_device, c.offload_optimizer_nvme_path);
  j["bf16"] = {{"enabled", c.bf16}};
  if (c.fp16) {
    if (!j.contains("fp16") || !j["fp16"].is_object()) j["fp16"] = nlohmann::json::object();
    j["fp16"]["enabled"] = true;
  } else {
    j.erase("fp16");
  }
  if (!j.contains("zinf") || !j["zinf"].is_object()) j["zinf"] = nlohmann::json::object();
  if (c.offload_optimizer_device == OffloadDevice::kNvme) {
    j["zinf"]["optimizer_nvme_ratio"] = c.optimizer_nvme_ratio;
    j["zinf"]["gradients_on_nvme"] = c.gradients_on_nvme;
    j["zinf"].erase("delayed_param_update");
  } else {
    j["zinf"].erase("optimizer_nvme_ratio");
    j["zinf"].erase("gradients_on_nvme");
  }
  if (j["zinf"].empty()) j.erase("zinf");
  return j.dump(2) + "\n";
}

}  // namespace zinf::plan
