// See tools/plan_model.h, Note [Plan memory] and Note [Plan time]. The models the plan knows:
// the GPT and MLP examples, a uniform model of N parameters, and a trainer's config file.
#include "tools/plan_model.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/config_reader.h"

namespace zinf::plan {

uint64_t ModelSpec::parameter_count() const {
  uint64_t n = 0;
  for (const ModuleShape& m : modules)
    for (uint64_t x : m.numels) n += x;
  return n;
}

// ---- Models ----

StatusOr<ModelSpec> GptModel(int vocab_size, int seq_len, int d_model, int n_layer, int n_head,
                             int micro_batch, bool activation_checkpointing) {
  for (auto [name, v] : {std::pair{"vocab_size", vocab_size},
                         {"seq_len", seq_len},
                         {"d_model", d_model},
                         {"n_layer", n_layer},
                         {"n_head", n_head},
                         {"train_micro_batch_size_per_gpu", micro_batch}}) {
    if (v < 1) return InvalidArgument(fmt::format("model.{} must be >= 1, got {}", name, v));
  }
  if (d_model % n_head != 0) {
    return InvalidArgument(
        fmt::format("model.n_head ({}) must divide model.d_model ({})", n_head, d_model));
  }
  const uint64_t V = vocab_size, T = seq_len, d = d_model, L = n_layer, B = micro_batch;
  ModelSpec m;
  m.description =
      fmt::format("GPT d_model {}, {} layers, {} heads, seq_len {}, vocab {}, micro-batch {}", d, L,
                  n_head, T, V, B);
  m.hidden_size = d;
  m.modules.push_back({"embed", {V * d, T * d}});
  for (uint64_t l = 0; l < L; ++l) {
    m.modules.push_back({fmt::format("h.{}", l),
                         {d, d, 3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d, 4 * d, 4 * d * d, d}});
  }
  m.modules.push_back({"ln_f", {d, d}});
  // gpt_model.cc's Compute: embed, blocks, ln_f, embed again (the tied head), then the blocks
  // in reverse (the embedding's backward needs no parameters).
  const int ln_f = static_cast<int>(L) + 1;
  m.fetch_order.push_back(0);
  for (int l = 1; l <= static_cast<int>(L); ++l) m.fetch_order.push_back(l);
  m.fetch_order.push_back(ln_f);
  m.fetch_order.push_back(0);
  for (int l = static_cast<int>(L); l >= 1; --l) m.fetch_order.push_back(l);
  // Matmul FLOPs per forward: 2 x (12 d^2) per token and block, attention 2 x 2 x T x d per
  // token and block (scores and their product with V), the head 2 x V x d per token. Backward
  // twice the forward; checkpointing recomputes the blocks' forward up to the GELU (the MLP's
  // output projection, 2 x 4 d^2 per token, is not needed again).
  const double tokens = static_cast<double>(B * T);
  const double block_fwd = tokens * (24.0 * d * d + 4.0 * T * d);
  const double recomputed = activation_checkpointing ? block_fwd - tokens * 8.0 * d * d : 0.0;
  const double head_fwd = tokens * 2.0 * V * d;
  const double attention_fwd = tokens * 4.0 * T * d;
  m.fetch_flops.assign(m.fetch_order.size(), 0.0);
  for (uint64_t l = 0; l < L; ++l) {
    m.fetch_flops[1 + l] = block_fwd;
    m.fetch_flops[L + 3 + l] = block_fwd * 2 + recomputed;
  }
  m.fetch_flops[L + 2] = head_fwd * 3;  // the head's forward and both backward products
  for (double f : m.fetch_flops) m.matmul_flops_per_micro_batch += f;
  // GptConfig::ActivationBytes, its arrays each rounded to 64 floats.
  auto r = [](uint64_t n) { return (n + 63) / 64 * 64; };
  const uint64_t n = B * T, nd = n * d, probs = B * n_head * T * T;
  const uint64_t sets = activation_checkpointing ? 1 : L;
  const uint64_t floats =
      (L + 1) * r(nd) + sets * (4 * r(nd) + 4 * r(n) + r(3 * nd) + r(probs) + 2 * r(4 * nd)) +
      7 * r(nd) + 2 * r(n) + r(n * V) + r(3 * nd) + r(probs) + r(4 * nd) + r(4 * nd);
  m.activation_bytes = floats * 4;
  m.tokens_per_micro_batch = static_cast<double>(n);
  // On a GPU in 16 bits: s b h (34 + 5 a s / h) bytes for each block kept whole (all of them
  // without recomputation, one with it, beside every block's 16-bit input), and the logits'
  // fp32 values and gradients.
  const uint64_t block_bytes = n * d * 34 + 5 * B * n_head * T * T;
  m.gpu_activation_bytes =
      (activation_checkpointing ? L * n * d * 2 + block_bytes : L * block_bytes) + n * V * 8;
  // The non-matmul passes: each block's activations (layer norms, attention's softmax, GELU,
  // residuals: about 15 n d floats and the probabilities) are written and read once in
  // forward, again in the recomputation and twice in backward; the logits four times. (The
  // GELU's arithmetic, and std::exp's, are terms of their own.)
  const double block_floats = 15.0 * nd + static_cast<double>(probs);
  m.elementwise_bytes_per_micro_batch =
      4.0 * (2 * L * block_floats * (activation_checkpointing ? 4 : 3) / 2 + 4.0 * n * V);
  const int passes = activation_checkpointing ? 4 : 3;  // forward, recomputation, 2 x backward
  m.attention_flops_per_micro_batch = L * attention_fwd * passes;
  // The MLP's GELU over n x 4d: in forward and the recomputation, and once in backward.
  m.gelu_forward_elements_per_micro_batch = L * (activation_checkpointing ? 2.0 : 1.0) * 4 * nd;
  m.gelu_backward_elements_per_micro_batch = L * 4.0 * nd;
  // The causal softmax: half of each T x T row per head, in forward and the recomputation; the
  // loss: two passes over the logits.
  m.exps_per_micro_batch =
      L * (activation_checkpointing ? 2.0 : 1.0) * B * n_head * T * T / 2 + 2.0 * n * V;
  // gpt_model.cc's oneDNN calls: a block's forward is 7 + 2 B (two layer norms, four linear
  // matmuls, GELU, and attention's two matmuls per sequence), the recomputation one matmul
  // fewer, its backward 11 + 4 B; ln_f and the head 5. (Its own loops cost no call.)
  m.kernel_calls_per_micro_batch =
      L * ((activation_checkpointing ? 2.0 : 1.0) * (6 + 2 * B) + 1 + 11 + 4 * B) + 5;
  return m;
}

StatusOr<ModelSpec> MlpModel(int layers, int width, int batch) {
  if (layers < 1 || width < 1 || batch < 1) {
    return InvalidArgument(fmt::format(
        "the MLP needs layers, width and batch >= 1, got {}, {} and {}", layers, width, batch));
  }
  const uint64_t W = width;
  ModelSpec m;
  m.description = fmt::format("MLP {} layers of {}x{}, batch {}", layers, W, W, batch);
  m.hidden_size = W;
  m.plain_loop_compute = true;
  for (int l = 0; l < layers; ++l) m.modules.push_back({fmt::format("layer{}", l), {W * W, W}});
  // Forward 2 B W^2 per layer; backward 4 B W^2 (the weight's gradient and the input's).
  const double forward = 2.0 * batch * static_cast<double>(W * W);
  for (int l = 0; l < layers; ++l) m.fetch_order.push_back(l), m.fetch_flops.push_back(forward);
  for (int l = layers - 1; l >= 0; --l) {
    m.fetch_order.push_back(l), m.fetch_flops.push_back(2 * forward);
  }
  m.matmul_flops_per_micro_batch = 3 * forward * layers;
  m.activation_bytes = (2 * static_cast<uint64_t>(layers) + 3) * batch * W * 4;
  m.gpu_activation_bytes = m.activation_bytes / 2;
  m.tokens_per_micro_batch = batch;
  return m;
}

StatusOr<ModelSpec> UniformModel(uint64_t params, int layers, uint64_t tokens_per_micro_batch) {
  if (params == 0) return InvalidArgument("--params must be > 0");
  if (layers < 1) return InvalidArgument(fmt::format("--layers must be >= 1, got {}", layers));
  if (tokens_per_micro_batch == 0) return InvalidArgument("--tokens must be > 0");
  if (params < static_cast<uint64_t>(layers)) {
    return InvalidArgument(
        fmt::format("--params ({}) must be at least --layers ({})", params, layers));
  }
  ModelSpec m;
  m.description = fmt::format("{} parameters in {} layers, {} tokens per micro-batch", params,
                              layers, tokens_per_micro_batch);
  const uint64_t per = params / layers;
  m.hidden_size = static_cast<uint64_t>(std::sqrt(static_cast<double>(per) / 12.0));
  for (int l = 0; l < layers; ++l) {
    m.modules.push_back({fmt::format("layer{}", l), {per + (l == 0 ? params % layers : 0)}});
  }
  const double forward = 2.0 * static_cast<double>(per) * tokens_per_micro_batch;
  for (int l = 0; l < layers; ++l) m.fetch_order.push_back(l), m.fetch_flops.push_back(forward);
  for (int l = layers - 1; l >= 0; --l) {
    m.fetch_order.push_back(l), m.fetch_flops.push_back(3 * forward);
  }
  m.matmul_flops_per_micro_batch = 8.0 * static_cast<double>(params) * tokens_per_micro_batch;
  // About 16 floats of d per token and layer kept with recomputation, as the GPT's.
  m.activation_bytes = tokens_per_micro_batch * m.hidden_size * 4 * (16 + layers);
  // As the GPT's on a GPU with recomputation: each layer's 16-bit input and one layer whole.
  m.gpu_activation_bytes = tokens_per_micro_batch * m.hidden_size * (2 * layers + 34);
  m.tokens_per_micro_batch = static_cast<double>(tokens_per_micro_batch);
  return m;
}

StatusOr<ConfigModel> ModelFromConfigText(std::string_view text, const std::string& source,
                                          int mlp_layers, int mlp_width, int world_size) {
  ZINF_ASSIGN_OR_RETURN(nlohmann::json json, ParseJson(text, source));
  if (!json.is_object()) return InvalidArgument(fmt::format("{}: not a JSON object", source));
  nlohmann::json model = nlohmann::json::object();
  const bool gpt = json.contains("model");
  if (gpt) {
    model = json["model"];
    json.erase("model");
    if (!model.is_object())
      return InvalidArgument(fmt::format("{}: model must be an object", source));
  }
  // "@NVME_PATH@" placeholders of the shipped configs: any path will do for sizing.
  std::string engine_text = json.dump();
  for (size_t at; (at = engine_text.find("@NVME_PATH@")) != std::string::npos;) {
    engine_text.replace(at, 11, "/tmp");
  }
  StatusOr<EngineConfig> config = EngineConfig::FromJson(engine_text);
  if (!config.ok()) return config.status().WithContext(source);
  // The micro-batch the model is sized for is the one the engine would train at: a config may
  // give train_batch_size alone.
  if (Status s = config->ResolveBatchSize(world_size); !s.ok()) return s.WithContext(source);
  ConfigModel out{ModelSpec{}, *config};
  if (gpt) {
    int v[5] = {256, 64, 128, 4, 4};
    bool checkpointing = true;
    const char* keys[5] = {"vocab_size", "seq_len", "d_model", "n_layer", "n_head"};
    for (auto it = model.begin(); it != model.end(); ++it) {
      const std::string& key = it.key();
      if (key == "activation_checkpointing") {
        if (!it->is_boolean()) {
          return InvalidArgument(
              fmt::format("{}: model.{} must be true or false, got {}", source, key, it->dump()));
        }
        checkpointing = it->get<bool>();
        continue;
      }
      const auto k =
          std::find_if(std::begin(keys), std::end(keys), [&](const char* n) { return key == n; });
      if (k == std::end(keys)) {
        return InvalidArgument(fmt::format(
            "{}: model.{} is not a GPT model key (vocab_size, seq_len, d_model, n_layer, n_head, "
            "activation_checkpointing)",
            source, key));
      }
      if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > (1 << 30)) {
        return InvalidArgument(fmt::format("{}: model.{} must be an integer in [1, 2^30], got {}",
                                           source, key, it->dump()));
      }
      v[k - std::begin(keys)] = it->get<int>();
    }
    StatusOr<ModelSpec> m =
        GptModel(v[0], v[1], v[2], v[3], v[4], config->micro_batch_size, checkpointing);
    if (!m.ok()) return m.status().WithContext(source);
    out.model = std::move(*m);
  } else {
    StatusOr<ModelSpec> m = MlpModel(mlp_layers, mlp_width, config->micro_batch_size);
    if (!m.ok()) return m.status().WithContext(source);
    out.model = std::move(*m);
  }
  out.model.description += "; " + config->BatchShape(world_size);
  return out;
}

}  // namespace zinf::plan
