// `zinf bench profile --quick` and `zinf plan`: the profile is a JSON document that the plan
// reads; the plan prints every placement, writes the fastest one that fits as a DeepSpeed
// config that EngineConfig accepts, and refuses bad input (missing or corrupt profile, bad
// model config, bad counts) with a message naming it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>

#include "tests/testing/temp_dir.h"
#include "tests/tools/run_zinf.h"
#include "tools/plan_model.h"
#include "zinf/engine.h"

namespace zinf {
namespace {

using testing::RunZinf;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class ZinfPlanTest : public ::testing::Test {
 protected:
  // One quick profile for the whole suite (it takes seconds).
  static void SetUpTestSuite() {
    tmp_.emplace("zinf-plan-cli");
    dir_ = tmp_->path();
    std::filesystem::create_directories(dir_ + "/nvme");
    profile_ = dir_ + "/profile.json";
    profile_run_ = RunZinf("bench profile --quick --path " + dir_ + "/nvme --out " + profile_);
  }
  static void TearDownTestSuite() { tmp_.reset(); }

  static std::string Config(const std::string& name) {
    return std::string(ZINF_SOURCE_DIR) + "/examples/" + name;
  }

  static inline std::optional<testing::TempDir> tmp_;
  static inline std::string dir_, profile_;
  static inline testing::ZinfRun profile_run_;
};

TEST_F(ZinfPlanTest, ProfileHasEveryFigureThePlanReads) {
  ASSERT_EQ(profile_run_.exit_code, 0) << profile_run_.output;
  // The progress shows each stage.
  EXPECT_NE(profile_run_.output.find("NVMe write, read and both at once"), std::string::npos);
  EXPECT_NE(profile_run_.output.find("CPU AdamW"), std::string::npos);
  const std::string text = Slurp(profile_);
  StatusOr<plan::MachineProfile> p = plan::MachineProfile::FromJson(text, profile_);
  ASSERT_TRUE(p.ok()) << p.status() << "\n" << text;
  EXPECT_GT(p->nvme_read_Bps, 0);
  EXPECT_GT(p->nvme_write_Bps, 0);
  EXPECT_GT(p->nvme_mixed_Bps, 0);  // reads and writes in flight together
  EXPECT_GT(p->memory_Bps, 0);
  EXPECT_GT(p->OptimizerRate(1), 0);
  EXPECT_GT(p->MatmulRate(1, false), 0);
  EXPECT_GT(p->loop_fp32_flops, 0);
  EXPECT_GT(p->nvme_free_bytes, 0u);
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["quick"], true);
  EXPECT_EQ(j["nvme"]["paths"][0], dir_ + "/nvme");
  EXPECT_GT(j["nvme"]["read_latency_us"].get<double>(), 0);
  EXPECT_GT(j["nvme"]["write_latency_us"].get<double>(), 0);
  EXPECT_TRUE(j["nvme"]["per_path"].empty());  // one path: the striped figure is its own
  EXPECT_GT(p->nvme_read_latency_s, 0);
  // The 2-rank collectives ran (or say why not).
  ASSERT_TRUE(j.contains("collective"));
  EXPECT_TRUE(j["collective"].contains("allgather_GBps") || j["collective"].contains("error"))
      << j["collective"].dump();
  if (j["collective"].contains("allgather_GBps")) {
    // Note [Collectives' CPU]: a rank's CPU per collective and per byte.
    EXPECT_GT(p->collective_cpu_s, 0);
    EXPECT_GE(p->collective_cpu_s_per_byte, 0);
    // Note [Loaded rendezvous]: the engine's fetch loop ran on both ranks, at --quick's two
    // burst lengths, and every figure is one the plan reads back.
    EXPECT_EQ(p->loaded_wait.size(), 2u) << j["collective"].dump();
    for (const auto& row : p->loaded_wait) {
      EXPECT_GT(row.compute_s, 0);
      EXPECT_GT(row.step_s, 0);
    }
    // Note [Loaded shard writes]: the same loop's Steps with the parameters in memory and on
    // the profile's NVMe path.
    const nlohmann::json& writes = j["collective"]["loaded_writes"];
    EXPECT_EQ(writes["shards"], 64) << writes.dump();
    EXPECT_GT(writes["memory_step_us"].get<double>(), 0);
    EXPECT_GT(writes["nvme_step_us"].get<double>(), 0);
  }
}

TEST_F(ZinfPlanTest, ProfileRefusesAMissingDirectory) {
  testing::ZinfRun r = RunZinf("bench profile --quick --no-collective --path " + dir_ +
                               "/missing --out " + dir_ + "/p2.json");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("missing is not an existing directory"), std::string::npos) << r.output;
}

TEST_F(ZinfPlanTest, PlanWritesAConfigTheEngineAccepts) {
  ASSERT_EQ(profile_run_.exit_code, 0) << profile_run_.output;
  const std::string out = dir_ + "/best.json";
  testing::ZinfRun r = RunZinf("plan --model " + Config("gpt/configs/demo.json") + " --profile " +
                               profile_ + " --nvme-path " + dir_ + "/nvme --write-config " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Every placement is a row; the fastest that fits is named.
  for (const char* row : {"param none, optim none, fp32", "param nvme, optim nvme 0.5, bf16",
                          "param cpu, optim cpu, fp16"}) {
    EXPECT_NE(r.output.find(row), std::string::npos) << row << "\n" << r.output;
  }
  EXPECT_NE(r.output.find("fastest that fits:"), std::string::npos) << r.output;
  StatusOr<EngineConfig> c = EngineConfig::FromJsonFile(out);
  ASSERT_TRUE(c.ok()) << c.status() << "\n" << Slurp(out);
  EXPECT_EQ(c->zero_stage, 3);
  EXPECT_EQ(c->micro_batch_size, 8);  // the demo's, kept
  const std::string name = plan::PlacementName(*c);
  EXPECT_NE(r.output.find("fastest that fits: " + name), std::string::npos) << name << "\n"
                                                                            << r.output;
}

// Ranks whose compute takes every core are told that the NVMe lane waits for the cores the
// plan does not charge it; with a core to spare nothing is said.
TEST_F(ZinfPlanTest, PlanSaysWhenTheComputeTakesEveryCore) {
  ASSERT_EQ(profile_run_.exit_code, 0) << profile_run_.output;
  const nlohmann::json j = nlohmann::json::parse(Slurp(profile_));
  const int cores = j["machine"]["cores"].get<int>();
  const std::string plan =
      "plan --model " + Config("gpt/configs/demo.json") + " --profile " + profile_;
  testing::ZinfRun every = RunZinf(plan + " --world-size " + std::to_string(cores));
  ASSERT_EQ(every.exit_code, 0) << every.output;
  EXPECT_NE(every.output.find("the compute takes every core"), std::string::npos) << every.output;
  if (cores > 1) {
    testing::ZinfRun spare = RunZinf(plan + " --threads " + std::to_string(cores - 1));
    ASSERT_EQ(spare.exit_code, 0) << spare.output;
    EXPECT_EQ(spare.output.find("the compute takes every core"), std::string::npos) << spare.output;
  }
}

TEST_F(ZinfPlanTest, PlanJsonListsEveryPlacementWithItsSplit) {
  ASSERT_EQ(profile_run_.exit_code, 0) << profile_run_.output;
  testing::ZinfRun r = RunZinf("plan --json --model " + Config("mlp/configs/memory.json") +
                               " --layers 4 --width 512 --profile " + profile_);
  const nlohmann::json j = testing::JsonOutput(r);
  ASSERT_TRUE(j.is_object()) << r.output;
  ASSERT_EQ(j["placements"].size(), 45u);
  for (const auto& row : j["placements"]) {
    const double sum = row["compute_s"].get<double>() + row["gather_s"].get<double>() +
                       row["reduce_s"].get<double>() + row["optimizer_s"].get<double>() +
                       row["nvme_s"].get<double>();
    EXPECT_NEAR(row["step_s"].get<double>(), sum, 1e-9 + 1e-6 * sum) << row.dump();
    EXPECT_GT(row["compute_s"].get<double>(), 0) << row.dump();
    EXPECT_EQ(row["gradients"],
              row["placement"].get<std::string>().find("grads nvme") == std::string::npos ? "host"
                                                                                          : "nvme");
  }
  // 4 layers of 512 x 512: 1.05M parameters.
  EXPECT_EQ(j["parameters"], 4u * 512 * 513);
  // With --memory too small for anything, nothing fits and no config is written.
  testing::ZinfRun tiny =
      RunZinf("plan --model " + Config("mlp/configs/memory.json") + " --profile " + profile_ +
              " --memory 1MiB --write-config " + dir_ + "/none.json");
  EXPECT_NE(tiny.exit_code, 0);
  EXPECT_NE(tiny.output.find("no placement fits"), std::string::npos) << tiny.output;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/none.json"));
}

// A profile's NVMe rates hold for files like the one they were measured on: the plan marks
// each placement whose swap space outgrows it (a cached virtual disk slows down past it).
TEST_F(ZinfPlanTest, PlanSaysWhenTheSwapOutgrowsTheMeasuredFile) {
  ASSERT_EQ(profile_run_.exit_code, 0) << profile_run_.output;
  nlohmann::json j = nlohmann::json::parse(Slurp(profile_));
  EXPECT_EQ(j["nvme"]["size_bytes"], 64u << 20);  // --quick's file
  for (const uint64_t measured : {uint64_t{1} << 20, uint64_t{1} << 40}) {
    j["nvme"]["size_bytes"] = measured;
    const std::string profile = dir_ + "/measured_" + std::to_string(measured) + ".json";
    std::ofstream(profile) << j.dump();
    testing::ZinfRun r =
        RunZinf("plan --json --model " + Config("gpt/configs/demo.json") + " --profile " + profile);
    const nlohmann::json plan = testing::JsonOutput(r);
    ASSERT_TRUE(plan.is_object()) << r.output;
    int beyond = 0;
    for (const auto& row : plan["placements"]) {
      const bool expected = row["nvme_bytes"].get<uint64_t>() > measured;
      EXPECT_EQ(row["nvme_beyond_measured"], expected) << row.dump();
      beyond += expected;
    }
    EXPECT_EQ(beyond > 0, measured == (uint64_t{1} << 20)) << r.output;
  }
  for (const std::string size : {"lots", "4K"}) {
    testing::ZinfRun bad =
        RunZinf("bench profile --no-collective --nvme-size " + size + " --path " + dir_);
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_NE(bad.output.find(size), std::string::npos) << bad.output;
  }
}

TEST_F(ZinfPlanTest, BadInputIsRefusedByName) {
  // Missing profile.
  testing::ZinfRun r = RunZinf("plan --params 350M --profile " + dir_ + "/no-such-profile.json");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("opening --profile " + dir_ + "/no-such-profile.json: No such file"),
            std::string::npos)
      << r.output;
  // Corrupt profile: not JSON, and a figure of the wrong type.
  const std::string corrupt = dir_ + "/corrupt.json";
  std::ofstream(corrupt) << "{\"zinf_profile\": 1, \"machine\": ";
  r = RunZinf("plan --params 350M --profile " + corrupt);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("is not valid JSON"), std::string::npos) << r.output;
  nlohmann::json j = nlohmann::json::parse(Slurp(profile_));
  j["memory_GBps"] = "fast";
  std::ofstream(corrupt, std::ios::trunc) << j.dump();
  r = RunZinf("plan --params 350M --profile " + corrupt);
  EXPECT_NE(r.output.find("memory_GBps must be a number"), std::string::npos) << r.output;
  // Bad counts.
  for (const char* bad : {"-5", "0", "12Q", "abc"}) {
    r = RunZinf(std::string("plan --params ") + bad);
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_NE(r.output.find("--params"), std::string::npos) << bad << ": " << r.output;
  }
  r = RunZinf("plan --params 1B --layers 0");
  EXPECT_NE(r.output.find("--layers must be >= 1"), std::string::npos) << r.output;
  r = RunZinf("plan --params 1B --world-size 0");
  EXPECT_NE(r.output.find("--world-size must be >= 1"), std::string::npos) << r.output;
  // Bad model configs: a missing file, a bad model key, a bad DeepSpeed key.
  r = RunZinf("plan --model " + dir_ + "/none.json");
  EXPECT_NE(r.output.find("No such file"), std::string::npos) << r.output;
  // Endless or special files are refused before reading (they grew memory until the OOM
  // killer came), and so is nesting that would crash the parser's recursion.
  for (const char* args : {"plan --model /dev/zero", "plan --params 1B --profile /dev/zero"}) {
    r = RunZinf(args);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_NE(r.output.find(" /dev/zero is not a regular file"), std::string::npos) << r.output;
  }
  const std::string deep = dir_ + "/deep.json";
  std::ofstream(deep) << std::string(100000, '[') << std::string(100000, ']');
  for (const std::string& args : {"plan --model " + deep, "plan --params 1B --profile " + deep}) {
    r = RunZinf(args);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_NE(r.output.find("more than 128 levels deep"), std::string::npos) << r.output;
  }
  r = RunZinf("plan --params 1B --threads -3");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--threads"), std::string::npos) << r.output;
  const std::string bad_model = dir_ + "/bad-model.json";
  std::ofstream(bad_model) << R"({"model": {"d_model": 100, "n_head": 3}})";
  r = RunZinf("plan --model " + bad_model);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("n_head (3) must divide model.d_model (100)"), std::string::npos)
      << r.output;
  std::ofstream(bad_model, std::ios::trunc) << R"({"zero_optimization": {"stagee": 3}})";
  r = RunZinf("plan --model " + bad_model);
  EXPECT_NE(r.output.find("stagee"), std::string::npos) << r.output;
  // Both or neither of --model and --params.
  r = RunZinf("plan");
  EXPECT_NE(r.output.find("give one of --model CONFIG and --params N"), std::string::npos)
      << r.output;
  // --write-config without a profile.
  r = RunZinf("plan --params 1B --write-config " + dir_ + "/x.json");
  EXPECT_NE(r.output.find("--write-config needs --profile"), std::string::npos) << r.output;
}

TEST_F(ZinfPlanTest, PlotsTheTimesAndBytes) {
  ASSERT_EQ(profile_run_.exit_code, 0) << profile_run_.output;
  testing::ZinfRun r =
      RunZinf("plan --model " + Config("gpt/configs/demo.json") + " --plot " + dir_ + "/plan.png");
  EXPECT_NE(r.output.find("--plot needs --profile"), std::string::npos) << r.output;
  if (system("command -v gnuplot >/dev/null 2>&1") != 0 && std::getenv("ZINF_GNUPLOT") == nullptr) {
    GTEST_SKIP() << "no gnuplot on this machine";
  }
  r = RunZinf("plan --model " + Config("gpt/configs/demo.json") + " --profile " + profile_ +
              " --plot " + dir_ + "/plan.png");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string png = Slurp(dir_ + "/plan.png");
  ASSERT_GT(png.size(), 8u);
  EXPECT_EQ(png.substr(1, 3), "PNG");
  // An unwritable place fails before anything is computed.
  r = RunZinf("plan --model " + Config("gpt/configs/demo.json") + " --profile " + profile_ +
              " --plot " + dir_ + "/no/such/dir/plan.png");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("no/such/dir"), std::string::npos) << r.output;
}

TEST_F(ZinfPlanTest, SizesWithoutAProfile) {
  // The 1B model of large.json: its fp32 state alone (16 B per parameter) is 15 GiB.
  testing::ZinfRun r = RunZinf("plan --json --model " + Config("gpt/configs/large.json") +
                               " --memory 8GiB --nvme-free 100GiB");
  const nlohmann::json j = testing::JsonOutput(r);
  ASSERT_TRUE(j.is_object()) << r.output;
  EXPECT_TRUE(j["best"].is_null());  // no rates, no choice
  bool infinity_fits = false, memory_fits = false;
  for (const auto& row : j["placements"]) {
    EXPECT_FALSE(row.contains("step_s"));
    if (row["placement"] == "param nvme, optim nvme, fp32") infinity_fits = row["fits"];
    if (row["placement"] == "param none, optim none, fp32") memory_fits = row["fits"];
  }
  EXPECT_TRUE(infinity_fits) << r.output;
  EXPECT_FALSE(memory_fits) << r.output;
}

// `--hardware`: a described node instead of a profile. Each shipped GPT-like shape on the
// shipped 8x H100 node: every placement with its bytes, fit, step time, TFLOPS per GPU and the
// tokens that hide its offload; the fastest written as a config that EngineConfig accepts.
TEST(ZinfPlanHardwareTest, PlansEveryShippedShapeOnADescribedNode) {
  const testing::TempDir tmp("zinf-plan-hw");
  const std::string& dir = tmp.path();
  for (const char* shape : {"gpt-10b", "gpt-13b", "gpt-30b", "gpt-70b"}) {
    SCOPED_TRACE(shape);
    const std::string written = dir + "/" + shape + ".json";
    testing::ZinfRun r = RunZinf(std::string("plan --json --model ") + shape +
                                 " --hardware 8xh100-pcie-8nvme-gen5 --write-config " + written);
    const nlohmann::json j = testing::JsonOutput(r);
    ASSERT_TRUE(j.is_object()) << r.output;
    EXPECT_EQ(j["world_size"], 8);
    ASSERT_EQ(j["placements"].size(), 45u);
    int fitting = 0;
    for (const auto& row : j["placements"]) {
      EXPECT_GT(row["step_s"].get<double>(), 0) << row.dump();
      EXPECT_GT(row["hide_tokens"].get<double>(), 0) << row.dump();
      EXPECT_GT(row["model_tflops_per_gpu"].get<double>(), 0) << row.dump();
      fitting += row["fits"].get<bool>() ? 1 : 0;
    }
    EXPECT_GT(fitting, 0);
    ASSERT_TRUE(j["best"].is_string()) << r.output;
    StatusOr<EngineConfig> config = EngineConfig::FromJson(Slurp(written));
    EXPECT_TRUE(config.ok()) << config.status();
  }
  // A 70B model's bf16 parameters alone (140 GB) are more than one 80 GB GPU: with one rank
  // they fit only off the GPU.
  testing::ZinfRun r =
      RunZinf("plan --json --model gpt-70b --hardware h100-workstation --world-size 1");
  const nlohmann::json j = testing::JsonOutput(r);
  ASSERT_TRUE(j.is_object()) << r.output;
  for (const auto& row : j["placements"]) {
    if (row["offload_param"] == "none") {
      EXPECT_FALSE(row["fits"].get<bool>()) << row.dump();
    }
  }
}

TEST(ZinfPlanHardwareTest, BadHardwareIsRefusedByName) {
  const testing::TempDir tmp("zinf-plan-bad");
  const std::string& dir = tmp.path();
  const std::string file = dir + "/node.json";
  std::ofstream(file) << R"({"zinf_hardware": 1, "gpus": {"count": 1, "bf16_tflops": -1}})";
  testing::ZinfRun r = RunZinf("plan --model gpt-10b --hardware " + file);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("gpus.bf16_tflops must be a number in (0"), std::string::npos)
      << r.output;
  r = RunZinf("plan --model gpt-10b --hardware no-such-node");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("8xh100-pcie-8nvme-gen5"), std::string::npos) << r.output;
  r = RunZinf("plan --model gpt-10b --hardware dgx2-v100 --profile " + file);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("one of --profile FILE and --hardware NODE"), std::string::npos)
      << r.output;
  r = RunZinf("plan --model gpt-10b --hardware dgx2-v100 --world-size 17");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("[1, 16]"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace zinf
