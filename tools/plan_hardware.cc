// See tools/plan_hardware.h, Note [Plan on described hardware].
#include "tools/plan_hardware.h"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/config_reader.h"
#include "core/units.h"
#include "tools/plan_internal.h"

namespace zinf::plan {
namespace {

constexpr double kGiB = double(uint64_t{1} << 30);

// A figure that must be given and be a number > 0 (within `max`): the ConfigReader's checks
// allow 0 and say nothing of a missing key, so the hardware file's rules are here.
void Positive(ConfigReader& r, std::string_view key, double* out, double max = 1e18) {
  const nlohmann::json* v = r.Raw(key);
  const std::string path = r.path().empty() ? std::string(key) : r.path() + "." + std::string(key);
  if (v == nullptr) {
    r.Fail(InvalidArgument(fmt::format("{} is missing (a number > 0)", path)));
    return;
  }
  if (!v->is_number() || !(v->get<double>() > 0) || !(v->get<double>() <= max)) {
    r.Fail(InvalidArgument(
        fmt::format("{} must be a number in (0, {:g}], got {}", path, max, DescribeJson(*v))));
    return;
  }
  *out = v->get<double>();
}

void Count(ConfigReader& r, std::string_view key, int* out, bool required) {
  if (!required && !r.Has(key)) return;
  double v = 0;
  Positive(r, key, &v, 4096);
  if (v != std::floor(v)) {
    r.Fail(InvalidArgument(fmt::format("{}.{} must be a whole number, got {}", r.path(), key, v)));
  }
  *out = static_cast<int>(v);
}

// The directories that may hold shipped files of `kind`: beside the installed binary
// (bin/../share/zinf/KIND), then the source tree's (a build tree's binary).
std::vector<std::filesystem::path> ShippedDirs(std::string_view kind) {
  std::vector<std::filesystem::path> dirs;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) dirs.push_back(exe.parent_path().parent_path() / "share" / "zinf" / kind);
  dirs.push_back(std::filesystem::path(ZINF_SOURCE_DIR) / "tools" / kind);
  return dirs;
}

}  // namespace

double NodeHardware::nvme_read_Bps() const {
  double sum = 0;
  for (const Drive& d : nvme) sum += d.count * d.read_Bps;
  return sum;
}
double NodeHardware::nvme_write_Bps() const {
  double sum = 0;
  for (const Drive& d : nvme) sum += d.count * d.write_Bps;
  return sum;
}
uint64_t NodeHardware::nvme_bytes() const {
  uint64_t sum = 0;
  for (const Drive& d : nvme) sum += d.count * d.capacity_bytes;
  return sum;
}

StatusOr<NodeHardware> NodeHardware::FromJson(std::string_view text, const std::string& source) {
  const std::string what = fmt::format("hardware {}", source);
  ZINF_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(text, what, /*unique_keys=*/true));
  if (!j.is_object()) return InvalidArgument(fmt::format("{}: not a JSON object", what));
  if (!j.contains("zinf_hardware") || j["zinf_hardware"] != 1) {
    return InvalidArgument(fmt::format(
        "{}: no \"zinf_hardware\": 1 (a node description; see tools/plan_hardware.h)", what));
  }
  NodeHardware h;
  ConfigReader root(j, "");
  int64_t version = 1;
  root.Int("zinf_hardware", &version, 1, 1).String("name", &h.name).String("notes", &h.notes);
  double memory_GiB = 0, host_GiB = 0;
  if (!root.Has("gpus")) root.Fail(InvalidArgument("gpus is missing (an object)"));
  root.Object("gpus", [&](ConfigReader& g) {
    Count(g, "count", &h.gpus, true);
    Positive(g, "bf16_tflops", &h.gpu_flops, 1e6);
    if (g.Has("training_efficiency")) {
      Positive(g, "training_efficiency", &h.training_efficiency, 1);
    }
    Positive(g, "memory_GiB", &memory_GiB, 1e6);
    Positive(g, "h2d_GBps", &h.h2d_Bps, 1e4);
    Positive(g, "d2h_GBps", &h.d2h_Bps, 1e4);
    if (h.gpus > 1 || g.Has("peer_GBps")) Positive(g, "peer_GBps", &h.peer_Bps, 1e5);
  });
  if (!root.Has("host")) root.Fail(InvalidArgument("host is missing (an object)"));
  root.Object("host", [&](ConfigReader& g) {
    Positive(g, "memory_GiB", &host_GiB, 1e7);
    Positive(g, "memory_GBps", &h.host_memory_Bps, 1e5);
    Positive(g, "cpu_adam_params_per_s", &h.cpu_adam_params_per_s, 1e13);
  });
  if (const nlohmann::json* drives = root.Raw("nvme")) {
    if (!drives->is_array()) {
      root.Fail(InvalidArgument(
          fmt::format("nvme must be a list of drives, got {}", DescribeJson(*drives))));
    } else {
      for (size_t i = 0; i < drives->size(); ++i) {
        ConfigReader d((*drives)[i], fmt::format("nvme[{}]", i));
        Drive drive;
        double capacity_TB = 0;
        Count(d, "count", &drive.count, false);
        Positive(d, "read_GBps", &drive.read_Bps, 1e4);
        Positive(d, "write_GBps", &drive.write_Bps, 1e4);
        Positive(d, "capacity_TB", &capacity_TB, 1e4);
        drive.read_Bps *= 1e9;
        drive.write_Bps *= 1e9;
        drive.capacity_bytes = static_cast<uint64_t>(capacity_TB * 1e12);
        root.Fail(d.Finish());
        h.nvme.push_back(drive);
      }
    }
  }
  if (Status s = root.Finish(); !s.ok()) return s.WithContext(what);
  h.gpu_flops *= 1e12;
  h.gpu_memory_bytes = static_cast<uint64_t>(memory_GiB * kGiB);
  h.h2d_Bps *= 1e9;
  h.d2h_Bps *= 1e9;
  h.peer_Bps *= 1e9;
  h.host_memory_bytes = static_cast<uint64_t>(host_GiB * kGiB);
  h.host_memory_Bps *= 1e9;
  if (h.name.empty()) h.name = source;
  return h;
}

std::vector<std::string> ShippedNames(std::string_view kind) {
  std::vector<std::string> names;
  for (const std::filesystem::path& dir : ShippedDirs(kind)) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      if (entry.path().extension() == ".json") names.push_back(entry.path().stem().string());
    }
    if (!names.empty()) break;
  }
  std::sort(names.begin(), names.end());
  return names;
}

StatusOr<std::string> ResolveShipped(const std::string& name_or_path, std::string_view kind,
                                     std::string_view flag) {
  std::error_code ec;
  if (std::filesystem::exists(name_or_path, ec) || name_or_path.find('/') != std::string::npos ||
      name_or_path == "-") {
    return name_or_path;
  }
  for (const std::filesystem::path& dir : ShippedDirs(kind)) {
    const std::filesystem::path file = dir / (name_or_path + ".json");
    if (std::filesystem::is_regular_file(file, ec)) return file.string();
  }
  std::string names;
  for (const std::string& n : ShippedNames(kind)) names += (names.empty() ? "" : ", ") + n;
  return InvalidArgument(fmt::format("{} {}: no such file, nor a shipped {} description ({})", flag,
                                     name_or_path, kind, names.empty() ? "none installed" : names));
}

StatusOr<HardwareEstimate> EstimateOnHardware(const ModelSpec& spec, const EngineConfig& c,
                                              const NodeHardware& node, int world) {
  using namespace internal;
  if (world < 1 || world > node.gpus) {
    return InvalidArgument(
        fmt::format("--world-size must be in [1, {}] (the node's GPUs), got {}", node.gpus, world));
  }
  if (spec.fetch_flops.size() != spec.fetch_order.size()) {
    return Internal("plan: the model's fetch_flops and fetch_order differ in length");
  }
  ModelSpec model = spec;
  model.activation_bytes = spec.gpu_activation_bytes;
  HardwareEstimate out;
  Estimate& est = out.estimate;
  est.memory = EstimateMemory(model, c, world, /*fp32_view=*/false, node.nvme_bytes() / world);
  const MemoryEstimate& m = est.memory;
  const bool params_nvme = c.offload_param_device == OffloadDevice::kNvme;
  const bool optim_nvme = c.offload_optimizer_device == OffloadDevice::kNvme;
  const uint64_t ranks = static_cast<uint64_t>(world);

  // Fits: the GPU holds the device tier and the activations; the host the rest, every rank's.
  std::vector<std::string> why;
  if (m.peak_device + m.activations > node.gpu_memory_bytes) {
    why.push_back(fmt::format("GPU: needs {} of {}", FormatBytes(m.peak_device + m.activations),
                              FormatBytes(node.gpu_memory_bytes)));
  }
  if (m.peak_host * ranks > node.host_memory_bytes) {
    why.push_back(fmt::format("memory: needs {} of {}", FormatBytes(m.peak_host * ranks),
                              FormatBytes(node.host_memory_bytes)));
  }
  if ((params_nvme || optim_nvme) && m.nvme * ranks > node.nvme_bytes()) {
    why.push_back(fmt::format("NVMe: needs {} of {}", FormatBytes(m.nvme * ranks),
                              FormatBytes(node.nvme_bytes())));
  }
  est.fits = why.empty();
  for (size_t i = 0; i < why.size(); ++i) est.why += (i ? "; " : "") + why[i];

  const Layout l = LayOut(model, c, world, /*fp32_view=*/false);
  const uint64_t e = ElementBytes(c);
  const double S = static_cast<double>(l.shard_elements);
  const double total = static_cast<double>(l.total);
  const double gas = c.gradient_accumulation_steps;
  const double passes = c.ReductionsPerStep();  // reductions per step (zinf.layer_major: 1)
  const double w = world;
  TimeEstimate& t = est.time;
  // Compute: the matmuls at the share of the peak that training sustains end to end; fp32 at
  // half the 16-bit rate (TF32 tensor cores).
  const double precision = c.bf16 || c.fp16 ? 1.0 : 0.5;
  t.compute = gas * model.matmul_flops_per_micro_batch /
              (node.gpu_flops * node.training_efficiency * precision);
  // The lanes beside the compute, per step.
  const CacheSim sim = SimulateCache(model, c, world, l, m.device_budget);
  double missed = 0, gathered = 0;
  for (size_t i = 0; i < sim.order.size(); ++i) {
    missed += static_cast<double>(sim.miss[i]);
    gathered += static_cast<double>(ShardBytes(l.modules[sim.order[i]], e)) * w;
  }
  const double drives_read = node.nvme_read_Bps() / w, drives_write = node.nvme_write_Bps() / w;
  const double h2d = c.offload_param_device == OffloadDevice::kNone ? 0.0 : missed / node.h2d_Bps;
  const double d2h = passes * S * 4 / node.d2h_Bps;  // the reduced fp32 gradient shard
  const double peer =
      world > 1 ? (gathered + passes * total * 4) * (w - 1) / w / node.peer_Bps : 0.0;
  double nvme_during = params_nvme ? SafeDiv(missed, drives_read) : 0.0;
  double read = 0, written = 0;  // the optimizer's NVMe pass
  if (optim_nvme) {
    const double on_nvme = S * c.optimizer_nvme_ratio;
    read = on_nvme * 12;
    written = on_nvme * 12;
    if (c.gradients_on_nvme) {
      read += on_nvme * 4;
      // Written each micro-batch and read back from the second on, during backward.
      nvme_during += SafeDiv(on_nvme * 4 * passes, drives_write) +
                     SafeDiv(on_nvme * 4 * (passes - 1), drives_read);
      t.nvme_read += static_cast<uint64_t>(on_nvme * 4 * (passes - 1));
      t.nvme_written += static_cast<uint64_t>(on_nvme * 4 * passes);
    }
  }
  const double forward_backward = std::max({t.compute, h2d, d2h, peer, nvme_during});
  // The optimizer step: CPU Adam on the rank's share of the node (the engine's optimizer state
  // is in host memory whatever the placement), beside its NVMe pass; then the new parameters
  // to their tier.
  const double update = S / (node.cpu_adam_params_per_s / w);
  const double pass = SafeDiv(read, drives_read) + SafeDiv(written, drives_write);
  const double write_back = c.offload_param_device == OffloadDevice::kNone ? S * e / node.h2d_Bps
                            : params_nvme ? SafeDiv(S * e, drives_write)
                                          : S * (4.0 + e) / node.host_memory_Bps;
  t.gather = forward_backward - t.compute;
  t.optimizer = update + (params_nvme ? 0.0 : write_back);
  t.nvme = std::max(0.0, pass - update) + (params_nvme ? write_back : 0.0);
  t.step = t.compute + t.gather + t.reduce + t.optimizer + t.nvme;
  t.bytes_gathered = static_cast<uint64_t>(gathered);
  t.nvme_read += static_cast<uint64_t>(read + (params_nvme ? missed : 0.0));
  t.nvme_written += static_cast<uint64_t>(written + (params_nvme ? S * e : 0.0));

  out.tokens_per_step = gas * model.tokens_per_micro_batch;
  const double offload = std::max({h2d, d2h, peer, nvme_during}) + t.optimizer + t.nvme;
  out.hide_tokens = SafeDiv(offload, SafeDiv(t.compute, out.tokens_per_step));
  out.model_tflops =
      SafeDiv(8.0 * static_cast<double>(model.parameter_count()) * out.tokens_per_step, t.step) /
      1e12;
  return out;
}

}  // namespace zinf::plan
