// Note [HF layouts]
// `from_pretrained(DIR)` builds the model its config.json names and copies each tensor of
// model.safetensors into the parameter of the same name, refusing a shape that differs but
// not a model that computes something else: a GPT whose activation, norm epsilon or position
// encoding differs from GPT-2's would load into GPT2LMHeadModel and quietly produce other
// logits. So the GPT example's checkpoint becomes GPT-2 only after its own description of
// itself (metadata "zinf_gpt", which train_gpt records) matches GPT-2's architecture in every
// respect and the config agrees with every tensor's shape; any difference is refused, named.
// A transformers model trained from Python needs no mapping: its parameter names and layouts
// are its own state_dict's, and its config is the one it was built from.
#include "ckpt/hf_layout.h"

#include <fmt/core.h>

#include <algorithm>
#include <set>

#include "core/config_reader.h"

namespace zinf::ckpt {
namespace {

std::string ShapeText(const std::vector<int64_t>& shape) { return nlohmann::json(shape).dump(); }

// The GPT example's architecture as GPT-2 has it: each key of its metadata "zinf_gpt" besides
// the sizes, with GPT-2's value.
const nlohmann::json& Gpt2Architecture() {
  static const nlohmann::json kGpt2 = {
      {"norm", "layernorm"},       {"norm_position", "pre"},
      {"norm_eps", 1e-5},          {"final_norm", true},
      {"activation", "gelu_tanh"}, {"mlp_ratio", 4},
      {"positions", "learned"},    {"biases", true},
      {"tied_head", true},         {"attention_scale", "inverse_sqrt_head_dim"}};
  return kGpt2;
}
constexpr const char* kGptSizes[] = {"vocab_size", "seq_len", "d_model", "n_layer", "n_head"};

// The per-block parameters of the GPT example, in its order; `transposed` ones are nn.Linear
// weights [out, in] that GPT-2's Conv1D stores as [in, out].
struct BlockParam {
  const char* suffix;
  bool transposed;
};
constexpr BlockParam kBlockParams[] = {
    {"ln_1.weight", false},      {"ln_1.bias", false},         {"attn.c_attn.weight", true},
    {"attn.c_attn.bias", false}, {"attn.c_proj.weight", true}, {"attn.c_proj.bias", false},
    {"ln_2.weight", false},      {"ln_2.bias", false},         {"mlp.c_fc.weight", true},
    {"mlp.c_fc.bias", false},    {"mlp.c_proj.weight", true},  {"mlp.c_proj.bias", false}};

// The GPT example's shape of each of its parameter names, for d_model d, vocabulary v and
// context t; empty for a name that is not one of its n_layer blocks'.
std::vector<int64_t> GptShape(const std::string& name, int64_t v, int64_t t, int64_t d) {
  if (name == "wte.weight") return {v, d};
  if (name == "wpe.weight") return {t, d};
  if (name == "ln_f.weight" || name == "ln_f.bias") return {d};
  const size_t dot = name.find('.', 2);
  const std::string suffix = dot == std::string::npos ? "" : name.substr(dot + 1);
  if (suffix == "attn.c_attn.weight") return {3 * d, d};
  if (suffix == "attn.c_attn.bias") return {3 * d};
  if (suffix == "attn.c_proj.weight") return {d, d};
  if (suffix == "mlp.c_fc.weight") return {4 * d, d};
  if (suffix == "mlp.c_fc.bias") return {4 * d};
  if (suffix == "mlp.c_proj.weight") return {d, 4 * d};
  return {d};  // the norms' and the projections' biases
}

// Whether the parameters are exactly the GPT example's for some number of blocks.
bool IsGptExampleLayout(const Manifest& m) {
  if (!m.buffers.empty()) return false;
  int64_t layers = 0;
  while (std::any_of(m.params.begin(), m.params.end(), [&](const ManifestParam& p) {
    return p.name == fmt::format("h.{}.ln_1.weight", layers);
  })) {
    ++layers;
  }
  std::set<std::string> expected = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"};
  for (int64_t i = 0; i < layers; ++i) {
    for (const BlockParam& b : kBlockParams) expected.insert(fmt::format("h.{}.{}", i, b.suffix));
  }
  if (layers == 0 || expected.size() != m.params.size()) return false;
  return std::all_of(m.params.begin(), m.params.end(),
                     [&](const ManifestParam& p) { return expected.count(p.name) != 0; });
}

// An integer of a GPT-2 config, or `absent` where the key is missing.
StatusOr<int64_t> ConfigInt(const nlohmann::json& config, const char* key, int64_t absent) {
  auto it = config.find(key);
  if (it == config.end()) return absent;
  if (!it->is_number_integer()) {
    return InvalidArgument(
        fmt::format("the config's {} must be an integer, got {}", key, DescribeJson(*it)));
  }
  return it->get<int64_t>();
}

// A GPT-2 config that describes the GPT example's model of these sizes, computing what it
// computes; InvalidArgument naming the first field that does not.
Status CheckGpt2Config(const nlohmann::json& config, int64_t v, int64_t t, int64_t d,
                       int64_t layers) {
  auto type = config.find("model_type");
  if (type == config.end() || *type != "gpt2") {
    return InvalidArgument(fmt::format(
        "the checkpoint is the GPT example's model, which maps to GPT-2 only: the config's "
        "model_type must be \"gpt2\", got {}",
        type == config.end() ? "nothing" : type->dump()));
  }
  for (auto [key, want, what] :
       {std::tuple{"vocab_size", v, "wte.weight's rows"},
        std::tuple{"n_positions", t, "wpe.weight's rows"},
        std::tuple{"n_embd", d, "wte.weight's columns"}, std::tuple{"n_layer", layers, "blocks"}}) {
    ZINF_ASSIGN_OR_RETURN(const int64_t got, ConfigInt(config, key, -1));
    if (got != want) {
      return InvalidArgument(
          fmt::format("the config's {} is {}, the checkpoint has {} {}: mismatched shapes", key,
                      got == -1 ? "missing" : std::to_string(got), want, what));
    }
  }
  ZINF_ASSIGN_OR_RETURN(const int64_t heads, ConfigInt(config, "n_head", -1));
  if (heads < 1 || d % heads != 0) {
    return InvalidArgument(
        fmt::format("the config's n_head must divide n_embd {}, got {}", d, heads));
  }
  // Each field whose value changes what GPT2LMHeadModel computes, with the values that
  // compute what the GPT example does (an absent key takes GPT2Config's default, which does).
  auto differs = [&](const char* key, std::initializer_list<nlohmann::json> allowed) {
    auto it = config.find(key);
    if (it == config.end()) return false;
    return std::find(allowed.begin(), allowed.end(), *it) == allowed.end();
  };
  const struct {
    const char* key;
    std::initializer_list<nlohmann::json> allowed;
    const char* why;
  } kChecks[] = {
      {"activation_function", {"gelu_new", "gelu_pytorch_tanh"}, "GELU, tanh approximation"},
      {"layer_norm_epsilon", {1e-5}, "LayerNorm epsilon 1e-5"},
      {"n_inner", {nullptr, 4 * d}, "an MLP of 4 x n_embd"},
      {"tie_word_embeddings", {true}, "lm_head tied to wte"},
      {"scale_attn_weights", {true}, "attention scaled by 1/sqrt(head_dim)"},
      {"scale_attn_by_inverse_layer_idx", {false}, "no per-layer attention scaling"},
      {"add_cross_attention", {false}, "no cross-attention"}};
  for (const auto& c : kChecks) {
    if (differs(c.key, c.allowed)) {
      return InvalidArgument(fmt::format(
          "the config's {} is {}, but the GPT example's model computes {}: a model loaded with "
          "it would compute something else",
          c.key, config[c.key].dump(), c.why));
    }
  }
  return OkStatus();
}

StatusOr<HfLayout> GptExampleLayout(const Manifest& m, const nlohmann::json& metadata,
                                    const nlohmann::json* given_config) {
  auto shape_of = [&](const char* name) -> const std::vector<int64_t>& {
    return std::find_if(m.params.begin(), m.params.end(),
                        [&](const ManifestParam& p) { return p.name == name; })
        ->shape;
  };
  const std::vector<int64_t>& wte = shape_of("wte.weight");
  const std::vector<int64_t>& wpe = shape_of("wpe.weight");
  if (wte.size() != 2 || wpe.size() != 2) {
    return InvalidArgument(fmt::format("wte.weight {} and wpe.weight {} must be matrices",
                                       ShapeText(wte), ShapeText(wpe)));
  }
  const int64_t v = wte[0], d = wte[1], t = wpe[0];
  int64_t layers = 0;
  HfLayout layout;
  for (size_t i = 0; i < m.params.size(); ++i) {
    const ManifestParam& p = m.params[i];
    const std::vector<int64_t> want = GptShape(p.name, v, t, d);
    if (p.shape != want) {
      return InvalidArgument(fmt::format(
          "parameter '{}' has shape {}, the GPT example's model with d_model {} needs {}: "
          "mismatched shapes",
          p.name, ShapeText(p.shape), d, ShapeText(want)));
    }
    const bool transpose = std::any_of(
        std::begin(kBlockParams), std::end(kBlockParams),
        [&](const BlockParam& b) { return b.transposed && p.name.ends_with(b.suffix); });
    std::vector<int64_t> shape = p.shape;
    if (transpose) std::reverse(shape.begin(), shape.end());
    layout.tensors.push_back({"transformer." + p.name, shape, false, i, transpose});
    if (p.name.ends_with(".ln_1.weight")) ++layers;
  }
  auto described = metadata.find("zinf_gpt");
  nlohmann::json from_metadata;
  if (described != metadata.end()) {
    ZINF_ASSIGN_OR_RETURN(from_metadata, Gpt2ConfigOfZinfGpt(*described));
  }
  if (given_config != nullptr) {
    layout.config = *given_config;
    if (!from_metadata.is_null() &&
        layout.config.value("n_head", nlohmann::json()) != from_metadata["n_head"]) {
      return InvalidArgument(fmt::format(
          "the config's n_head is {}, the checkpoint's model (metadata zinf_gpt) has {}",
          layout.config.value("n_head", nlohmann::json()).dump(), from_metadata["n_head"].dump()));
    }
  } else if (!from_metadata.is_null()) {
    layout.config = std::move(from_metadata);
  } else {
    return InvalidArgument(
        "the checkpoint is the GPT example's model but carries no description of it (metadata "
        "\"zinf_gpt\", which train_gpt records): give --hf-config FILE, a GPT-2 config.json "
        "of its sizes (n_head is not in the shapes)");
  }
  ZINF_RETURN_IF_ERROR(CheckGpt2Config(layout.config, v, t, d, layers));
  return layout;
}

}  // namespace

StatusOr<nlohmann::json> Gpt2ConfigOfZinfGpt(const nlohmann::json& zinf_gpt) {
  if (!zinf_gpt.is_object()) {
    return InvalidArgument(
        fmt::format("metadata zinf_gpt must be an object, got {}", DescribeJson(zinf_gpt)));
  }
  const nlohmann::json& gpt2 = Gpt2Architecture();
  for (auto it = zinf_gpt.begin(); it != zinf_gpt.end(); ++it) {
    const bool size =
        std::find(std::begin(kGptSizes), std::end(kGptSizes), it.key()) != std::end(kGptSizes);
    if (!size && !gpt2.contains(it.key())) {
      return InvalidArgument(fmt::format(
          "the checkpoint's GPT has {} {}, a property GPT-2 does not have: it cannot be "
          "written as a GPT-2 model",
          it.key(), it.value().dump()));
    }
  }
  for (auto it = gpt2.begin(); it != gpt2.end(); ++it) {
    auto own = zinf_gpt.find(it.key());
    if (own == zinf_gpt.end() || *own != it.value()) {
      return InvalidArgument(fmt::format(
          "the checkpoint's GPT differs from GPT-2: its {} is {}, GPT-2's is {}; written as "
          "GPT-2 it would load and compute something else, so it is not written",
          it.key(), own == zinf_gpt.end() ? "not stated" : own->dump(), it.value().dump()));
    }
  }
  int64_t sizes[std::size(kGptSizes)];
  for (size_t i = 0; i < std::size(kGptSizes); ++i) {
    auto it = zinf_gpt.find(kGptSizes[i]);
    if (it == zinf_gpt.end() || !it->is_number_unsigned() || it->get<uint64_t>() == 0 ||
        it->get<uint64_t>() > (uint64_t{1} << 31)) {
      return InvalidArgument(fmt::format("metadata zinf_gpt.{} must be a positive integer, got {}",
                                         kGptSizes[i],
                                         it == zinf_gpt.end() ? "nothing" : DescribeJson(*it)));
    }
    sizes[i] = it->get<int64_t>();
  }
  return nlohmann::json{
      {"model_type", "gpt2"},
      {"architectures", {"GPT2LMHeadModel"}},
      {"vocab_size", sizes[0]},
      {"n_positions", sizes[1]},
      {"n_embd", sizes[2]},
      {"n_layer", sizes[3]},
      {"n_head", sizes[4]},
      {"n_inner", nullptr},
      {"activation_function", "gelu_new"},
      {"layer_norm_epsilon", 1e-5},
      // The example has no dropout: fine-tuning the export continues it.
      {"resid_pdrop", 0.0},
      {"embd_pdrop", 0.0},
      {"attn_pdrop", 0.0},
      {"initializer_range", 0.02},
      {"scale_attn_weights", true},
      {"scale_attn_by_inverse_layer_idx", false},
      {"reorder_and_upcast_attn", false},
      {"tie_word_embeddings", true},
      // Byte-level tokens: no special ones (GPT-2's 50256 is past the vocabulary).
      {"bos_token_id", nullptr},
      {"eos_token_id", nullptr},
      {"torch_dtype", "float32"}};
}

StatusOr<HfLayout> HfLayoutOf(const Manifest& manifest, const nlohmann::json* given_config) {
  ZINF_ASSIGN_OR_RETURN(const nlohmann::json metadata, ParseJson(manifest.metadata, "metadata"));
  if (given_config != nullptr && !given_config->is_object()) {
    return InvalidArgument(
        fmt::format("the config must be a JSON object, got {}", DescribeJson(*given_config)));
  }
  if (IsGptExampleLayout(manifest)) return GptExampleLayout(manifest, metadata, given_config);
  HfLayout layout;
  if (given_config != nullptr) {
    layout.config = *given_config;
  } else if (auto it = metadata.find("hf_config"); it != metadata.end() && it->is_object()) {
    layout.config = *it;
  } else {
    return InvalidArgument(
        "the checkpoint carries no Hugging Face config (metadata \"hf_config\", which "
        "zinf.zero records for a transformers model): give --hf-config FILE, the model's "
        "config.json");
  }
  auto type = layout.config.find("model_type");
  if (type == layout.config.end() || !type->is_string()) {
    return InvalidArgument(
        "the config has no \"model_type\" string, which from_pretrained needs to build the model");
  }
  for (size_t i = 0; i < manifest.params.size(); ++i) {
    layout.tensors.push_back({manifest.params[i].name, manifest.params[i].shape, false, i, false});
  }
  for (size_t i = 0; i < manifest.buffers.size(); ++i) {
    layout.tensors.push_back({manifest.buffers[i].name, manifest.buffers[i].shape, true, i, false});
  }
  return layout;
}

}  // namespace zinf::ckpt
