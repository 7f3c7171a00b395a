// How a checkpoint's tensors become a Hugging Face model's (`zinf ckpt export --hf`): the HF
// config, and each tensor's HF name and layout. Pure functions of the manifest and configs,
// so that the mapping is tested without files.
//
// Two layouts (See Note [HF layouts] in hf_layout.cc):
//  - the HF names already: a transformers model trained under zinf.zero, whose parameter names
//    are its state_dict's. The config is the checkpoint's metadata "hf_config" (zinf.zero
//    records the model's) or the one given; tensors are written as they are.
//  - the GPT example's (examples/gpt: "wte.weight", "h.0.attn.c_attn.weight" [3d, d], ...):
//    mapped to GPT2LMHeadModel's ("transformer.h.0.attn.c_attn.weight" [d, 3d], Conv1D's
//    [in, out] layout; lm_head tied to wte, not written), with a GPT2Config made from the
//    metadata "zinf_gpt" or the one given, after checking that the model computes what GPT-2
//    computes.
//
// Thread-safety: pure functions.
#ifndef ZINF_SRC_CKPT_HF_LAYOUT_H_
#define ZINF_SRC_CKPT_HF_LAYOUT_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "zinf/status.h"

namespace zinf::ckpt {

struct HfTensor {
  std::string name;            // the HF state_dict name
  std::vector<int64_t> shape;  // as HF stores it
  bool is_buffer = false;      // manifest.buffers[source], else manifest.params[source]
  size_t source = 0;
  bool transpose = false;  // a [rows, cols] parameter stored as [cols, rows]
};

struct HfLayout {
  nlohmann::json config;  // config.json's object
  std::vector<HfTensor> tensors;
};

// The layout of `manifest`'s model. `given_config`: the user's config (--hf-config), or null
// to use the checkpoint's metadata. InvalidArgument naming what is wrong: no config (neither
// given nor in the metadata), a config without a model_type, or for the GPT example a config
// or a model that differs from GPT-2 (naming the field, its value and GPT-2's) or whose sizes
// disagree with the parameters' shapes.
StatusOr<HfLayout> HfLayoutOf(const Manifest& manifest, const nlohmann::json* given_config);

// The GPT2Config (config.json's object) of the GPT example's model described by `zinf_gpt`
// (its metadata: sizes and architecture). InvalidArgument naming the first way it differs
// from GPT-2.
StatusOr<nlohmann::json> Gpt2ConfigOfZinfGpt(const nlohmann::json& zinf_gpt);

}  // namespace zinf::ckpt

#endif  // ZINF_SRC_CKPT_HF_LAYOUT_H_
