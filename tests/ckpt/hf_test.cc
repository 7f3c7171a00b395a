// Hugging Face round trips (src/ckpt/hf.h, hf_layout.h): the GPT example's parameters map to
// GPT-2's names, Conv1D layouts and config, and a model that differs from GPT-2 is refused
// naming the difference; a config that disagrees with the shapes is refused; a checkpoint
// exports to config.json and model.safetensors, sharded with an index above the size limit,
// holding exactly the checkpoint's values; `zinf ckpt import` reads such a directory back,
// its config into the metadata; and an index or directory that disagrees with its shards
// (a shard missing, a tensor named twice, a tensor the shard lacks or the index does not
// name, no config.json, only pickles) is refused naming the file and tensor.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/hf.h"
#include "ckpt/hf_layout.h"
#include "tests/testing/safetensors.h"
#include "tests/testing/temp_dir.h"
#include "tests/tools/run_zinf.h"
#include "zinf/engine.h"

namespace zinf::ckpt {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;
using zinf::testing::F32Tensor;
using zinf::testing::ReadSafeTensors;
using zinf::testing::RunZinf;
using zinf::testing::Tensor;
using zinf::testing::WriteSafeTensors;
using zinf::testing::ZinfRun;

constexpr int64_t kV = 16, kT = 4, kD = 8, kLayers = 2, kHeads = 2;

// The GPT example's description of itself (examples/gpt GptConfig::DescriptionJson).
nlohmann::json GptDescription() {
  return {{"vocab_size", kV},
          {"seq_len", kT},
          {"d_model", kD},
          {"n_layer", kLayers},
          {"n_head", kHeads},
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
}

// The GPT example's parameters (names and shapes as examples/gpt registers them).
std::vector<std::pair<std::string, std::vector<int64_t>>> GptParams() {
  std::vector<std::pair<std::string, std::vector<int64_t>>> p = {{"wte.weight", {kV, kD}},
                                                                 {"wpe.weight", {kT, kD}}};
  for (int i = 0; i < kLayers; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    for (auto [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"ln_1.weight", {kD}},
             {"ln_1.bias", {kD}},
             {"attn.c_attn.weight", {3 * kD, kD}},
             {"attn.c_attn.bias", {3 * kD}},
             {"attn.c_proj.weight", {kD, kD}},
             {"attn.c_proj.bias", {kD}},
             {"ln_2.weight", {kD}},
             {"ln_2.bias", {kD}},
             {"mlp.c_fc.weight", {4 * kD, kD}},
             {"mlp.c_fc.bias", {4 * kD}},
             {"mlp.c_proj.weight", {kD, 4 * kD}},
             {"mlp.c_proj.bias", {kD}}}) {
      p.emplace_back(h + name, shape);
    }
  }
  p.emplace_back("ln_f.weight", std::vector<int64_t>{kD});
  p.emplace_back("ln_f.bias", std::vector<int64_t>{kD});
  return p;
}

Manifest ManifestOf(const std::vector<std::pair<std::string, std::vector<int64_t>>>& params,
                    const nlohmann::json& metadata) {
  Manifest m;
  m.tag = "t";
  m.world_size = 1;
  for (const auto& [name, shape] : params) {
    uint64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    m.params.push_back({name, shape, numel, numel, m.shard_elements});
    m.shard_elements += numel;
  }
  m.metadata = metadata.dump();
  return m;
}

std::string ErrorOf(const StatusOr<HfLayout>& layout) {
  EXPECT_FALSE(layout.ok()) << "accepted";
  return layout.ok() ? "" : std::string(layout.status().message());
}

TEST(HfLayoutTest, TheGptExampleMapsToGpt2) {
  auto layout = HfLayoutOf(ManifestOf(GptParams(), {{"zinf_gpt", GptDescription()}}), nullptr);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->config["model_type"], "gpt2");
  EXPECT_EQ(layout->config["n_embd"], kD);
  EXPECT_EQ(layout->config["n_head"], kHeads);
  EXPECT_EQ(layout->config["n_positions"], kT);
  EXPECT_EQ(layout->config["activation_function"], "gelu_new");
  EXPECT_EQ(layout->config["tie_word_embeddings"], true);
  ASSERT_EQ(layout->tensors.size(), GptParams().size());  // no lm_head: tied
  for (const HfTensor& t : layout->tensors) {
    EXPECT_TRUE(t.name.starts_with("transformer.")) << t.name;
    EXPECT_NE(t.name, "lm_head.weight");
  }
  const HfTensor& c_attn = layout->tensors[4];
  EXPECT_EQ(c_attn.name, "transformer.h.0.attn.c_attn.weight");
  EXPECT_TRUE(c_attn.transpose);
  EXPECT_EQ(c_attn.shape, (std::vector<int64_t>{kD, 3 * kD}));               // Conv1D: [in, out]
  EXPECT_FALSE(layout->tensors[5].transpose);                                // its bias
  EXPECT_EQ(layout->tensors[12].shape, (std::vector<int64_t>{4 * kD, kD}));  // mlp.c_proj
}

TEST(HfLayoutTest, AGptThatDiffersFromGpt2IsRefusedNamingTheDifference) {
  for (auto [key, value, message] :
       {std::tuple{"activation", nlohmann::json("relu"),
                   "its activation is \"relu\", GPT-2's is \"gelu_tanh\""},
        std::tuple{"norm", nlohmann::json("rmsnorm"), "its norm is \"rmsnorm\""},
        std::tuple{"norm_eps", nlohmann::json(1e-6), "its norm_eps is 1e-06"},
        std::tuple{"positions", nlohmann::json("rotary"), "its positions is \"rotary\""},
        std::tuple{"biases", nlohmann::json(false), "its biases is false"},
        std::tuple{"rotary_base", nlohmann::json(10000), "rotary_base 10000, a property GPT-2"}}) {
    SCOPED_TRACE(key);
    nlohmann::json description = GptDescription();
    description[key] = value;
    EXPECT_THAT(ErrorOf(HfLayoutOf(ManifestOf(GptParams(), {{"zinf_gpt", description}}), nullptr)),
                HasSubstr(message));
  }
  nlohmann::json unstated = GptDescription();
  unstated.erase("tied_head");
  EXPECT_THAT(ErrorOf(HfLayoutOf(ManifestOf(GptParams(), {{"zinf_gpt", unstated}}), nullptr)),
              HasSubstr("its tied_head is not stated"));
}

TEST(HfLayoutTest, AGivenConfigMustDescribeTheGptAsItComputes) {
  const Manifest bare = ManifestOf(GptParams(), nlohmann::json::object());
  EXPECT_THAT(ErrorOf(HfLayoutOf(bare, nullptr)), HasSubstr("give --hf-config FILE"));
  const nlohmann::json good = {{"model_type", "gpt2"}, {"vocab_size", kV},   {"n_positions", kT},
                               {"n_embd", kD},         {"n_layer", kLayers}, {"n_head", kHeads}};
  auto layout = HfLayoutOf(bare, &good);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->config, good);
  auto with = [&](const char* key, nlohmann::json value) {
    nlohmann::json c = good;
    c[key] = std::move(value);
    return ErrorOf(HfLayoutOf(bare, &c));
  };
  EXPECT_THAT(with("n_embd", 16), HasSubstr("n_embd is 16, the checkpoint has 8 "
                                            "wte.weight's columns: mismatched shapes"));
  EXPECT_THAT(with("n_layer", 3), HasSubstr("n_layer is 3"));
  EXPECT_THAT(with("n_head", 3), HasSubstr("n_head must divide n_embd 8, got 3"));
  EXPECT_THAT(with("activation_function", "relu"),
              HasSubstr("activation_function is \"relu\", but the GPT example's model computes "
                        "GELU, tanh approximation"));
  EXPECT_THAT(with("tie_word_embeddings", false), HasSubstr("tie_word_embeddings is false"));
  EXPECT_THAT(with("model_type", "llama"), HasSubstr("model_type must be \"gpt2\""));
  // The description's heads against the config's.
  const Manifest described = ManifestOf(GptParams(), {{"zinf_gpt", GptDescription()}});
  nlohmann::json other_heads = good;
  other_heads["n_head"] = 4;
  EXPECT_THAT(ErrorOf(HfLayoutOf(described, &other_heads)),
              HasSubstr("n_head is 4, the checkpoint's model (metadata zinf_gpt) has 2"));
  // A parameter whose shape is not the layout's.
  auto params = GptParams();
  params[4].second = {kD, 3 * kD};
  EXPECT_THAT(ErrorOf(HfLayoutOf(ManifestOf(params, {{"zinf_gpt", GptDescription()}}), nullptr)),
              HasSubstr("parameter 'h.0.attn.c_attn.weight' has shape [8,24], the GPT example's "
                        "model with d_model 8 needs [24,8]"));
}

TEST(HfLayoutTest, OtherModelsKeepTheirNamesAndNeedAConfig) {
  const std::vector<std::pair<std::string, std::vector<int64_t>>> llama = {
      {"model.embed_tokens.weight", {kV, kD}}, {"lm_head.weight", {kV, kD}}};
  const nlohmann::json config = {{"model_type", "llama"}, {"hidden_size", kD}};
  auto layout = HfLayoutOf(ManifestOf(llama, {{"hf_config", config}}), nullptr);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->config, config);
  ASSERT_EQ(layout->tensors.size(), 2u);
  EXPECT_EQ(layout->tensors[1].name, "lm_head.weight");
  EXPECT_FALSE(layout->tensors[1].transpose);
  EXPECT_THAT(ErrorOf(HfLayoutOf(ManifestOf(llama, nlohmann::json::object()), nullptr)),
              HasSubstr("carries no Hugging Face config"));
  const nlohmann::json untyped = {{"hidden_size", kD}};
  EXPECT_THAT(ErrorOf(HfLayoutOf(ManifestOf(llama, nlohmann::json::object()), &untyped)),
              HasSubstr("no \"model_type\""));
}

TEST(HfLayoutTest, ShardSizesReadAsTransformersReadsThem) {
  EXPECT_EQ(*ParseShardSize("5GB"), 5'000'000'000u);
  EXPECT_EQ(*ParseShardSize("500MB"), 500'000'000u);
  EXPECT_EQ(*ParseShardSize("2GiB"), 2ull << 30);
  EXPECT_EQ(*ParseShardSize("100kB"), 100'000u);
  EXPECT_EQ(*ParseShardSize("4096"), 4096u);
  for (const char* bad : {"", "0", "GB", "5TB", "-1", "1.5GB", "99999999999999999999"}) {
    EXPECT_FALSE(ParseShardSize(bad).ok()) << bad;
  }
}

class HfDirectoryTest : public ::testing::Test {
 protected:
  // A checkpoint of the GPT example's layout whose values are their own flat index + 1000 x
  // the parameter's index, saved by an engine with `metadata`.
  std::string SaveGpt(const nlohmann::json& metadata) {
    auto config = EngineConfig::FromJson(R"({"zero_optimization": {"stage": 3}})");
    EXPECT_TRUE(config.ok()) << config.status();
    auto engine = Engine::Create(*config, {.device = "host", .rank = 0, .world_size = 1});
    EXPECT_TRUE(engine.ok()) << engine.status();
    Engine& e = **engine;
    const auto params = GptParams();
    for (const auto& [name, shape] : params) {
      EXPECT_TRUE(e.RegisterModule(name, {{name, shape}}).ok());
    }
    EXPECT_TRUE(e.Initialize().ok());
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(e.SetParameter(params[i].first, Values(i, Numel(params[i].second)).data(),
                                 Numel(params[i].second))
                      .ok());
    }
    EXPECT_TRUE(e.SetCheckpointMetadata(metadata.dump()).ok());
    EXPECT_TRUE(e.SaveCheckpoint(root_ + "/ckpt", "step-1").ok());
    return root_ + "/ckpt";
  }
  static uint64_t Numel(const std::vector<int64_t>& shape) {
    uint64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  static std::vector<float> Values(size_t param, uint64_t numel) {
    std::vector<float> v(numel);
    for (uint64_t j = 0; j < numel; ++j) v[j] = static_cast<float>(1000 * param + j);
    return v;
  }
  void WriteText(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  }
  std::string ErrorOpening(const std::string& dir) {
    auto w = WeightFiles::Open(dir);
    EXPECT_FALSE(w.ok()) << dir << " accepted";
    return w.ok() ? "" : std::string(w.status().ToString());
  }

  testing::TempDir tmp_{"zinf-hf"};
  const std::string root_ = tmp_.path();
};

TEST_F(HfDirectoryTest, ExportWritesGpt2WithTheCheckpointsValuesShardedAsHfDoes) {
  const std::string ckpt = SaveGpt({{"zinf_gpt", GptDescription()}});
  // One shard: model.safetensors, no index.
  HfExportOptions options;
  ASSERT_TRUE(ExportHf(ckpt, root_ + "/one", options).ok());
  EXPECT_TRUE(fs::exists(root_ + "/one/model.safetensors"));
  EXPECT_FALSE(fs::exists(root_ + "/one/" + std::string(kHfIndexFile)));
  const auto one = ReadSafeTensors(root_ + "/one/model.safetensors");
  EXPECT_EQ(one.metadata.at("format"), "pt");
  const auto params = GptParams();
  ASSERT_EQ(one.tensors.size(), params.size());
  // wte as it was; c_attn transposed into Conv1D's [in, out].
  EXPECT_EQ(one.tensors.at("transformer.wte.weight").values<float>(), Values(0, kV * kD));
  const Tensor& c_attn = one.tensors.at("transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(c_attn.shape, (std::vector<int64_t>{kD, 3 * kD}));
  const std::vector<float> original = Values(4, 3 * kD * kD), stored = c_attn.values<float>();
  for (int64_t r = 0; r < 3 * kD; ++r) {
    for (int64_t c = 0; c < kD; ++c) ASSERT_EQ(stored[c * 3 * kD + r], original[r * kD + c]);
  }
  std::ifstream config_file(root_ + "/one/config.json");
  const nlohmann::json config = nlohmann::json::parse(config_file);
  EXPECT_EQ(config["model_type"], "gpt2");
  EXPECT_EQ(config["torch_dtype"], "float32");

  // Shards of at most 1 KB in bf16: each tensor (the largest is 512 bytes) in order, a new shard
  // where the next would pass the limit, and the index naming each.
  options.max_shard_bytes = 1024;
  options.dtype_set = true;
  options.dtype = ElementType::kBf16;
  ASSERT_TRUE(ExportHf(ckpt, root_ + "/sharded", options).ok());
  EXPECT_FALSE(fs::exists(root_ + "/sharded/model.safetensors"));
  std::ifstream index_file(root_ + "/sharded/" + std::string(kHfIndexFile));
  const nlohmann::json index = nlohmann::json::parse(index_file);
  const auto& map = index["weight_map"];
  EXPECT_EQ(map.size(), params.size());
  uint64_t total = 0;
  std::set<std::string> shards;
  for (const auto& [name, file] : map.items()) shards.insert(file.get<std::string>());
  EXPECT_GT(shards.size(), 2u);
  for (const std::string& shard : shards) {
    EXPECT_THAT(shard, ::testing::MatchesRegex("model-0000[0-9]-of-0000" +
                                               std::to_string(shards.size()) + "\\.safetensors"));
    const auto file = ReadSafeTensors(root_ + "/sharded/" + shard);
    uint64_t bytes = 0;
    for (const auto& [name, t] : file.tensors) {
      EXPECT_EQ(map[name], shard);
      EXPECT_EQ(t.dtype, "BF16");
      bytes += t.bytes.size();
    }
    EXPECT_TRUE(bytes <= 1024 || file.tensors.size() == 1) << shard << ": " << bytes;
    total += bytes;
  }
  EXPECT_EQ(index["metadata"]["total_size"], total);
  std::ifstream sharded_config(root_ + "/sharded/config.json");
  EXPECT_EQ(nlohmann::json::parse(sharded_config)["torch_dtype"], "bfloat16");

  // Read back as `zinf ckpt import` reads it: every tensor once, values as exported.
  auto weights = WeightFiles::Open(root_ + "/sharded");
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ(weights->tensors().size(), params.size());
  EXPECT_EQ(nlohmann::json::parse(weights->config_json())["model_type"], "gpt2");
  for (const auto& [file, t] : weights->tensors()) {
    if (t->name != "transformer.wte.weight") continue;
    std::vector<float> v(t->numel);
    ASSERT_TRUE(file->ReadFp32(*t, v.data()).ok());
    EXPECT_EQ(v, Values(0, kV * kD));  // small integers: exact in bf16
  }

  // A directory that is not empty is refused, and left as it was.
  const Status again = ExportHf(ckpt, root_ + "/one", {});
  EXPECT_EQ(again.code(), StatusCode::kFailedPrecondition) << again;
  EXPECT_THAT(again.message(), HasSubstr("is not empty"));
  EXPECT_TRUE(fs::exists(root_ + "/one/model.safetensors"));
  // A refused mapping writes nothing.
  nlohmann::json relu = GptDescription();
  relu["activation"] = "relu";
  fs::remove_all(root_ + "/ckpt");
  const std::string bad = SaveGpt({{"zinf_gpt", relu}});
  const Status refused = ExportHf(bad, root_ + "/refused", {});
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("its activation is \"relu\""));
  EXPECT_FALSE(fs::exists(root_ + "/refused"));
}

TEST_F(HfDirectoryTest, TheCommandLineImportsAnHfDirectoryAndExportsItBackUnchanged) {
  const std::string ckpt = SaveGpt({{"zinf_gpt", GptDescription()}});
  ZinfRun run = RunZinf("ckpt export " + ckpt + " --hf " + root_ + "/hf --max-shard-size 2kB");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // pytorch_model.bin beside it would not be read; the index is.
  run = RunZinf("ckpt import " + root_ + "/hf --out " + root_ + "/imported");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  auto manifest = ReadManifest(root_ + "/imported/imported");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->params.size(), GptParams().size());
  EXPECT_EQ(nlohmann::json::parse(manifest->metadata)["hf_config"]["model_type"], "gpt2");
  // HF names now, its own config: exported as they are, byte for byte.
  run = RunZinf("ckpt export " + root_ + "/imported --hf " + root_ + "/again --max-shard-size 2kB");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (const auto& entry : fs::directory_iterator(root_ + "/hf")) {
    const std::string name = entry.path().filename().string();
    if (name == "config.json" || name.ends_with(".json")) continue;
    const auto a = ReadSafeTensors(entry.path().string());
    const auto b = ReadSafeTensors(root_ + "/again/" + name);
    ASSERT_EQ(a.tensors.size(), b.tensors.size()) << name;
    for (const auto& [tensor, t] : a.tensors) {
      EXPECT_EQ(t.bytes, b.tensors.at(tensor).bytes) << tensor;
      EXPECT_EQ(t.shape, b.tensors.at(tensor).shape) << tensor;
    }
  }
  run = RunZinf("ckpt export " + ckpt + " --out " + root_ + "/x.safetensors --hf-config " + root_ +
                "/hf/config.json");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--hf-config goes with --hf"));
  run = RunZinf("ckpt export " + ckpt);
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("give one of --out FILE or --hf DIR"));
}

TEST_F(HfDirectoryTest, AnIndexThatDisagreesWithItsShardsIsRefusedNamingTheTensor) {
  const std::string dir = root_ + "/hf";
  fs::create_directories(dir);
  WriteText(dir + "/config.json", R"({"model_type": "llama"})");
  WriteSafeTensors(dir + "/model-00001-of-00002.safetensors",
                   {{"a", F32Tensor({1, 2}, {2})}, {"b", F32Tensor({3}, {1})}});
  WriteSafeTensors(dir + "/model-00002-of-00002.safetensors", {{"c", F32Tensor({4}, {1})}});
  const std::string index = dir + "/model.safetensors.index.json";
  auto write_index = [&](const std::string& weight_map) {
    WriteText(index, R"({"metadata": {"total_size": 16}, "weight_map": )" + weight_map + "}");
  };
  const std::string s1 = R"("model-00001-of-00002.safetensors")";
  const std::string s2 = R"("model-00002-of-00002.safetensors")";
  write_index(R"({"c": )" + s2 + R"(, "a": )" + s1 + R"(, "b": )" + s1 + "}");
  auto good = WeightFiles::Open(dir);
  ASSERT_TRUE(good.ok()) << good.status();
  ASSERT_EQ(good->tensors().size(), 3u);
  EXPECT_EQ(good->tensors()[0].tensor->name, "a");  // shard after shard, each in file order
  EXPECT_EQ(good->tensors()[2].tensor->name, "c");

  write_index(R"({"a": )" + s1 + R"(, "b": )" + s1 +
              R"(, "c": "model-00003-of-00003.safetensors"})");
  EXPECT_THAT(ErrorOpening(dir),
              HasSubstr("names shard model-00003-of-00003.safetensors (tensor 'c'), which is "
                        "missing"));
  write_index(R"({"a": )" + s1 + R"(, "b": )" + s1 + R"(, "c": )" + s2 + R"(, "a": )" + s2 + "}");
  EXPECT_THAT(ErrorOpening(dir), HasSubstr("names the key 'a' twice"));
  write_index(R"({"a": )" + s1 + R"(, "b": )" + s1 + R"(, "c": )" + s2 + R"(, "d": )" + s2 + "}");
  EXPECT_THAT(ErrorOpening(dir), HasSubstr("puts tensor 'd' in model-00002-of-00002.safetensors, "
                                           "which lacks it"));
  write_index(R"({"a": )" + s1 + R"(, "c": )" + s2 + "}");
  EXPECT_THAT(ErrorOpening(dir), HasSubstr("holds tensor 'b', which " + index + " does not name"));
  write_index(R"({"a": )" + s1 + R"(, "b": )" + s2 + R"(, "c": )" + s2 + "}");
  EXPECT_THAT(ErrorOpening(dir), HasSubstr("holds tensor 'b', which " + index +
                                           " puts in model-00002-of-00002.safetensors"));
  write_index(R"({"a": "../model.safetensors"})");
  EXPECT_THAT(ErrorOpening(dir), HasSubstr("not a file name in the directory"));
  WriteText(index, R"([1, 2])");
  EXPECT_THAT(ErrorOpening(dir), HasSubstr("not a JSON object"));

  // Mismatched shapes inside a shard: the safetensors reader's own check.
  write_index(R"({"c": )" + s2 + R"(, "a": )" + s1 + R"(, "b": )" + s1 + "}");
  Tensor misshapen = F32Tensor({4}, {1});
  misshapen.shape = {2};
  WriteSafeTensors(dir + "/model-00002-of-00002.safetensors", {{"c", misshapen}});
  EXPECT_THAT(ErrorOpening(dir), HasSubstr("tensor 'c': shape [2] of F32 needs 8 bytes"));

  fs::remove(dir + "/config.json");
  EXPECT_THAT(ErrorOpening(dir), HasSubstr("has no config.json"));
}

TEST_F(HfDirectoryTest, ADirectoryWithoutSafetensorsIsRefusedNamingThem) {
  const std::string dir = root_ + "/pickles";
  fs::create_directories(dir);
  WriteText(dir + "/config.json", R"({"model_type": "gpt2"})");
  EXPECT_THAT(ErrorOpening(dir), HasSubstr("neither model.safetensors nor"));
  WriteText(dir + "/pytorch_model.bin", "PK");
  EXPECT_THAT(ErrorOpening(dir),
              HasSubstr("holds pytorch_model.bin (PyTorch pickles), which zinf does not read: it "
                        "reads safetensors"));
  const ZinfRun run = RunZinf("ckpt import " + dir + " --out " + root_ + "/out");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("which zinf does not read"));
  EXPECT_FALSE(fs::exists(root_ + "/out"));
  // A config that is not an object.
  WriteSafeTensors(dir + "/model.safetensors", {{"a", F32Tensor({1}, {1})}});
  WriteText(dir + "/config.json", "[]");
  EXPECT_THAT(ErrorOpening(dir), HasSubstr("is not a JSON object"));
}

// A config.json that is another model's is refused at import, naming the key and the tensor:
// kept verbatim, `export --hf` would write a directory that from_pretrained refuses.
TEST_F(HfDirectoryTest, AConfigThatDisagreesWithItsTensorsIsRefusedNamingBoth) {
  const std::string dir = root_ + "/gpt2";
  fs::create_directories(dir);
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"transformer.wte.weight", F32Tensor(std::vector<float>(40), {10, 4})},
      {"transformer.wpe.weight", F32Tensor(std::vector<float>(32), {8, 4})}};
  for (int layer = 0; layer < 2; ++layer) {
    tensors.emplace_back("transformer.h." + std::to_string(layer) + ".attn.c_attn.weight",
                         F32Tensor(std::vector<float>(48), {4, 12}));
  }
  WriteSafeTensors(dir + "/model.safetensors", tensors);
  auto config = [&](const std::string& key, int value) {
    nlohmann::json c = {{"model_type", "gpt2"},
                        {"vocab_size", 10},
                        {"n_embd", 4},
                        {"n_positions", 8},
                        {"n_layer", 2}};
    if (!key.empty()) c[key] = value;
    WriteText(dir + "/config.json", c.dump());
  };
  config("", 0);
  ASSERT_TRUE(WeightFiles::Open(dir).ok());
  config("vocab_size", 11);
  EXPECT_THAT(ErrorOpening(dir),
              HasSubstr(dir + "/config.json says vocab_size 11, but tensor "
                              "'transformer.wte.weight' is [10,4] (its rows are the vocabulary)"));
  config("n_embd", 8);
  EXPECT_THAT(ErrorOpening(dir), HasSubstr("says n_embd 8, but tensor 'transformer.wte.weight'"));
  config("n_positions", 1024);
  EXPECT_THAT(ErrorOpening(dir),
              HasSubstr("says n_positions 1024, but tensor 'transformer.wpe.weight' is [8,4]"));
  config("n_layer", 3);
  EXPECT_THAT(ErrorOpening(dir), HasSubstr("says n_layer 3, but the tensors number 2 blocks (the "
                                           "last is 'transformer.h.1.attn.c_attn.weight')"));
  const ZinfRun run = RunZinf("ckpt import " + dir + " --out " + root_ + "/out");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("says n_layer 3"));
  EXPECT_FALSE(fs::exists(root_ + "/out"));
}

// Saving keeps only a directory's newest checkpoint, so an import onto one that holds a
// checkpoint would delete it: refused unless --replace.
TEST_F(HfDirectoryTest, ImportOntoAnotherCheckpointIsRefusedUnlessTold) {
  const std::string dir = root_ + "/bn";
  fs::create_directories(dir);
  WriteText(dir + "/config.json", R"({"model_type": "resnet"})");
  WriteSafeTensors(dir + "/model.safetensors", {{"bn.weight", F32Tensor({1, 2}, {2})}});
  const std::string other = SaveGpt({{"zinf_gpt", GptDescription()}});
  ZinfRun run = RunZinf("ckpt import " + dir + " --out " + other);
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--out " + other + " holds a checkpoint (" + other +
                                    "/latest), which importing there would delete"));
  EXPECT_THAT(run.output, HasSubstr("--replace"));
  auto kept = ReadManifest(other + "/step-1");
  ASSERT_TRUE(kept.ok()) << "the other model's checkpoint was touched: " << kept.status();
  EXPECT_EQ(kept->params.size(), GptParams().size());
  // Without `latest` (a save killed before it committed), its tag directory still counts.
  fs::remove(other + "/latest");
  run = RunZinf("ckpt import " + dir + " --out " + other);
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("holds a checkpoint (" + other + "/step-1)"));
  run = RunZinf("ckpt import " + dir + " --out " + other + " --replace");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_FALSE(fs::exists(other + "/step-1"));
  auto imported = ReadManifest(other + "/imported");
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->params.size(), 1u);
}

TEST_F(HfDirectoryTest, ImportKeepsIntegerTensorsAsBuffers) {
  const std::string dir = root_ + "/bn";
  fs::create_directories(dir);
  WriteText(dir + "/config.json", R"({"model_type": "resnet"})");
  Tensor count{"I64", {}, std::vector<char>(8)};
  const int64_t seven = 7;
  std::memcpy(count.bytes.data(), &seven, 8);
  WriteSafeTensors(dir + "/model.safetensors",
                   {{"bn.weight", F32Tensor({1, 2}, {2})}, {"bn.num_batches_tracked", count}});
  const ZinfRun run = RunZinf("ckpt import " + dir + " --out " + root_ + "/out");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  auto manifest = ReadManifest(root_ + "/out/imported");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  ASSERT_EQ(manifest->params.size(), 1u);
  ASSERT_EQ(manifest->buffers.size(), 1u);
  EXPECT_EQ(manifest->buffers[0].dtype, "I64");
  // Exported back with its config: the counter as it was.
  ASSERT_TRUE(ExportHf(root_ + "/out", root_ + "/back", {}).ok());
  const auto back = ReadSafeTensors(root_ + "/back/model.safetensors");
  EXPECT_EQ(back.tensors.at("bn.num_batches_tracked").values<int64_t>(), std::vector<int64_t>{7});
  EXPECT_EQ(back.tensors.at("bn.weight").values<float>(), (std::vector<float>{1, 2}));
}

TEST_F(HfDirectoryTest, TheEngineKeepsItsMetadataAcrossSaveAndLoad) {
  auto make = [] {
    auto config = EngineConfig::FromJson(R"({"zero_optimization": {"stage": 3}})");
    auto engine = Engine::Create(*config, {.device = "host", .rank = 0, .world_size = 1});
    EXPECT_TRUE(engine.ok()) << engine.status();
    EXPECT_TRUE((*engine)->RegisterModule("m", {{"w", {3}}}).ok());
    EXPECT_TRUE((*engine)->Initialize().ok());
    return std::move(*engine);
  };
  auto saver = make();
  EXPECT_EQ(saver->checkpoint_metadata(), "{}");
  const Status not_object = saver->SetCheckpointMetadata("[1]");
  EXPECT_EQ(not_object.code(), StatusCode::kInvalidArgument) << not_object;
  ASSERT_TRUE(saver->SetCheckpointMetadata(R"({"hf_config": {"model_type": "x"}})").ok());
  ASSERT_TRUE(saver->SaveCheckpoint(root_ + "/m", "t").ok());
  auto loader = make();
  ASSERT_TRUE(loader->LoadCheckpoint(root_ + "/m").ok());
  EXPECT_EQ(nlohmann::json::parse(loader->checkpoint_metadata()),
            nlohmann::json::parse(R"({"hf_config": {"model_type": "x"}})"));
}

TEST(ManifestMetadataTest, MetadataRoundTripsAndRaisesTheVersionOnlyWhenPresent) {
  Manifest m = ManifestOf({{"w", {2}}}, nlohmann::json::object());
  m.engine_state = R"({"steps": 0, "iteration": 0, "last_overflow_iteration": -1,
      "hysteresis_left": 2, "state_count": 2, "loss_scale": 1.0, "optimizer": "adamw"})";
  auto text = SerializeManifest(m);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(nlohmann::json::parse(*text)["format_version"], 2);
  EXPECT_FALSE(nlohmann::json::parse(*text).contains("metadata"));
  m.metadata = R"({"hf_config": {"model_type": "gpt2"}})";
  text = SerializeManifest(m);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(nlohmann::json::parse(*text)["format_version"], 4);
  auto back = ParseManifest(*text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(nlohmann::json::parse(back->metadata), nlohmann::json::parse(m.metadata));
  m.metadata = "[1]";
  EXPECT_FALSE(SerializeManifest(m).ok());
}

}  // namespace
}  // namespace zinf::ckpt
