// libFuzzer target: what `zinf ckpt import` and `zinf ckpt export --hf` read from a Hugging
// Face directory besides the weights: model.safetensors.index.json (ParseHfIndex) and a
// config.json given for the GPT example's checkpoint (HfLayoutOf). Any input must give an
// index of plain file names with each tensor once, or a layout whose tensors are the
// checkpoint's parameters, or a Status; a crash, an exception or undefined behaviour is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "ckpt/checkpoint.h"
#include "ckpt/hf.h"
#include "ckpt/hf_layout.h"
#include "core/config_reader.h"

namespace {

// The GPT example's parameters for d_model 4, one block, vocabulary 8 and context 2.
zinf::ckpt::Manifest GptManifest() {
  zinf::ckpt::Manifest m;
  m.tag = "t";
  m.world_size = 1;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    uint64_t numel = 1;
    for (int64_t d : shape) numel *= static_cast<uint64_t>(d);
    m.params.push_back({std::move(name), std::move(shape), numel, numel, m.shard_elements});
    m.shard_elements += numel;
  };
  add("wte.weight", {8, 4});
  add("wpe.weight", {2, 4});
  for (auto [suffix, shape] : std::initializer_list<std::pair<const char*, std::vector<int64_t>>>{
           {"ln_1.weight", {4}},
           {"ln_1.bias", {4}},
           {"attn.c_attn.weight", {12, 4}},
           {"attn.c_attn.bias", {12}},
           {"attn.c_proj.weight", {4, 4}},
           {"attn.c_proj.bias", {4}},
           {"ln_2.weight", {4}},
           {"ln_2.bias", {4}},
           {"mlp.c_fc.weight", {16, 4}},
           {"mlp.c_fc.bias", {16}},
           {"mlp.c_proj.weight", {4, 16}},
           {"mlp.c_proj.bias", {4}}}) {
    add(std::string("h.0.") + suffix, shape);
  }
  add("ln_f.weight", {4});
  add("ln_f.bias", {4});
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto index = zinf::ckpt::ParseHfIndex(text, "fuzz");
  if (index.ok()) {
    std::set<std::string> names;
    for (const auto& [tensor, file] : *index) {
      if (!names.insert(tensor).second || file.empty() || file.find('/') != file.npos) {
        std::abort();
      }
    }
  } else if (index.status().code() == zinf::StatusCode::kInternal) {
    std::abort();
  }
  static const zinf::ckpt::Manifest kGpt = GptManifest();
  auto config = zinf::ParseJson(text, "fuzz");
  if (!config.ok()) return 0;
  auto layout = zinf::ckpt::HfLayoutOf(kGpt, &*config);
  if (layout.ok() && layout->tensors.size() != kGpt.params.size()) std::abort();
  return 0;
}
