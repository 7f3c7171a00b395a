// GptConfig: the GPT example's model shape, read from the config's "model" object, checked,
// and the arithmetic that follows from it (parameter count and names, the activation bytes a
// batch needs, the description checkpoints carry). See gpt_model.h.
#include <fmt/core.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "examples/gpt/gpt_model.h"
#include "examples/gpt/json_input.h"

namespace gpt {
namespace {

using zinf::InvalidArgument;
using zinf::Status;
using zinf::StatusOr;

constexpr int64_t kMaxDimension = 1 << 20;

}  // namespace

Status GptConfig::Validate() const {
  for (auto [name, value] : {std::pair{"vocab_size", vocab_size},
                             {"seq_len", seq_len},
                             {"d_model", d_model},
                             {"n_layer", n_layer},
                             {"n_head", n_head}}) {
    if (value < 1 || value > kMaxDimension) {
      return InvalidArgument(
          fmt::format("model.{} must be in [1, {}], got {}", name, kMaxDimension, value));
    }
  }
  if (d_model % n_head != 0) {
    return InvalidArgument(
        fmt::format("model.d_model ({}) must be a multiple of model.n_head ({})", d_model, n_head));
  }
  // parameter_count() in checked arithmetic: d_model and n_layer of 2^20 overflow int64.
  const int64_t d = d_model;
  int64_t block = 0, blocks = 0, embed = 0, total = 0;
  if (__builtin_mul_overflow(12 * d, d, &block) || __builtin_add_overflow(block, 13 * d, &block) ||
      __builtin_mul_overflow(block, int64_t{n_layer}, &blocks) ||
      __builtin_mul_overflow(int64_t{vocab_size} + seq_len, d, &embed) ||
      __builtin_add_overflow(embed, blocks, &total) ||
      __builtin_add_overflow(total, 2 * d, &total)) {
    return InvalidArgument(fmt::format(
        "model has more than 2^63 parameters (d_model {}, n_layer {}, vocab_size {}, seq_len {})",
        d_model, n_layer, vocab_size, seq_len));
  }
  return zinf::OkStatus();
}

StatusOr<uint64_t> GptConfig::ActivationBytes(int64_t batch) const {
  auto overflow = [&] {
    return InvalidArgument(fmt::format(
        "the activations of a batch of {} sequences (seq_len {}, d_model {}, n_head {}, n_layer "
        "{}, vocab_size {}) need more than 2^64 bytes",
        batch, seq_len, d_model, n_head, n_layer, vocab_size));
  };
  if (batch < 1) return InvalidArgument(fmt::format("batch must be >= 1, got {}", batch));
  ZINF_RETURN_IF_ERROR(Validate());
  // The arrays Impl::Resize lays out, in floats, each rounded up to 64: (how many, size).
  uint64_t n = 0, nd = 0, nv = 0, heads = 0, probs = 0;
  const uint64_t d = d_model, t = seq_len;
  if (__builtin_mul_overflow(uint64_t(batch), t, &n) || __builtin_mul_overflow(n, d, &nd) ||
      __builtin_mul_overflow(n, uint64_t(vocab_size), &nv) ||
      __builtin_mul_overflow(uint64_t(batch), uint64_t(n_head), &heads) ||
      __builtin_mul_overflow(heads, t * t, &probs) || nd > (UINT64_MAX >> 4)) {
    return overflow();
  }
  const uint64_t sets = activation_checkpointing ? 1 : n_layer;  // of BlockActivations
  const std::pair<uint64_t, uint64_t> arrays[] = {
      {uint64_t(n_layer) + 1, nd},  // x
      {4 * sets, nd},               // ln1, attn, mid, ln2
      {4 * sets, n},                // their means and variances
      {sets, 3 * nd},               // qkv
      {sets, probs},                // probs
      {2 * sets, 4 * nd},           // fc, gelu
      {7, nd},                      // xf, dx, dx_next, dmid, dattn, dnorm, dln
      {2, n},                       // lnf_mean, lnf_var
      {1, nv},                      // logits
      {1, 3 * nd},                  // dqkv
      {1, probs},                   // dprobs
      {2, 4 * nd},                  // dgelu, dfc
  };
  uint64_t floats = 0;
  for (const auto& [count, size] : arrays) {
    uint64_t padded = 0, all = 0;
    if (__builtin_add_overflow(size, 63, &padded) ||
        __builtin_mul_overflow(padded / 64 * 64, count, &all) ||
        __builtin_add_overflow(floats, all, &floats)) {
      return overflow();
    }
  }
  if (floats > UINT64_MAX / sizeof(float)) return overflow();
  return floats * sizeof(float);
}

StatusOr<GptConfig> GptConfig::FromJson(std::string_view json_object) {
  ZINF_ASSIGN_OR_RETURN(const nlohmann::json json, ParseJson(json_object, "model"));
  if (!json.is_object()) {
    return InvalidArgument(std::string("model must be a JSON object, got ") + json.type_name());
  }
  GptConfig c;
  for (const auto& [key, value] : json.items()) {
    int* field = key == "vocab_size" ? &c.vocab_size
                 : key == "seq_len"  ? &c.seq_len
                 : key == "d_model"  ? &c.d_model
                 : key == "n_layer"  ? &c.n_layer
                 : key == "n_head"   ? &c.n_head
                                     : nullptr;
    if (field != nullptr) {
      if (!value.is_number_integer() || value.get<int64_t>() < 1 ||
          value.get<int64_t>() > kMaxDimension) {
        return InvalidArgument(fmt::format("model.{} must be an integer in [1, {}], got {}", key,
                                           kMaxDimension, DescribeJson(value)));
      }
      *field = value.get<int>();
    } else if (key == "activation_checkpointing") {
      if (!value.is_boolean()) {
        return InvalidArgument("model.activation_checkpointing must be true or false, got " +
                               DescribeJson(value));
      }
      c.activation_checkpointing = value.get<bool>();
    } else {
      return InvalidArgument(fmt::format(
          "model.{} is not a known key (known: vocab_size, seq_len, d_model, n_layer, n_head, "
          "activation_checkpointing)",
          key));
    }
  }
  ZINF_RETURN_IF_ERROR(c.Validate());
  return c;
}

int64_t GptConfig::parameter_count() const {
  const int64_t d = d_model;
  return (int64_t{vocab_size} + seq_len) * d + n_layer * (12 * d * d + 13 * d) + 2 * d;
}

std::vector<std::string> GptConfig::parameter_names() const {
  std::vector<std::string> names = {"wte.weight", "wpe.weight"};
  for (int i = 0; i < n_layer; ++i) {
    for (const char* p :
         {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
          "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",
          "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"}) {
      names.push_back("h." + std::to_string(i) + "." + p);
    }
  }
  names.push_back("ln_f.weight");
  names.push_back("ln_f.bias");
  return names;
}

std::string GptConfig::DescriptionJson() const {
  // What the kernels compute (kLayerNormEps, eltwise_gelu_tanh and GeluForwardKernel, the
  // attention's 1/sqrt(head_dim), the head's matmul with wte), stated for readers of the
  // checkpoint: `zinf ckpt export --hf` writes a GPT-2 model only where every entry is GPT-2's.
  const nlohmann::json description = {{"vocab_size", vocab_size},
                                      {"seq_len", seq_len},
                                      {"d_model", d_model},
                                      {"n_layer", n_layer},
                                      {"n_head", n_head},
                                      {"norm", "layernorm"},
                                      {"norm_position", "pre"},
                                      {"norm_eps", 1e-5},
                                      {"final_norm", true},
                                      {"activation", "gelu_tanh"},
                                      {"mlp_ratio", 4},
                                      {"positions", "learned"},
                                      {"biases", true},
                                      {"tied_head", true},
                                      {"attention_scale", "inverse_sqrt_head_dim"}};
  return description.dump();
}

}  // namespace gpt
