// gpt_bf16_bench: GPT training tokens/s with fp32 and with bf16 matmuls (bf16 inputs, fp32
// accumulation: oneDNN on the CPU's bf16 dot products), interleaved step by step in one
// process, so that the load of a shared machine hits every arm alike. Each arm is its own
// engine and model over the same config, data and thread count:
//   shipped  the config as given (its own bf16 setting; matmuls as --matmul auto picks)
//   fp32     the config with "bf16": {"enabled": true}, matmuls in fp32 (the fp32 path)
//   bf16     the same, matmuls in bf16
// fp32 and bf16 differ only in the matmuls' input type. A round runs one optimizer step of
// every arm, starting with a different arm each round; figures are medians over the rounds
// after the warm-up, and the speed-up is the median of the rounds' bf16 / fp32 ratios.
//
// Build: cmake --build build --target gpt_bf16_bench
// Run:   build/bin/gpt_bf16_bench --config examples/gpt/configs/memory.json [--steps 40]
//            [--warmup 5] [--threads 2] [--nvme-path DIR] [--arms shipped,fp32,bf16] [--json]
// @NVME_PATH@ in the config becomes DIR/<arm>. Prints its configuration first, a line per
// arm, and with --json one JSON line at the end.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "examples/gpt/gpt_model.h"
#include "zinf/cpu_info.h"
#include "zinf/engine.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Arm {
  std::string name;
  std::unique_ptr<zinf::Engine> engine;
  std::unique_ptr<gpt::Gpt> model;
  std::vector<double> tokens_per_s, compute_s;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "gpt_bf16_bench: %s\n", message.c_str());
  return 1;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

int Main(int argc, char** argv) {
  std::string config_path, nvme_path = "build/gpt-bf16-bench-nvme", arms_list = "shipped,fp32,bf16";
  int steps = 40, warmup = 5, threads = 2;
  bool json_out = false;
  CLI::App app{"GPT training tokens/s with fp32 and bf16 matmuls, interleaved step by step."};
  app.add_option("--config", config_path, "train_gpt config (DeepSpeed JSON with \"model\")")
      ->required();
  app.add_option("--steps", steps, "optimizer steps per arm")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "first steps left out of the figures")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", threads, "compute and optimizer threads")->check(CLI::PositiveNumber);
  app.add_option("--nvme-path", nvme_path, "@NVME_PATH@ becomes DIR/<arm>");
  app.add_option("--arms", arms_list, "comma-separated: shipped, fp32, bf16");
  app.add_flag("--json", json_out, "print a JSON line of the figures at the end");
  CLI11_PARSE(app, argc, argv);
  if (warmup >= steps) return Fail("--warmup must be below --steps");

  std::ifstream file(config_path);
  if (!file) return Fail("cannot read " + config_path);
  std::stringstream text;
  text << file.rdbuf();
  nlohmann::json base = nlohmann::json::parse(text.str(), nullptr, false);
  if (base.is_discarded() || !base.is_object()) return Fail(config_path + ": not a JSON object");
  auto model_config =
      gpt::GptConfig::FromJson(base.value("model", nlohmann::json::object()).dump());
  if (!model_config.ok()) return Fail(model_config.status().ToString());
  base.erase("model");
  gpt::SetComputeThreads(threads);

  std::vector<Arm> arms;
  std::stringstream names(arms_list);
  for (std::string name; std::getline(names, name, ',');) {
    if (name != "shipped" && name != "fp32" && name != "bf16") {
      return Fail("--arms: unknown arm '" + name + "' (known: shipped, fp32, bf16)");
    }
    nlohmann::json config = base;
    if (name != "shipped") config["bf16"] = {{"enabled", true}};
    std::string dumped = config.dump();
    const std::string dir = nvme_path + "/" + name;
    if (dumped.find("@NVME_PATH@") != std::string::npos) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
      std::filesystem::create_directories(dir, ec);
      if (ec) return Fail("cannot create " + dir + ": " + ec.message());
    }
    for (size_t at; (at = dumped.find("@NVME_PATH@")) != std::string::npos;) {
      dumped.replace(at, 11, dir);
    }
    auto engine_config = zinf::EngineConfig::FromJson(dumped);
    if (!engine_config.ok()) return Fail(engine_config.status().ToString());
    auto engine = zinf::Engine::Create(
        *engine_config,
        {.device = "host", .rank = 0, .world_size = 1, .optimizer_threads = threads});
    if (!engine.ok()) return Fail(engine.status().ToString());
    gpt::GptOptions options;
    options.matmul_precision = name == "fp32"   ? gpt::MatmulPrecision::kFp32
                               : name == "bf16" ? gpt::MatmulPrecision::kBf16
                                                : gpt::MatmulPrecision::kAuto;
    auto model = gpt::Gpt::Create(**engine, *model_config, options);
    if (!model.ok()) return Fail(name + ": " + model.status().ToString());
    if (zinf::Status s = (*engine)->Initialize(); !s.ok()) return Fail(s.ToString());
    arms.push_back({name, std::move(engine).value(), std::move(model).value(), {}, {}});
  }
  if (arms.empty()) return Fail("--arms names no arm");

  const gpt::GptConfig& mc = *model_config;
  const zinf::EngineConfig& ec = arms[0].engine->config();
  const int batch = ec.micro_batch_size, gas = ec.gradient_accumulation_steps;
  const double tokens_per_step = double(batch) * gas * mc.seq_len;
  std::printf(
      "gpt_bf16_bench: %s: %.2fM parameters (d_model %d, %d layers, %d heads, seq_len %d, "
      "activation checkpointing %s), micro-batch %d x accumulation %d = %.0f tokens per step\n"
      "  parameters on %s, optimizer on %s; 1 rank, %d threads; %d steps per arm, the first %d "
      "left out; CPU: %s (%s)\n",
      config_path.c_str(), mc.parameter_count() / 1e6, mc.d_model, mc.n_layer, mc.n_head,
      mc.seq_len, mc.activation_checkpointing ? "on" : "off", batch, gas, tokens_per_step,
      std::string(zinf::OffloadDeviceName(ec.offload_param_device)).c_str(),
      std::string(zinf::OffloadDeviceName(ec.offload_optimizer_device)).c_str(), threads, steps,
      warmup, zinf::GetCpuInfo().model_name.c_str(),
      zinf::IsaSummary(zinf::GetCpuInfo().isa).c_str());
  for (const Arm& a : arms) {
    std::printf(
        "  arm %-7s: parameter tier %s, matmuls in %s\n", a.name.c_str(),
        a.engine->config().bf16 ? "bf16" : "fp32",
        a.model->matmul_type() == zinf::ElementType::kBf16 ? "bf16 (fp32 accumulation)" : "fp32");
  }
  std::fflush(stdout);

  // The same rows for every arm: a step's data depends only on the step.
  std::vector<int32_t> tokens(static_cast<size_t>(batch) * mc.seq_len), targets(tokens.size());
  std::vector<double> ratios;  // bf16 / fp32 per round
  int fp32_arm = -1, bf16_arm = -1;
  for (size_t i = 0; i < arms.size(); ++i) {
    if (arms[i].name == "fp32") fp32_arm = static_cast<int>(i);
    if (arms[i].name == "bf16") bf16_arm = static_cast<int>(i);
  }
  for (int step = 0; step < steps; ++step) {
    std::vector<double> rate(arms.size());
    for (size_t k = 0; k < arms.size(); ++k) {
      Arm& arm = arms[(k + step) % arms.size()];
      const auto t0 = Clock::now();
      for (int micro = 0; micro < gas; ++micro) {
        for (size_t i = 0; i < tokens.size(); ++i) {
          const uint64_t r = SplitMix64((uint64_t(step) * gas + micro) * tokens.size() + i);
          tokens[i] = static_cast<int32_t>(r % mc.vocab_size);
          targets[i] = static_cast<int32_t>((r >> 32) % mc.vocab_size);
        }
        auto loss = arm.model->TrainMicroBatch(tokens.data(), targets.data(), batch);
        if (!loss.ok()) return Fail(arm.name + ": " + loss.status().ToString());
      }
      auto summary = arm.engine->Step();
      if (!summary.ok()) return Fail(arm.name + ": " + summary.status().ToString());
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      const gpt::Gpt::Timing timing = arm.model->TakeTiming();
      rate[(k + step) % arms.size()] = tokens_per_step / seconds;
      if (step >= warmup) {
        arm.tokens_per_s.push_back(tokens_per_step / seconds);
        arm.compute_s.push_back(timing.compute_s);
      }
    }
    if (fp32_arm >= 0 && bf16_arm >= 0 && step >= warmup) {
      ratios.push_back(rate[bf16_arm] / rate[fp32_arm]);
    }
  }

  nlohmann::json out = {{"config", config_path}, {"steps", steps}, {"warmup", warmup}};
  for (const Arm& a : arms) {
    const double tps = Median(a.tokens_per_s), compute = Median(a.compute_s);
    std::printf("%-7s %10.1f tokens/s  compute %.4f s/step  (median of %zu steps)\n",
                a.name.c_str(), tps, compute, a.tokens_per_s.size());
    out["arms"][a.name] = {
        {"tokens_per_s", tps},
        {"compute_s", compute},
        {"matmul", a.model->matmul_type() == zinf::ElementType::kBf16 ? "bf16" : "fp32"}};
  }
  if (!ratios.empty()) {
    std::printf("bf16 / fp32: %.3f (median of %zu paired steps)\n", Median(ratios), ratios.size());
    out["bf16_over_fp32"] = Median(ratios);
  }
  if (json_out) std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    return Fail(std::string("unexpected exception: ") + e.what());
  }
}
