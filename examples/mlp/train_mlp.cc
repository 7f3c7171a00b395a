// train_mlp: an MLP trained through zinf's ZeRO engine, with hand-written forward and
// backward, using only zinf's public headers. It is the engine's smallest complete trainer
// and what bench/zero_placements.sh times under each offload placement.
//
// Build:  cmake --build build --target train_mlp
// Run:    build/bin/zinf run -n 2 -- build/bin/train_mlp --config examples/mlp/configs/cpu.json
//         [--layers 4] [--width 1024] [--batch B] [--steps 5] [--nvme-path DIR]
// A step is gradient_accumulation_steps micro-batches of train_micro_batch_size_per_gpu rows,
// as the engine resolved the config's batch keys (Engine::config()); --batch is the trainer's
// micro-batch for a config that says "auto" (a number there must agree).
// Rank 0 prints one line per step and, last, a JSON summary (median step time, bytes per
// link per step, the engine's host and NVMe bytes after the last step).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "zinf/engine.h"
#include "zinf/input_file.h"

namespace {

struct Args {
  std::string config;
  std::string nvme_path;  // replaces "@NVME_PATH@" in the config
  int layers = 4;
  int width = 1024;
  int batch = 0;  // 0: the config's
  int steps = 5;
};

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    if (flag == "--config")
      a->config = v;
    else if (flag == "--nvme-path")
      a->nvme_path = v;
    else if (flag == "--layers")
      a->layers = std::atoi(v);
    else if (flag == "--width")
      a->width = std::atoi(v);
    else if (flag == "--batch")
      a->batch = std::atoi(v);
    else if (flag == "--steps")
      a->steps = std::atoi(v);
    else
      return false;
  }
  return !a->config.empty() && a->layers > 0 && a->width > 0 && a->batch >= 0 && a->steps > 0;
}

// y[b][j] = bias[j] + sum_k w[j][k] x[b][k]; eight partial sums keep the FMA units busy.
void Linear(const float* x, const float* w, const float* bias, float* y, int batch, int in,
            int out) {
  for (int b = 0; b < batch; ++b) {
    const float* xb = x + static_cast<size_t>(b) * in;
    for (int j = 0; j < out; ++j) {
      const float* wj = w + static_cast<size_t>(j) * in;
      float s[8] = {};
      int k = 0;
      for (; k + 8 <= in; k += 8)
        for (int u = 0; u < 8; ++u) s[u] += wj[k + u] * xb[k + u];
      float total = bias[j];
      for (int u = 0; u < 8; ++u) total += s[u];
      for (; k < in; ++k) total += wj[k] * xb[k];
      y[static_cast<size_t>(b) * out + j] = total;
    }
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Fail(const zinf::Status& s) {
  std::fprintf(stderr, "train_mlp: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!ParseArgs(argc, argv, &args)) {
    std::fprintf(stderr,
                 "usage: train_mlp --config FILE [--layers L] [--width W] [--batch B] "
                 "[--steps S] [--nvme-path DIR]\n");
    return 2;
  }
  auto text = zinf::ReadInputFile(args.config, "--config");
  if (!text.ok()) return Fail(text.status());
  std::string json = *std::move(text);
  for (size_t at; (at = json.find("@NVME_PATH@")) != std::string::npos;) {
    json.replace(at, 11, args.nvme_path);
  }
  zinf::TrainerValues trainer;
  if (args.batch > 0) trainer.micro_batch_size = args.batch;
  auto config = zinf::EngineConfig::FromJson(json, trainer);
  if (!config.ok()) return Fail(config.status().WithContext(args.config));
  auto created = zinf::Engine::Create(*config, {.device = "host"});
  if (!created.ok()) return Fail(created.status());
  zinf::Engine& engine = **created;

  // The batch shape the engine resolved: a config may give train_batch_size alone.
  const int L = args.layers, W = args.width, B = engine.config().micro_batch_size,
            gas = engine.config().gradient_accumulation_steps;
  std::vector<int> modules;
  for (int l = 0; l < L; ++l) {
    const std::string n = "layer" + std::to_string(l);
    auto id = engine.RegisterModule(
        n, {{n + ".weight", {W, W}, zinf::ParamInit::kNormal, 1.0f / std::sqrt(float(W))},
            {n + ".bias", {W}, zinf::ParamInit::kZeros}});
    if (!id.ok()) return Fail(id.status());
    modules.push_back(*id);
  }
  if (auto s = engine.Initialize(); !s.ok()) return Fail(s);

  // acts[l] is the input of layer l (after ReLU for l > 0); pre[l] its pre-activation output.
  std::vector<std::vector<float>> acts(L + 1, std::vector<float>(size_t(B) * W));
  std::vector<std::vector<float>> pre(L, std::vector<float>(size_t(B) * W));
  std::vector<float> grad(size_t(B) * W), grad_in(size_t(B) * W);
  std::vector<double> step_seconds;
  zinf::StepSummary last;
  uint64_t gathered = 0, reduced = 0, nvme_read = 0, nvme_written = 0;

  for (int step = 0; step < args.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    double loss = 0;
    for (int micro = 0; micro < gas; ++micro) {
      for (int b = 0; b < B; ++b)
        for (int k = 0; k < W; ++k) {
          const int row = ((step * gas + micro) * engine.world_size() + engine.rank()) * B + b;
          acts[0][size_t(b) * W + k] = std::sin(0.01f * row + 0.1f * k);
        }
      for (int l = 0; l < L; ++l) {
        auto p = engine.Fetch(modules[l]);
        if (!p.ok()) return Fail(p.status());
        Linear(acts[l].data(), p->params[0], p->params[1], pre[l].data(), B, W, W);
        for (size_t i = 0; i < pre[l].size(); ++i) acts[l + 1][i] = std::max(pre[l][i], 0.0f);
        if (auto s = engine.Release(modules[l]); !s.ok()) return Fail(s);
      }
      // Loss: mean over rows of 0.5 * |out - target|^2, target = cos of the input, and over the
      // step's micro-batches.
      const float scale = static_cast<float>(engine.loss_scale());
      for (size_t i = 0; i < grad.size(); ++i) {
        const float d = pre[L - 1][i] - std::cos(acts[0][i]);
        loss += 0.5 * d * d / B / gas;
        grad[i] = d / B * scale;
      }
      for (int l = L - 1; l >= 0; --l) {
        if (l != L - 1) {
          for (size_t i = 0; i < grad.size(); ++i) grad[i] = pre[l][i] > 0 ? grad[i] : 0.0f;
        }
        auto p = engine.Fetch(modules[l]);
        auto g = engine.Gradients(modules[l]);
        if (!p.ok() || !g.ok()) return Fail(p.ok() ? g.status() : p.status());
        float* gw = (*g)[0];
        float* gb = (*g)[1];
        std::fill(grad_in.begin(), grad_in.end(), 0.0f);
        for (int b = 0; b < B; ++b) {
          const float* x = &acts[l][size_t(b) * W];
          for (int j = 0; j < W; ++j) {
            const float dy = grad[size_t(b) * W + j];
            gb[j] += dy;
            float* gwj = gw + size_t(j) * W;
            const float* wj = p->params[0] + size_t(j) * W;
            float* gx = &grad_in[size_t(b) * W];
            for (int k = 0; k < W; ++k) {
              gwj[k] += dy * x[k];
              gx[k] += dy * wj[k];
            }
          }
        }
        grad.swap(grad_in);
        if (auto s = engine.ReduceGradients(modules[l]); !s.ok()) return Fail(s);
        if (auto s = engine.Release(modules[l]); !s.ok()) return Fail(s);
      }
    }
    auto summary = engine.Step();
    if (!summary.ok()) return Fail(summary.status());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    step_seconds.push_back(seconds);
    last = *summary;
    gathered = summary->bytes_gathered;
    reduced = summary->bytes_reduce_scattered;
    nvme_read = summary->bytes_nvme_read;
    nvme_written = summary->bytes_nvme_written;
    if (engine.rank() == 0) {
      std::printf(
          "step %d  loss %.5f  %.3f s  (gather %.3f, reduce %.3f, optimizer %.3f)  "
          "grad norm %.4f\n",
          step + 1, loss, seconds, summary->seconds_gather, summary->seconds_reduce,
          summary->seconds_optimizer, summary->grad_norm);
    }
  }
  if (engine.rank() == 0) {
    // The first step includes first-touch page faults: the median leaves it out when it can.
    std::vector<double> steady(step_seconds.begin() + (step_seconds.size() > 2 ? 1 : 0),
                               step_seconds.end());
    std::printf(
        "{\"ranks\": %d, \"micro_batch\": %d, \"gradient_accumulation_steps\": %d, "
        "\"params\": %lld, \"median_step_s\": %.4f, "
        "\"bytes_gathered\": %llu, \"bytes_reduce_scattered\": %llu, "
        "\"bytes_nvme_read\": %llu, \"bytes_nvme_written\": %llu, \"host_bytes\": %llu, "
        "\"nvme_bytes\": %llu}\n",
        engine.world_size(), B, gas, static_cast<long long>(L) * W * (W + 1), Median(steady),
        static_cast<unsigned long long>(gathered), static_cast<unsigned long long>(reduced),
        static_cast<unsigned long long>(nvme_read), static_cast<unsigned long long>(nvme_written),
        static_cast<unsigned long long>(last.host_bytes),
        static_cast<unsigned long long>(last.nvme_bytes));
  }
  return 0;
}
