// The machine profile `zinf bench profile` writes, as the plan reads it.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <tuple>

#include "core/config_reader.h"
#include "tools/plan_internal.h"
#include "tools/plan_model.h"

namespace zinf::plan {

using internal::InterpolateInLog;

StatusOr<MachineProfile> MachineProfile::FromJson(std::string_view text,
                                                  const std::string& source) {
  ZINF_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(text, fmt::format("profile {}", source)));
  if (!j.is_object()) return InvalidArgument(fmt::format("profile {}: not a JSON object", source));
  if (!j.contains("zinf_profile") || j["zinf_profile"] != 1) {
    return InvalidArgument(fmt::format(
        "profile {}: no \"zinf_profile\": 1 (write one with `zinf bench profile --out FILE`)",
        source));
  }
  MachineProfile p;
  // A figure at `path` (dot-separated): a finite number >= 0; null or absent is 0 when
  // `optional`.
  auto number = [&](const nlohmann::json& at, const std::string& path, bool optional,
                    double* out) -> Status {
    const nlohmann::json* v = &at;
    size_t start = 0;
    while (start <= path.size()) {
      size_t dot = path.find('.', start);
      if (dot == std::string::npos) dot = path.size();
      const std::string key = path.substr(start, dot - start);
      if (!v->is_object() || !v->contains(key) || (*v)[key].is_null()) {
        if (optional) {
          *out = 0;
          return OkStatus();
        }
        return InvalidArgument(fmt::format("profile {}: {} is missing", source, path));
      }
      v = &(*v)[key];
      start = dot + 1;
    }
    if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() < 0) {
      return InvalidArgument(
          fmt::format("profile {}: {} must be a number >= 0, got {}", source, path, v->dump()));
    }
    *out = v->get<double>();
    return OkStatus();
  };
  double x = 0;
  ZINF_RETURN_IF_ERROR(number(j, "machine.cores", false, &x));
  p.cores = std::max(1, static_cast<int>(x));
  ZINF_RETURN_IF_ERROR(number(j, "machine.memory_bytes", false, &x));
  p.memory_bytes = static_cast<uint64_t>(x);
  ZINF_RETURN_IF_ERROR(number(j, "machine.gpu_memory_bytes", true, &x));
  p.gpu_memory_bytes = static_cast<uint64_t>(x);
  ZINF_RETURN_IF_ERROR(number(j, "nvme.free_bytes", true, &x));
  p.nvme_free_bytes = static_cast<uint64_t>(x);
  ZINF_RETURN_IF_ERROR(number(j, "nvme.read_MBps", true, &p.nvme_read_Bps));
  ZINF_RETURN_IF_ERROR(number(j, "nvme.write_MBps", true, &p.nvme_write_Bps));
  ZINF_RETURN_IF_ERROR(number(j, "nvme.mixed_MBps", true, &p.nvme_mixed_Bps));
  ZINF_RETURN_IF_ERROR(number(j, "nvme.size_bytes", true, &x));
  p.nvme_measured_bytes = static_cast<uint64_t>(x);
  p.nvme_read_Bps *= 1e6;
  p.nvme_write_Bps *= 1e6;
  p.nvme_mixed_Bps *= 1e6;
  ZINF_RETURN_IF_ERROR(number(j, "nvme.read_latency_us", true, &p.nvme_read_latency_s));
  ZINF_RETURN_IF_ERROR(number(j, "nvme.write_latency_us", true, &p.nvme_write_latency_s));
  p.nvme_read_latency_s *= 1e-6;
  p.nvme_write_latency_s *= 1e-6;
  if (j.contains("nvme") && j["nvme"].is_object() && j["nvme"].contains("paths")) {
    for (const auto& path : j["nvme"]["paths"]) {
      if (!path.is_string()) {
        return InvalidArgument(fmt::format("profile {}: nvme.paths must be strings", source));
      }
      p.nvme_paths.push_back(path.get<std::string>());
    }
  }
  ZINF_RETURN_IF_ERROR(number(j, "memory_GBps", false, &p.memory_Bps));
  p.memory_Bps *= 1e9;
  ZINF_RETURN_IF_ERROR(number(j, "link.h2d_GBps", true, &p.h2d_Bps));
  ZINF_RETURN_IF_ERROR(number(j, "link.d2h_GBps", true, &p.d2h_Bps));
  p.h2d_Bps *= 1e9;
  p.d2h_Bps *= 1e9;
  if (!j.contains("cpu_optimizer") || !j["cpu_optimizer"].is_array() ||
      j["cpu_optimizer"].empty()) {
    return InvalidArgument(
        fmt::format("profile {}: cpu_optimizer must be a non-empty array", source));
  }
  for (const auto& row : j["cpu_optimizer"]) {
    OptimizerRow r;
    ZINF_RETURN_IF_ERROR(number(row, "threads", false, &x));
    r.threads = static_cast<int>(x);
    ZINF_RETURN_IF_ERROR(number(row, "params_per_s", false, &r.params_per_s));
    p.optimizer.push_back(r);
  }
  if (!j.contains("matmul") || !j["matmul"].is_array() || j["matmul"].empty()) {
    return InvalidArgument(fmt::format("profile {}: matmul must be a non-empty array", source));
  }
  for (const auto& row : j["matmul"]) {
    MatmulRow r;
    ZINF_RETURN_IF_ERROR(number(row, "threads", false, &x));
    r.threads = static_cast<int>(x);
    ZINF_RETURN_IF_ERROR(number(row, "d", true, &r.d));
    if (row.contains("tokens")) ZINF_RETURN_IF_ERROR(number(row, "tokens", false, &r.tokens));
    ZINF_RETURN_IF_ERROR(number(row, "fp32_GFLOPs", true, &r.fp32_flops));
    ZINF_RETURN_IF_ERROR(number(row, "bf16_GFLOPs", true, &r.bf16_flops));
    r.fp32_flops *= 1e9;
    r.bf16_flops *= 1e9;
    p.matmul.push_back(r);
  }
  if (j.contains("kernel_call")) {
    if (!j["kernel_call"].is_array()) {
      return InvalidArgument(fmt::format("profile {}: kernel_call must be an array", source));
    }
    for (const auto& row : j["kernel_call"]) {
      CallRow r;
      ZINF_RETURN_IF_ERROR(number(row, "threads", false, &x));
      r.threads = static_cast<int>(x);
      ZINF_RETURN_IF_ERROR(number(row, "us", false, &r.seconds));
      ZINF_RETURN_IF_ERROR(number(row, "attention_GFLOPs", true, &r.attention_flops));
      ZINF_RETURN_IF_ERROR(number(row, "gelu_forward_Gelem_per_s", true, &r.gelu_forward_per_s));
      ZINF_RETURN_IF_ERROR(number(row, "gelu_backward_Gelem_per_s", true, &r.gelu_backward_per_s));
      r.attention_flops *= 1e9;
      r.gelu_forward_per_s *= 1e9;
      r.gelu_backward_per_s *= 1e9;
      r.seconds *= 1e-6;
      p.kernel_call.push_back(r);
    }
    std::sort(p.kernel_call.begin(), p.kernel_call.end(),
              [](const auto& a, const auto& b) { return a.threads < b.threads; });
  }
  ZINF_RETURN_IF_ERROR(number(j, "exp_per_s", true, &p.exp_per_s));
  ZINF_RETURN_IF_ERROR(number(j, "loop_fp32_GFLOPs", false, &p.loop_fp32_flops));
  p.loop_fp32_flops *= 1e9;
  ZINF_RETURN_IF_ERROR(number(j, "collective.latency_us", true, &p.collective_latency_s));
  p.collective_latency_s *= 1e-6;
  ZINF_RETURN_IF_ERROR(number(j, "collective.allgather_GBps", true, &p.allgather_Bps));
  ZINF_RETURN_IF_ERROR(number(j, "collective.reduce_scatter_GBps", true, &p.reduce_scatter_Bps));
  p.allgather_Bps *= 1e9;
  p.reduce_scatter_Bps *= 1e9;
  ZINF_RETURN_IF_ERROR(number(j, "collective.cpu_us_per_collective", true, &p.collective_cpu_s));
  ZINF_RETURN_IF_ERROR(number(j, "collective.cpu_ns_per_byte", true, &p.collective_cpu_s_per_byte));
  p.collective_cpu_s *= 1e-6;
  p.collective_cpu_s_per_byte *= 1e-9;
  if (j.contains("collective") && j["collective"].is_object() &&
      j["collective"].contains("loaded")) {
    const nlohmann::json& rows = j["collective"]["loaded"];
    if (!rows.is_array()) {
      return InvalidArgument(fmt::format("profile {}: collective.loaded must be an array", source));
    }
    for (const auto& row : rows) {
      LoadedWaitRow r;
      ZINF_RETURN_IF_ERROR(number(row, "compute_us", false, &r.compute_s));
      ZINF_RETURN_IF_ERROR(number(row, "wait_us", false, &r.wait_s));
      ZINF_RETURN_IF_ERROR(number(row, "step_us", false, &r.step_s));
      r.compute_s *= 1e-6;
      r.wait_s *= 1e-6;
      r.step_s *= 1e-6;
      p.loaded_wait.push_back(r);
    }
    std::sort(p.loaded_wait.begin(), p.loaded_wait.end(),
              [](const auto& a, const auto& b) { return a.compute_s < b.compute_s; });
  }
  double shards = 0;
  ZINF_RETURN_IF_ERROR(number(j, "collective.loaded_writes.shards", true, &shards));
  if (shards > 0) {
    double memory_step = 0, nvme_step = 0;
    ZINF_RETURN_IF_ERROR(number(j, "collective.loaded_writes.memory_step_us", false, &memory_step));
    ZINF_RETURN_IF_ERROR(number(j, "collective.loaded_writes.nvme_step_us", false, &nvme_step));
    p.loaded_shard_write_s = std::max(0.0, nvme_step - memory_step) / shards * 1e-6;
  }
  std::sort(p.optimizer.begin(), p.optimizer.end(),
            [](const auto& a, const auto& b) { return a.threads < b.threads; });
  std::sort(p.matmul.begin(), p.matmul.end(), [](const auto& a, const auto& b) {
    return std::tie(a.threads, a.tokens, a.d) < std::tie(b.threads, b.tokens, b.d);
  });
  return p;
}

double MachineProfile::LoadedWait(double compute_s, double LoadedWaitRow::*figure) const {
  if (loaded_wait.empty()) return 0;
  if (compute_s <= 0) return loaded_wait.front().*figure;
  return InterpolateInLog(
      loaded_wait, std::log(compute_s),
      [](const LoadedWaitRow& r) { return std::log(r.compute_s); },
      [figure](const LoadedWaitRow& r) { return r.*figure; });
}

double MachineProfile::OptimizerRate(int threads) const {
  double rate = optimizer.front().params_per_s;
  for (const auto& r : optimizer) {
    if (r.threads <= threads) rate = r.params_per_s;
  }
  return rate;
}

const MachineProfile::CallRow& MachineProfile::KernelCall(int threads) const {
  static const CallRow kNone;
  const CallRow* use = kernel_call.empty() ? &kNone : &kernel_call.front();
  for (const auto& r : kernel_call) {
    if (r.threads <= threads) use = &r;
  }
  return *use;
}

double MachineProfile::MatmulRate(int threads, bool bf16, double d, double tokens) const {
  int use = matmul.front().threads;
  for (const auto& r : matmul) {
    if (r.threads <= threads) use = r.threads;
  }
  // The tokens measured at `use` threads, ascending (the rows are sorted).
  std::vector<double> measured;
  for (const auto& r : matmul) {
    if (r.threads == use && (measured.empty() || measured.back() != r.tokens)) {
      measured.push_back(r.tokens);
    }
  }
  auto log_x = [](const auto& row) { return row.first; };
  auto y = [](const auto& row) { return row.second; };
  // The rate at `d` among the rows of `t` tokens, interpolated in log d.
  auto at_d = [&](double t) {
    std::vector<std::pair<double, double>> by_d;  // (log d, rate)
    for (const auto& r : matmul) {
      if (r.threads != use || r.tokens != t) continue;
      const double rate = bf16 && r.bf16_flops > 0 ? r.bf16_flops : r.fp32_flops;
      by_d.emplace_back(r.d > 0 ? std::log(r.d) : 0.0, rate);
    }
    if (by_d.size() == 1 || d <= 0) return by_d.back().second;
    return InterpolateInLog(by_d, std::log(d), log_x, y);
  };
  if (measured.size() == 1 || tokens <= 0) return at_d(measured.back());
  std::vector<std::pair<double, double>> by_tokens;  // (log tokens, rate at d)
  for (double t : measured) by_tokens.emplace_back(std::log(t), at_d(t));
  return InterpolateInLog(by_tokens, std::log(tokens), log_x, y);
}

}  // namespace zinf::plan
