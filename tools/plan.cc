// `zinf plan`: for a model (a GPT or MLP example config, a shipped GPT-like shape, or --params N)
// and a machine profile (`zinf bench profile`) or a described node (--hardware), every stage-3
// placement's bytes per tier per rank, whether it fits, and its predicted step time split into
// compute, gather, reduce, optimizer and NVMe (on described GPUs also the model TFLOPS per GPU and
// the tokens per step that hide the offload); the fastest placement that fits is marked and can
// be written as a DeepSpeed config. The models behind the figures are tools/plan_model.h (Note
// [Plan memory], Note [Plan time]) and tools/plan_hardware.h (Note [Plan on described hardware]).
//
// Single-threaded.
#include <fmt/core.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/units.h"
#include "nvme/path_probe.h"
#include "tools/commands.h"
#include "tools/plan_hardware.h"
#include "tools/plan_model.h"
#include "tools/plot.h"
#include "zinf/cpu_info.h"
#include "zinf/input_file.h"

namespace zinf::tools {
namespace {

struct PlanArgs {
  std::string model;
  std::string params;  // --params N (K, M, G: powers of 1000 here? see ParseCount)
  int layers = -1;     // --params: modules (default 24); MLP: layers (default 4)
  int width = 1024;    // MLP
  int64_t tokens = 2048;
  std::string profile;
  std::string hardware;
  int world_size = 1;
  bool world_size_given = false;  // else: the described node's GPUs, or 1
  int threads = 0;
  std::string memory, gpu_memory, nvme_free;
  std::string nvme_path;
  std::string write_config;
  std::string plot;  // PNG; empty: none
  bool json = false;
  bool clipped = false;
};

// A count of parameters: digits with an optional K, M, G, T (powers of 1000: "1.3B" as B too).
StatusOr<uint64_t> ParseCount(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || errno != 0 || !(v > 0) || !std::isfinite(v)) {
    return InvalidArgument(
        fmt::format("--params must be a positive count such as 350M or 1.3B, got \"{}\"", text));
  }
  std::string suffix(end);
  double scale = 1;
  if (suffix == "K" || suffix == "k")
    scale = 1e3;
  else if (suffix == "M")
    scale = 1e6;
  else if (suffix == "B" || suffix == "G")
    scale = 1e9;
  else if (suffix == "T")
    scale = 1e12;
  else if (!suffix.empty()) {
    return InvalidArgument(
        fmt::format("--params: unknown suffix \"{}\" in \"{}\" (K, M, B/G, T)", suffix, text));
  }
  const double n = v * scale;
  if (n < 1 || n > 1e15) {
    return InvalidArgument(fmt::format("--params must be in [1, 1e15], got {}", text));
  }
  return static_cast<uint64_t>(n);
}

StatusOr<uint64_t> OptionalBytes(const std::string& text, const char* flag) {
  if (text.empty()) return uint64_t{0};
  StatusOr<uint64_t> b = ParseBytes(text);
  if (!b.ok()) return b.status().WithContext(flag);
  if (*b == 0) return InvalidArgument(fmt::format("{} must be > 0", flag));
  return b;
}

std::string Seconds(double s) {
  if (s <= 0) return "0";
  if (s < 0.01) return fmt::format("{:.1f}ms", s * 1e3);
  if (s < 10) return fmt::format("{:.3f}", s);
  return fmt::format("{:.1f}", s);
}

Status RunPlan(PlanArgs args) {
  if (args.model.empty() == args.params.empty()) {
    return InvalidArgument("give one of --model CONFIG and --params N");
  }
  if (!args.profile.empty() && !args.hardware.empty()) {
    return InvalidArgument("give one of --profile FILE and --hardware NODE");
  }
  std::optional<plan::NodeHardware> node;
  if (!args.hardware.empty()) {
    ZINF_ASSIGN_OR_RETURN(std::string path,
                          plan::ResolveShipped(args.hardware, "hardware", "--hardware"));
    ZINF_ASSIGN_OR_RETURN(std::string text, ReadInputFile(path, "--hardware"));
    ZINF_ASSIGN_OR_RETURN(node, plan::NodeHardware::FromJson(text, path));
    if (!args.world_size_given) args.world_size = node->gpus;
  }
  if (args.world_size < 1) {
    return InvalidArgument(fmt::format("--world-size must be >= 1, got {}", args.world_size));
  }
  const bool have_times = !args.profile.empty() || node.has_value();
  if (!args.plot.empty()) {
    if (!have_times) return InvalidArgument("--plot needs --profile or --hardware: it plots times");
    ZINF_RETURN_IF_ERROR(CheckPlotOutput(args.plot));
  }
  plan::ModelSpec model;
  EngineConfig base;
  std::string base_json = "{}";
  if (!args.model.empty()) {
    ZINF_ASSIGN_OR_RETURN(std::string path, plan::ResolveShipped(args.model, "models", "--model"));
    ZINF_ASSIGN_OR_RETURN(base_json, ReadInputFile(path, "--model"));
    ZINF_ASSIGN_OR_RETURN(
        plan::ConfigModel cm,
        plan::ModelFromConfigText(base_json, path, args.layers > 0 ? args.layers : 4, args.width,
                                  args.world_size));
    model = std::move(cm.model);
    base = std::move(cm.config);
  } else {
    ZINF_ASSIGN_OR_RETURN(uint64_t n, ParseCount(args.params));
    if (args.tokens < 1)
      return InvalidArgument(fmt::format("--tokens must be >= 1, got {}", args.tokens));
    ZINF_ASSIGN_OR_RETURN(model, plan::UniformModel(n, args.layers > 0 ? args.layers : 24,
                                                    static_cast<uint64_t>(args.tokens)));
  }
  if (args.layers == 0 || args.layers < -1) {
    return InvalidArgument(fmt::format("--layers must be >= 1, got {}", args.layers));
  }

  plan::MachineProfile profile;
  const bool have_profile = !args.profile.empty();
  if (node) {
    // For the table's heading and the NVMe path only: the node's figures plan it.
    profile.memory_bytes = node->host_memory_bytes;
    profile.gpu_memory_bytes = node->gpu_memory_bytes;
    profile.nvme_free_bytes = node->nvme_bytes();
  } else if (have_profile) {
    ZINF_ASSIGN_OR_RETURN(std::string text, ReadInputFile(args.profile, "--profile"));
    ZINF_ASSIGN_OR_RETURN(profile, plan::MachineProfile::FromJson(text, args.profile));
  } else {
    // Memory only: this machine's sizes, no rates.
    profile.cores = std::max(1, GetCpuInfo().usable_cpus);
    profile.memory_bytes = GetCpuInfo().total_memory_bytes;
  }
  plan::PlanOptions options;
  options.world_size = args.world_size;
  options.threads = args.threads;
  options.sizes_only = !have_profile;
  options.clipped = args.clipped;
  ZINF_ASSIGN_OR_RETURN(options.memory_bytes, OptionalBytes(args.memory, "--memory"));
  ZINF_ASSIGN_OR_RETURN(options.gpu_memory_bytes, OptionalBytes(args.gpu_memory, "--gpu-memory"));
  ZINF_ASSIGN_OR_RETURN(options.nvme_free_bytes, OptionalBytes(args.nvme_free, "--nvme-free"));
  std::string nvme_path = args.nvme_path;
  if (nvme_path.empty() && !profile.nvme_paths.empty()) nvme_path = profile.nvme_paths.front();
  if (nvme_path.empty()) nvme_path = "/local_nvme";
  if (!node && options.nvme_free_bytes == 0 && profile.nvme_free_bytes == 0) {
    StatusOr<uint64_t> free = FreeBytes(args.nvme_path.empty() ? "." : args.nvme_path);
    if (free.ok()) profile.nvme_free_bytes = *free;
  }

  if (node && (options.memory_bytes || options.gpu_memory_bytes || options.nvme_free_bytes ||
               args.threads || args.clipped)) {
    return InvalidArgument(
        "--hardware describes the node: --memory, --gpu-memory, --nvme-free, --threads and "
        "--clipped are for a measured profile");
  }
  struct Row {
    EngineConfig config;
    plan::Estimate estimate;
    double hide_tokens = 0, model_tflops = 0, tokens_per_step = 0;
  };
  std::vector<Row> rows;
  int best = -1;
  for (EngineConfig& c : plan::Placements(base, nvme_path)) {
    if (node) {
      ZINF_ASSIGN_OR_RETURN(plan::HardwareEstimate h,
                            plan::EstimateOnHardware(model, c, *node, args.world_size));
      rows.push_back(
          {std::move(c), std::move(h.estimate), h.hide_tokens, h.model_tflops, h.tokens_per_step});
    } else {
      ZINF_ASSIGN_OR_RETURN(plan::Estimate e, plan::EstimatePlacement(model, c, profile, options));
      rows.push_back({std::move(c), std::move(e)});
    }
    const Row& r = rows.back();
    if (r.estimate.fits && have_times &&
        (best < 0 || r.estimate.time.step < rows[best].estimate.time.step)) {
      best = static_cast<int>(rows.size()) - 1;
    }
  }

  // Rates measured on a smaller file than the placement's swap space may be a cache's
  // (bench/RESULTS.md, issue 35: a virtio disk at 3 GB/s on 4 GiB, 0.5-1 GB/s on 48 GiB).
  auto beyond_measured = [&](const Row& r) {
    return have_profile && profile.nvme_measured_bytes > 0 &&
           r.estimate.memory.nvme * static_cast<uint64_t>(args.world_size) >
               profile.nvme_measured_bytes;
  };
  if (args.json) {
    nlohmann::json out = {{"model", model.description},
                          {"parameters", model.parameter_count()},
                          {"world_size", args.world_size},
                          {"profile", have_profile ? nlohmann::json(args.profile) : nullptr},
                          {"hardware", node ? nlohmann::json(node->name) : nullptr}};
    nlohmann::json list = nlohmann::json::array();
    for (const Row& r : rows) {
      const plan::MemoryEstimate& m = r.estimate.memory;
      const plan::TimeEstimate& t = r.estimate.time;
      nlohmann::json row = {
          {"placement", plan::PlacementName(r.config)},
          {"offload_param", OffloadDeviceName(r.config.offload_param_device)},
          {"offload_optimizer", OffloadDeviceName(r.config.offload_optimizer_device)},
          {"optimizer_nvme_ratio", r.config.optimizer_nvme_ratio},
          {"precision", r.config.bf16   ? "bf16"
                        : r.config.fp16 ? "fp16"
                                        : "fp32"},
          {"gradients",
           r.config.gradients_on_nvme && r.config.offload_optimizer_device == OffloadDevice::kNvme
               ? "nvme"
               : "host"},
          {"steady_host_bytes", m.steady_host()},
          {"peak_device_bytes", m.peak_device},
          {"peak_host_bytes", m.peak_host},
          {"activation_bytes", m.activations},
          {"nvme_bytes", m.nvme},
          {"optimizer_chunks", m.optimizer_chunks},
          {"speculative_chunks", m.speculative_chunks},
          {"nvme_beyond_measured", beyond_measured(r)},
          {"fits", r.estimate.fits},
          {"why", r.estimate.why}};
      if (node) {
        row["tokens_per_step"] = r.tokens_per_step;
        row["hide_tokens"] = r.hide_tokens;
        row["model_tflops_per_gpu"] = r.model_tflops;
      }
      if (have_times) {
        row["step_s"] = t.step;
        row["compute_s"] = t.compute;
        row["gather_s"] = t.gather;
        row["reduce_s"] = t.reduce;
        row["optimizer_s"] = t.optimizer;
        row["nvme_s"] = t.nvme;
        row["nvme_read_bytes"] = t.nvme_read;
        row["nvme_written_bytes"] = t.nvme_written;
        row["bytes_gathered"] = t.bytes_gathered;
      }
      list.push_back(std::move(row));
    }
    out["placements"] = list;
    out["best"] = best >= 0 ? nlohmann::json(plan::PlacementName(rows[best].config)) : nullptr;
    fmt::print("{}\n", out.dump());
  } else {
    fmt::print("zinf plan: {} ({:.2f}M parameters), {} rank(s), stage 3, compute on {}\n",
               model.description, model.parameter_count() / 1e6, args.world_size,
               node ? fmt::format("{} GPU(s) of {}", args.world_size, node->name)
                    : std::string("the host device"));
    fmt::print(
        "  {}; memory {}{}; NVMe {}\n",
        node           ? fmt::format("hardware {}", args.hardware)
        : have_profile ? "profile " + args.profile
                       : "profile none (sizes only; `zinf bench profile` for times)",
        FormatBytes(options.memory_bytes ? options.memory_bytes : profile.memory_bytes),
        options.gpu_memory_bytes || profile.gpu_memory_bytes
            ? ", GPU " + FormatBytes(options.gpu_memory_bytes ? options.gpu_memory_bytes
                                                              : profile.gpu_memory_bytes)
            : "",
        FormatBytes(options.nvme_free_bytes ? options.nvme_free_bytes : profile.nvme_free_bytes));
    fmt::print(
        "  bytes per rank at the peak of a step: device tier, host arrays and pools, the "
        "trainer's activations; gradients accumulate in host memory unless \"grads nvme\"\n");
    if (node) {
      fmt::print(
          "  on the GPUs: activations of a PyTorch trainer in 16 bits; TFLOPS: 8 x parameters x "
          "tokens per step time, per GPU; hide: tokens per step for the compute to outlast the "
          "offload (now {:.0f})\n",
          rows.empty() ? 0.0 : rows.front().tokens_per_step);
    }
    if (have_profile && plan::ComputeTakesEveryCore(profile, options)) {
      // The plan does not charge the NVMe lane for it (bench/RESULTS.md, the 2-rank demo).
      fmt::print(
          "  the compute takes every core ({} rank(s) x {} thread(s), {} cores): the store's "
          "I/O threads wait for one, so NVMe placements may run slower than shown\n",
          args.world_size, plan::ThreadsPerRank(profile, options), profile.cores);
    }
    fmt::print(
        "\n  {:>3} {:<46} {:>10} {:>10} {:>10} {:>10} {:>4} {:>8} {:>8} {:>8} {:>8} {:>8} "
        "{:>8}{}\n",
        "#", "placement", "device", "host", "activ.", "NVMe", "fits", "step s", "compute", "gather",
        "reduce", "optim", "nvme", node ? fmt::format(" {:>7} {:>9}", "TFLOPS", "hide tok") : "");
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      const plan::MemoryEstimate& m = r.estimate.memory;
      const plan::TimeEstimate& t = r.estimate.time;
      std::string times =
          have_times ? fmt::format("{:>8} {:>8} {:>8} {:>8} {:>8} {:>8}", Seconds(t.step),
                                   Seconds(t.compute), Seconds(t.gather), Seconds(t.reduce),
                                   Seconds(t.optimizer), Seconds(t.nvme))
                     : "";
      if (node) times += fmt::format(" {:>7.1f} {:>9.0f}", r.model_tflops, r.hide_tokens);
      fmt::print("{} {:>3} {:<46} {:>10} {:>10} {:>10} {:>10} {:>4} {}\n",
                 static_cast<int>(i) == best ? "*" : " ", i + 1, plan::PlacementName(r.config),
                 FormatBytes(m.peak_device), FormatBytes(m.peak_host), FormatBytes(m.activations),
                 FormatBytes(m.nvme), r.estimate.fits ? "yes" : "no", times);
    }
    for (const Row& r : rows) {
      if (!r.estimate.fits && !r.estimate.why.empty()) {
        fmt::print("  does not fit: {}: {}\n", plan::PlacementName(r.config), r.estimate.why);
        break;  // one example; --json lists every reason
      }
    }
    if (best >= 0) {
      const plan::MemoryEstimate& m = rows[best].estimate.memory;
      fmt::print("\nfastest that fits: {} ({} s per step)\n",
                 plan::PlacementName(rows[best].config), Seconds(rows[best].estimate.time.step));
      if (m.speculative_chunks < m.optimizer_chunks && rows[best].config.overlap_optimizer) {
        fmt::print(
            "  the NVMe path has room for the overlapped step's new state of {} of the "
            "optimizer's {} chunks; the rest of each step runs after backward\n",
            m.speculative_chunks, m.optimizer_chunks);
      }
      if (beyond_measured(rows[best])) {
        const uint64_t footprint = m.nvme * static_cast<uint64_t>(args.world_size);
        fmt::print(
            "  the profile measured NVMe on {} and this placement keeps {} there: a disk with a "
            "cache in front of it is slower at that size (`zinf bench profile --nvme-size {}GiB` "
            "measures there)\n",
            FormatBytes(profile.nvme_measured_bytes), FormatBytes(footprint),
            (footprint + (1ull << 30) - 1) >> 30);
      }
    } else if (have_times) {
      fmt::print("\nno placement fits this machine\n");
    }
  }

  if (!args.plot.empty()) {
    // x: the table's row number (placements in its order).
    PlotPanel time{.title = "predicted step time by placement (x: the table's row)",
                   .x_label = "placement (row)",
                   .y_label = "seconds per step",
                   .log_y = true};
    PlotPanel bytes{
        .title = "bytes per rank at the peak", .x_label = "placement (row)", .y_label = "GiB"};
    auto series = [&](const char* title, auto value, bool only_fitting) {
      PlotSeries out{.title = title};
      for (size_t i = 0; i < rows.size(); ++i) {
        const double v = value(rows[i].estimate);
        if ((only_fitting && !rows[i].estimate.fits) || !(v > 0)) continue;
        out.x.push_back(static_cast<double>(i + 1));
        out.y.push_back(v);
      }
      return out;
    };
    for (auto& s :
         {series(
              "step (fits)", [](const plan::Estimate& e) { return e.time.step; }, true),
          series(
              "step (does not fit)",
              [](const plan::Estimate& e) { return e.fits ? 0.0 : e.time.step; }, false),
          series(
              "compute", [](const plan::Estimate& e) { return e.time.compute; }, false),
          series(
              "NVMe", [](const plan::Estimate& e) { return e.time.nvme; }, false),
          series(
              "optimizer", [](const plan::Estimate& e) { return e.time.optimizer; }, false)}) {
      if (!s.x.empty()) time.series.push_back(s);
    }
    constexpr double kGiBd = double(uint64_t{1} << 30);
    bytes.series.push_back(series(
        "device", [&](const plan::Estimate& e) { return e.memory.peak_device / kGiBd; }, false));
    bytes.series.push_back(series(
        "host", [&](const plan::Estimate& e) { return e.memory.peak_host / kGiBd; }, false));
    PlotSeries nvme = series(
        "NVMe", [&](const plan::Estimate& e) { return e.memory.nvme / kGiBd; }, false);
    if (!nvme.x.empty()) bytes.series.push_back(nvme);
    Figure figure{.title = model.description, .panels = {time, bytes}};
    ZINF_RETURN_IF_ERROR(WritePlot(figure, args.plot));
    if (!args.json) fmt::print("wrote {}\n", args.plot);
  }

  if (!args.write_config.empty()) {
    if (!have_times) {
      return InvalidArgument(
          "--write-config needs --profile or --hardware: the fastest placement needs rates");
    }
    if (best < 0) return ResourceExhausted("no placement fits: no config written");
    ZINF_ASSIGN_OR_RETURN(std::string text, plan::DeepSpeedJson(rows[best].config, base_json));
    std::ofstream out(args.write_config, std::ios::trunc);
    out << text;
    out.close();
    if (!out) return IoError(fmt::format("--write-config {}: cannot write", args.write_config));
    if (!args.json) fmt::print("wrote {}\n", args.write_config);
  }
  return OkStatus();
}

}  // namespace

void AddPlanCommand(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Bytes per tier and predicted step time of every placement for a model on this machine");
  cmd->add_option("--model", args->model,
                  "A GPT example config (with a \"model\" object), an MLP example config, or a "
                  "shipped GPT-like shape (gpt-10b, gpt-13b, gpt-30b, gpt-70b)");
  cmd->add_option("--params", args->params, "Or: a model of N parameters (350M, 1.3B, ...)");
  cmd->add_option("--layers", args->layers,
                  "Modules of --params (default 24), or the MLP's layers (default 4)");
  cmd->add_option("--width", args->width, "The MLP's width")->capture_default_str();
  cmd->add_option("--tokens", args->tokens, "With --params: tokens per micro-batch")
      ->capture_default_str();
  cmd->add_option("--profile", args->profile, "Machine profile from `zinf bench profile`");
  cmd->add_option("--hardware", args->hardware,
                  "Or: a described node, a file or a shipped name (8xh100-pcie-8nvme, "
                  "h100-workstation, rtx4090-workstation, dgx2-v100, v100-zero-offload, ...)");
  CLI::Option* world_size =
      cmd->add_option("--world-size", args->world_size,
                      "Data-parallel ranks on this machine (default: the described node's GPUs, "
                      "else 1)");
  cmd->add_option("--threads", args->threads, "Threads per rank (default: cores / ranks)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--memory", args->memory, "Host memory to plan for (default: the profile's)");
  cmd->add_option("--gpu-memory", args->gpu_memory, "GPU memory to plan for (default: none)");
  cmd->add_option("--nvme-free", args->nvme_free,
                  "Free NVMe bytes to plan for (default: the profile's, else the free space "
                  "under --nvme-path)");
  cmd->add_option("--nvme-path", args->nvme_path,
                  "nvme_path of the written config (default: the profile's first path)");
  cmd->add_option("--write-config", args->write_config,
                  "Write the fastest placement that fits as a DeepSpeed config");
  cmd->add_option("--plot", args->plot,
                  "PNG of the predicted step times and bytes per placement (gnuplot; x: the "
                  "table's row)");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->add_flag("--clipped", args->clipped,
                "The steps clip their gradients (early training, a norm far above "
                "gradient_clipping): the NVMe optimizer step is not hidden behind backward");
  cmd->callback([args, world_size] {
    args->world_size_given = world_size->count() > 0;
    Report("zinf plan", RunPlan(*args));
  });
}

}  // namespace zinf::tools
