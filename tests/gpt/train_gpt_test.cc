// train_gpt end to end under `zinf run`: it trains (the loss falls), writes one JSON line of
// metrics per step, and refuses a bad config naming the key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/tools/run_zinf.h"

namespace {

using zinf::testing::RunZinf;
using zinf::testing::ZinfRun;

class TrainGptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("zinf-train-gpt-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string WriteConfig(const std::string& json) {
    const std::string path = (dir_ / "config.json").string();
    std::ofstream(path) << json;
    return path;
  }

  // `zinf run -n ranks -- train_gpt args`.
  ZinfRun Train(int ranks, const std::string& args) {
    return RunZinf("run -n " + std::to_string(ranks) + " -- " + TRAIN_GPT_BINARY + " " + args);
  }

  std::filesystem::path dir_;
};

TEST_F(TrainGptTest, LossFallsAndMetricsAreJsonLines) {
  const std::string config = WriteConfig(R"({
    "model": {"seq_len": 32, "d_model": 32, "n_layer": 2, "n_head": 2},
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})");
  const std::string metrics = (dir_ / "metrics.jsonl").string();
  const ZinfRun run =
      Train(2, "--config " + config + " --steps 40 --threads 1 --metrics " + metrics);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("[rank 0] done: 40 steps"), std::string::npos) << run.output;

  std::ifstream in(metrics);
  std::vector<double> losses;
  for (std::string line; std::getline(in, line);) {
    const auto m = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(m.is_discarded()) << line;
    EXPECT_EQ(m.at("step").get<int>(), static_cast<int>(losses.size()) + 1) << line;
    for (const char* key :
         {"tokens_per_s", "step_s", "compute_s", "param_wait_s", "grad_reduce_s", "optimizer_s",
          "optimizer_compute_s", "grad_norm", "loss_scale", "host_bytes", "nvme_bytes"}) {
      ASSERT_TRUE(m.contains(key) && m[key].is_number()) << key << " in " << line;
    }
    EXPECT_GT(m["tokens_per_s"].get<double>(), 0) << line;
    EXPECT_EQ(m.at("nvme_read_bytes").get<uint64_t>(), 0u) << "no NVMe in this config";
    EXPECT_TRUE(m.contains("nvme_written_bytes")) << line;
    losses.push_back(m.at("loss").get<double>());
  }
  ASSERT_EQ(losses.size(), 40u);
  // A byte-level model starts near ln 256 = 5.5 and learns the corpus's byte frequencies
  // within a few dozen steps, which alone takes it below 3.5.
  EXPECT_NEAR(losses.front(), std::log(256.0), 0.3);
  double tail = 0;
  for (size_t i = losses.size() - 5; i < losses.size(); ++i) tail += losses[i] / 5;
  EXPECT_LT(tail, losses.front() - 1.5);
}

TEST_F(TrainGptTest, NvmeTrafficIsReported) {
  const std::string config = WriteConfig(R"({
    "model": {"seq_len": 16, "d_model": 32, "n_layer": 1, "n_head": 2},
    "zero_optimization": {"offload_optimizer": {"device": "nvme", "nvme_path": "@NVME_PATH@"}}})");
  const std::string metrics = (dir_ / "metrics.jsonl").string();
  const ZinfRun run = Train(1, "--config " + config + " --nvme-path " + dir_.string() +
                                   " --steps 2 --threads 1 --metrics " + metrics);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::ifstream in(metrics);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const auto m = nlohmann::json::parse(line);
  // The optimizer state of every parameter is read and written back each step.
  EXPECT_GT(m.at("nvme_read_bytes").get<uint64_t>(), 0u) << line;
  EXPECT_GT(m.at("nvme_written_bytes").get<uint64_t>(), 0u) << line;
}

TEST_F(TrainGptTest, BadConfigIsRefusedNamingTheKey) {
  ZinfRun run = Train(1, "--config " + WriteConfig(R"({"model": {"d_modle": 64}})"));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.output.find("model.d_modle is not a known key"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("config.json"), std::string::npos) << "the file is named";

  run = Train(1, "--config " + WriteConfig(R"({"model": {"d_model": 30, "n_head": 4}})"));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.output.find("model.d_model (30) must be a multiple of model.n_head (4)"),
            std::string::npos)
      << run.output;

  run = Train(1, "--config " + WriteConfig(R"({"zero_optimisation": {"stage": 3}})"));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.output.find("'zero_optimisation' is not recognized"), std::string::npos)
      << run.output;

  run = Train(1, "--config " + WriteConfig(R"({"zero_optimization": {"offload_optimizer":
                                   {"device": "nvme", "nvme_path": "@NVME_PATH@"}}})"));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.output.find("give --nvme-path DIR"), std::string::npos) << run.output;

  run = Train(1, "--config " + (dir_ / "missing.json").string());
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.output.find("cannot read config"), std::string::npos) << run.output;
}

}  // namespace
