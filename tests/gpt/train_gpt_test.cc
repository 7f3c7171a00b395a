// train_gpt end to end under `zinf run`: it trains (the loss falls), writes one JSON line of
// metrics per step, and refuses a bad config naming the key; its checkpoints resume bitwise
// after a crash, and two ranks with everything on NVMe train the model one rank does in
// memory (compared through `zinf ckpt export`); --init-from an export trains as --resume from
// its `zinf ckpt import` does; --device cuda without a GPU is refused.
// Input that used to crash it (a huge micro-batch, a deeply nested config, a checkpoint
// directory it cannot search or write, a bad client_state) ends with an error naming the
// cause, and --comm-timeout-s bounds how long a stopped peer goes unreported.
#include <gtest/gtest.h>
#include <unistd.h>

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/checkpoint.h"
#include "tests/testing/safetensors.h"
#include "tests/testing/temp_dir.h"
#include "tests/tools/run_zinf.h"

namespace {

using zinf::testing::RunZinf;
using zinf::testing::ZinfRun;

class TrainGptTest : public ::testing::Test {
 protected:
  std::string WriteConfig(const std::string& json) {
    const std::string path = (dir_ / "config.json").string();
    std::ofstream(path) << json;
    return path;
  }

  // `zinf run -n ranks -- train_gpt args`.
  ZinfRun Train(int ranks, const std::string& args) {
    return RunZinf("run -n " + std::to_string(ranks) + " -- " + TRAIN_GPT_BINARY + " " + args);
  }

  zinf::testing::TempDir tmp_{"zinf-train-gpt"};
  const std::filesystem::path dir_ = tmp_.path();
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
  const double started_s =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() -
      600;
  double last_time_s = started_s;
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
    EXPECT_EQ(m.at("lr").get<double>(), 0.01) << line;
    // When the step finished, Unix seconds: within this run, in step order.
    EXPECT_GE(m.at("time").get<double>(), last_time_s) << line;
    last_time_s = m["time"].get<double>();
    EXPECT_EQ(m.at("nvme_read_bytes").get<uint64_t>(), 0u) << "no NVMe in this config";
    EXPECT_TRUE(m.contains("nvme_written_bytes")) << line;
    losses.push_back(m.at("loss").get<double>());
  }
  ASSERT_EQ(losses.size(), 40u);
  EXPECT_LE(
      last_time_s,
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
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

// A model of a few hundred thousand parameters; `placement` is "memory" or "nvme"
// (parameters and optimizer state). AdamW's eps is 1e-3: some gradients (the attention key
// bias's) are zero in exact arithmetic and rounding noise in practice, and with a tiny eps Adam
// turns that noise into full-size steps that differ between world sizes.
std::string SmallConfig(const std::string& placement, int micro_batch) {
  const std::string offload =
      placement == "nvme" ? R"(, "offload_param": {"device": "nvme", "nvme_path": "@NVME_PATH@"},
               "offload_optimizer": {"device": "nvme", "nvme_path": "@NVME_PATH@"})"
                          : "";
  return R"({"model": {"seq_len": 32, "d_model": 64, "n_layer": 2, "n_head": 4},
    "train_micro_batch_size_per_gpu": )" +
         std::to_string(micro_batch) + R"(, "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100)" +
         offload + R"(},
    "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "eps": 0.001, "weight_decay": 0.01}}})";
}

// Tensor name -> fp32 values, from a safetensors file.
std::map<std::string, std::vector<float>> ReadExport(const std::string& path) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, t] : zinf::testing::ReadSafeTensors(path).tensors) {
    out[name] = t.values<float>();
  }
  return out;
}

TEST_F(TrainGptTest, KilledAfterACheckpointResumesToTheSameWeights) {
  const std::string config = WriteConfig(SmallConfig("nvme", 4));
  const std::string nvme = (dir_ / "nvme").string(), whole = (dir_ / "whole").string(),
                    parts = (dir_ / "parts").string();
  std::filesystem::create_directories(nvme);
  const std::string common = std::string(TRAIN_GPT_BINARY) + " --config " + config +
                             " --nvme-path " + nvme + " --threads 1 --steps 20 ";
  ASSERT_EQ(std::system((common + "--save " + whole + " > /dev/null").c_str()), 0);

  // The same run, killed (SIGKILL) once its step-10 checkpoint is committed.
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string args = common + "--save " + parts + " --save-every 10";
    execl("/bin/sh", "sh", "-c", ("exec " + args + " > /dev/null").c_str(), nullptr);
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!std::filesystem::exists(parts + "/latest") &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the run ended before it could be killed";
  std::ifstream latest(parts + "/latest");
  std::string tag;
  std::getline(latest, tag);
  ASSERT_EQ(tag, "step-10");

  const ZinfRun resumed =
      RunZinf(std::string("run -n 1 -- ") + common + "--resume " + parts + " --save " + parts);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + parts + " at step 10"), std::string::npos)
      << resumed.output;
  for (const std::string& ckpt : {whole, parts}) {
    const ZinfRun exported = RunZinf("ckpt export " + ckpt + " --out " + ckpt + ".safetensors");
    ASSERT_EQ(exported.exit_code, 0) << exported.output;
  }
  const auto a = ReadExport(whole + ".safetensors"), b = ReadExport(parts + ".safetensors");
  ASSERT_EQ(a.size(), 28u);  // 2 embeddings, 12 per block, 2 of ln_f
  EXPECT_TRUE(a == b) << "a resumed run must take bitwise the same steps";
}

TEST_F(TrainGptTest, TwoRanksOnNvmeTrainWhatOneRankDoesInMemory) {
  const std::string nvme = (dir_ / "nvme").string();
  std::filesystem::create_directories(nvme);
  const std::string memory_config = (dir_ / "memory.json").string();
  const std::string nvme_config = (dir_ / "nvme.json").string();
  std::ofstream(memory_config) << SmallConfig("memory", 4);
  std::ofstream(nvme_config) << SmallConfig("nvme", 2);
  const ZinfRun one = Train(
      1, "--config " + memory_config + " --threads 1 --steps 20 --save " + (dir_ / "one").string());
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const ZinfRun two = Train(2, "--config " + nvme_config + " --nvme-path " + nvme +
                                   " --threads 1 --steps 20 --save " + (dir_ / "two").string());
  ASSERT_EQ(two.exit_code, 0) << two.output;
  for (const char* run : {"one", "two"}) {
    const std::string ckpt = (dir_ / run).string();
    ASSERT_EQ(RunZinf("ckpt export " + ckpt + " --out " + ckpt + ".safetensors").exit_code, 0);
  }
  const auto a = ReadExport((dir_ / "one.safetensors").string());
  const auto b = ReadExport((dir_ / "two.safetensors").string());
  ASSERT_EQ(a.size(), b.size());
  // Two ranks sum their halves of the batch in another order than one rank sums the whole,
  // so gradients differ in the last bits and Adam carries that into the weights. After 20
  // steps of lr 3e-3 the weights (|w| ~ 0.02-1) agree to about 1e-6; 1e-4 is still 30 times
  // under one step's size, so a lost micro-batch, shard or step fails it.
  double worst = 0, moved = 0;
  for (const auto& [name, va] : a) {
    const std::vector<float>& vb = b.at(name);
    ASSERT_EQ(va.size(), vb.size()) << name;
    for (size_t i = 0; i < va.size(); ++i)
      worst = std::max(worst, double(std::fabs(va[i] - vb[i])));
  }
  EXPECT_LT(worst, 1e-4);
  std::printf("largest difference one rank in memory vs two on NVMe: %.3g\n", worst);
  // And the comparison is not of two untrained models: training moved the weights.
  const ZinfRun untrained = Train(
      1, "--config " + memory_config + " --threads 1 --steps 1 --save " + (dir_ / "zero").string());
  ASSERT_EQ(untrained.exit_code, 0) << untrained.output;
  ASSERT_EQ(RunZinf("ckpt export " + (dir_ / "zero").string() + " --out " +
                    (dir_ / "zero.safetensors").string())
                .exit_code,
            0);
  for (const auto& [name, v0] : ReadExport((dir_ / "zero.safetensors").string())) {
    for (size_t i = 0; i < v0.size(); ++i)
      moved = std::max(moved, double(std::fabs(v0[i] - a.at(name)[i])));
  }
  EXPECT_GT(moved, 0.02);
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

  // --set replaces keys, and is checked like the file.
  const std::string tiny = WriteConfig(R"({"model": {"d_model": 32, "n_head": 4}})");
  run = Train(1, "--config " + tiny + " --set model.d_model=30");
  EXPECT_NE(run.output.find("model.d_model (30) must be a multiple"), std::string::npos)
      << run.output;
  run = Train(1, "--config " + tiny + " --set zero_optimization.stage=7");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.output.find("stage"), std::string::npos) << run.output;
  run = Train(1, "--config " + tiny + " --set model.d_model.x=1");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.output.find("'model.d_model' is not an object"), std::string::npos) << run.output;
  run = Train(1, "--config " + tiny + " --set nokey");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.output.find("expected KEY.PATH=VALUE"), std::string::npos) << run.output;

  run = Train(1, "--config " + (dir_ / "missing.json").string());
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.output.find("opening --config " + (dir_ / "missing.json").string() +
                            ": No such file or directory"),
            std::string::npos)
      << run.output;
  // A config or corpus that never ends is refused, not read until the OOM killer comes.
  run = Train(1, "--config /dev/zero");
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_NE(run.output.find("--config /dev/zero is not a regular file"), std::string::npos)
      << run.output;
  run = Train(1, "--config " + tiny + " --data /dev/zero");
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_NE(run.output.find("--data /dev/zero is not a regular file"), std::string::npos)
      << run.output;
}

// --device cuda where there is no GPU (or no CUDA build) stops at once with Unavailable and
// the reason, before any training; --device takes only cpu and cuda.
TEST_F(TrainGptTest, DeviceCudaWithoutAGpuIsUnavailable) {
  const std::string config = WriteConfig(R"({
    "model": {"seq_len": 8, "d_model": 16, "n_layer": 1, "n_head": 2},
    "train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})");
  ZinfRun run = Train(1, "--config " + config + " --steps 2 --threads 1 --device cuda");
  if (run.exit_code == 0) GTEST_SKIP() << "a GPU is usable here; trained on it";
  EXPECT_NE(run.output.find("train_gpt: Unavailable: "), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("step 1/2"), std::string::npos) << run.output;

  run = Train(1, "--config " + config + " --device gpu");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.output.find("--device: gpu not in {cpu,cuda}"), std::string::npos) << run.output;
}

// What every refused run must show: exit code 1 and "train_gpt: " with the error, no abort,
// no uncaught exception, and no training step.
void ExpectCleanFailure(const ZinfRun& run, const std::string& message) {
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("train_gpt: "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find(message), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("terminate called"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("step 1/"), std::string::npos) << "no step may run: " << run.output;
}

const char* const kTinyModel =
    R"("model": {"seq_len": 8, "d_model": 16, "n_layer": 1, "n_head": 2})";

// 2^30 is the largest micro-batch the config accepts; its activations are hundreds of TiB.
TEST_F(TrainGptTest, HugeMicroBatchIsRefusedBeforeAllocating) {
  const ZinfRun run = Train(1, "--config " +
                                   WriteConfig(std::string("{") + kTinyModel +
                                               R"(, "train_micro_batch_size_per_gpu":
                                                         1073741824})") +
                                   " --steps 1 --threads 1");
  ExpectCleanFailure(run, "ResourceExhausted: ");
  EXPECT_NE(run.output.find("train_micro_batch_size_per_gpu = 1073741824 needs"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("in all; lower train_micro_batch_size_per_gpu"), std::string::npos)
      << run.output;

  // Dimensions whose product overflows 64 bits are refused as such.
  const ZinfRun overflow =
      Train(1, "--config " +
                   WriteConfig(R"({"model": {"seq_len": 1048576, "d_model": 1048576, "n_head": 1,
                             "n_layer": 1}, "train_micro_batch_size_per_gpu": 1073741824})"));
  ExpectCleanFailure(overflow, "need more than 2^64 bytes");
}

TEST_F(TrainGptTest, DeeplyNestedConfigIsRefused) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  ZinfRun run = Train(1, "--config " + WriteConfig(R"({"model": {"n_layer": )" + deep + "}}"));
  ExpectCleanFailure(run, "config.json nests arrays and objects more than 128 levels deep");
  run = Train(1, "--config " + WriteConfig(R"({"optimizer": )" + deep + "}"));
  ExpectCleanFailure(run, "more than 128 levels deep");
}

// --save is checked before the first step: the run is not lost at its end.
TEST_F(TrainGptTest, SaveDirectoryIsCheckedBeforeTraining) {
  const std::string config = WriteConfig(std::string("{") + kTinyModel + "}");
  std::ofstream((dir_ / "file").string()) << "x";
  ZinfRun run = Train(1, "--config " + config + " --steps 2 --threads 1 --save " +
                             (dir_ / "file" / "ckpt").string());
  ExpectCleanFailure(run, "--save " + (dir_ / "file" / "ckpt").string() +
                              ": cannot create the directory: Not a directory");
  run =
      Train(1, "--config " + config + " --steps 2 --threads 1 --save " + (dir_ / "file").string());
  ExpectCleanFailure(run, "exists and is not a directory");

  if (geteuid() != 0) {  // root writes through permissions
    std::filesystem::create_directories(dir_ / "locked");
    std::filesystem::permissions(
        dir_ / "locked", std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    run = Train(
        1, "--config " + config + " --steps 2 --threads 1 --save " + (dir_ / "locked").string());
    ExpectCleanFailure(run, "cannot write there: Permission denied");
  }
  // A directory that does not exist yet is made, and the run saves there.
  run = Train(1, "--config " + config + " --steps 2 --threads 1 --save " +
                     (dir_ / "new" / "ckpt").string());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(std::filesystem::exists(dir_ / "new" / "ckpt" / "latest"));
}

TEST_F(TrainGptTest, ResumeFromABadCheckpointIsAnError) {
  const std::string config = WriteConfig(std::string("{") + kTinyModel + "}");
  // A directory std::filesystem cannot search (it threw, and the run aborted).
  std::filesystem::create_directory_symlink(dir_ / "loop-b", dir_ / "loop-a");
  std::filesystem::create_directory_symlink(dir_ / "loop-a", dir_ / "loop-b");
  ZinfRun run = Train(
      1, "--config " + config + " --steps 2 --threads 1 --resume " + (dir_ / "loop-a").string());
  ExpectCleanFailure(run, "IoError: ");
  EXPECT_NE(run.output.find("Too many levels of symbolic links"), std::string::npos) << run.output;

  // A checkpoint whose client_state.step is a string (nlohmann threw a type_error).
  const std::string ckpt = (dir_ / "ckpt").string();
  run = Train(1, "--config " + config + " --steps 1 --threads 1 --save " + ckpt);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  auto dir = zinf::ckpt::ResolveCheckpoint(ckpt);
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto manifest = zinf::ckpt::ReadManifest(*dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  manifest->client_state = R"({"step": "1", "seed": 1234})";
  ASSERT_TRUE(zinf::ckpt::WriteManifest(*dir, *manifest).ok());
  run = Train(1, "--config " + config + " --steps 2 --threads 1 --resume " + ckpt);
  ExpectCleanFailure(run, "client_state.step must be a non-negative integer, got \"1\" (string)");
  manifest->client_state = R"({"step": 1, "seed": -5})";
  ASSERT_TRUE(zinf::ckpt::WriteManifest(*dir, *manifest).ok());
  run = Train(1, "--config " + config + " --steps 2 --threads 1 --resume " + ckpt);
  ExpectCleanFailure(run, "client_state.seed must be a non-negative integer, got -5");
}

// train_gpt --init-from an export and --resume from `zinf ckpt import` of it start from the
// same weights with fresh optimizer state at step 0: the same data, so the same losses.
TEST_F(TrainGptTest, InitFromAFileTrainsAsResumingFromItsImport) {
  const std::string config = WriteConfig(SmallConfig("memory", 2));
  const std::string ckpt = (dir_ / "ckpt").string(), file = (dir_ / "m.safetensors").string(),
                    imported = (dir_ / "imported").string();
  const std::string common =
      std::string(TRAIN_GPT_BINARY) + " --config " + config + " --threads 1 --log-every 1 ";
  ASSERT_EQ(std::system((common + "--steps 4 --save " + ckpt + " > /dev/null").c_str()), 0);
  ZinfRun run = RunZinf("ckpt export " + ckpt + " --out " + file);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  run = RunZinf("ckpt import " + file + " --out " + imported + " --config " + config);
  ASSERT_EQ(run.exit_code, 0) << run.output;

  const std::string metrics_a = (dir_ / "a.jsonl").string(),
                    metrics_b = (dir_ / "b.jsonl").string();
  const ZinfRun a = Train(1, "--config " + config + " --threads 1 --steps 2 --init-from " + file +
                                 " --metrics " + metrics_a);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("initialized from " + file), std::string::npos) << a.output;
  const ZinfRun b = Train(1, "--config " + config + " --threads 1 --steps 2 --resume " + imported +
                                 " --metrics " + metrics_b);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("resumed from " + imported + " at step 0"), std::string::npos)
      << b.output;
  auto losses = [](const std::string& path) {
    std::vector<double> out;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
    }
    return out;
  };
  ASSERT_EQ(losses(metrics_a).size(), 2u);
  EXPECT_EQ(losses(metrics_a), losses(metrics_b));
  // Not what a fresh model does: the weights were loaded.
  const std::string metrics_c = (dir_ / "c.jsonl").string();
  ASSERT_EQ(
      Train(1, "--config " + config + " --threads 1 --steps 1 --metrics " + metrics_c).exit_code,
      0);
  EXPECT_NE(losses(metrics_c)[0], losses(metrics_a)[0]);

  // Both at once is refused; so is a file that lacks a parameter, naming it.
  run = Train(1, "--config " + config + " --init-from " + file + " --resume " + imported);
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("excludes"), std::string::npos) << run.output;
  auto tensors = zinf::testing::ReadSafeTensors(file).tensors;
  tensors.erase("ln_f.bias");
  zinf::testing::WriteSafeTensors(file, std::vector<std::pair<std::string, zinf::testing::Tensor>>(
                                            tensors.begin(), tensors.end()));
  ExpectCleanFailure(Train(1, "--config " + config + " --init-from " + file),
                     "has no tensor 'ln_f.bias'");
}

TEST_F(TrainGptTest, CommTimeoutIsAnOptionAndValidated) {
  const ZinfRun help = RunZinf(std::string("run -n 1 -- ") + TRAIN_GPT_BINARY + " --help");
  EXPECT_NE(help.output.find("--comm-timeout-s"), std::string::npos) << help.output;
  const std::string config = WriteConfig(std::string("{") + kTinyModel + "}");
  for (const char* bad : {"0", "-1", "nan", "1e9"}) {
    const ZinfRun run = Train(1, "--config " + config + " --comm-timeout-s " + bad);
    ExpectCleanFailure(run, "--comm-timeout-s must be in [0.001, 86400] seconds");
  }
}

// Two ranks started by hand; rank 1 is stopped (SIGSTOP) once training runs. With
// --comm-timeout-s 2, rank 0 reports it within seconds instead of the default 300.
TEST_F(TrainGptTest, StoppedPeerIsReportedWithinTheCommTimeout) {
  const std::string config =
      WriteConfig(std::string("{") + kTinyModel + R"(, "train_micro_batch_size_per_gpu": 2})");
  const std::string port = std::to_string(20000 + getpid() % 20000);
  const std::string log0 = (dir_ / "rank0.log").string();
  auto start = [&](int rank, const std::string& log) {
    const pid_t pid = fork();
    if (pid == 0) {
      const std::string r = std::to_string(rank);
      setenv("RANK", r.c_str(), 1);
      setenv("LOCAL_RANK", r.c_str(), 1);
      setenv("WORLD_SIZE", "2", 1);
      setenv("LOCAL_WORLD_SIZE", "2", 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", port.c_str(), 1);
      const std::string command = std::string("exec ") + TRAIN_GPT_BINARY + " --config " + config +
                                  " --steps 1000000 --threads 1 --log-every 1 " +
                                  "--comm-timeout-s 2 > " + log + " 2>&1";
      execl("/bin/sh", "sh", "-c", command.c_str(), nullptr);
      _exit(127);
    }
    return pid;
  };
  const pid_t rank0 = start(0, log0), rank1 = start(1, "/dev/null");
  auto read_log = [&] {
    std::ifstream in(log0);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_log().find(" 2/1000000") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_NE(read_log().find(" 2/1000000"), std::string::npos) << read_log();
  kill(rank1, SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  int status = 0;
  pid_t done = 0;
  while ((done = waitpid(rank0, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < stopped + std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
  kill(rank1, SIGKILL);
  waitpid(rank1, nullptr, 0);
  if (done == 0) {
    kill(rank0, SIGKILL);
    waitpid(rank0, nullptr, 0);
  }
  ASSERT_EQ(done, rank0) << "rank 0 did not report the stopped peer within 60 s";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << read_log();
  // Which collective notices, and so the code (DeadlineExceeded, or Unavailable for Gloo's
  // read timeout), depends on where rank 1 stopped; each names a peer rank.
  EXPECT_NE(read_log().find("train_gpt: "), std::string::npos) << read_log();
  EXPECT_NE(read_log().find("a peer rank"), std::string::npos) << read_log();
  EXPECT_LT(seconds, 30) << read_log();
}

}  // namespace
