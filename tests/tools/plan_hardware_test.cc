// tools/plan_hardware.h: the node descriptions `zinf plan --hardware` reads (every shipped one
// parses; a bad one is a clear error naming the key), and the plan on described GPUs.
#include "tools/plan_hardware.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "zinf/input_file.h"

namespace zinf::plan {
namespace {

nlohmann::json Node() {
  return {{"zinf_hardware", 1},
          {"name", "test node"},
          {"gpus",
           {{"count", 2},
            {"bf16_tflops", 100},
            {"memory_GiB", 40},
            {"h2d_GBps", 20},
            {"d2h_GBps", 20},
            {"peer_GBps", 50}}},
          {"host", {{"memory_GiB", 512}, {"memory_GBps", 100}, {"cpu_adam_params_per_s", 3e9}}},
          {"nvme", {{{"count", 2}, {"read_GBps", 6}, {"write_GBps", 4}, {"capacity_TB", 4}}}}};
}

std::string ErrorOf(const nlohmann::json& j) {
  StatusOr<NodeHardware> h = NodeHardware::FromJson(j.dump(), "node.json");
  return h.ok() ? "" : h.status().ToString();
}

TEST(PlanHardwareTest, ReadsEveryFigure) {
  StatusOr<NodeHardware> h = NodeHardware::FromJson(Node().dump(), "node.json");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->gpus, 2);
  EXPECT_DOUBLE_EQ(h->gpu_flops, 100e12);
  EXPECT_DOUBLE_EQ(h->training_efficiency, kTrainingEfficiency);
  EXPECT_EQ(h->gpu_memory_bytes, 40ull << 30);
  EXPECT_DOUBLE_EQ(h->h2d_Bps, 20e9);
  EXPECT_DOUBLE_EQ(h->peer_Bps, 50e9);
  EXPECT_EQ(h->host_memory_bytes, 512ull << 30);
  EXPECT_DOUBLE_EQ(h->cpu_adam_params_per_s, 3e9);
  EXPECT_DOUBLE_EQ(h->nvme_read_Bps(), 12e9);
  EXPECT_DOUBLE_EQ(h->nvme_write_Bps(), 8e9);
  EXPECT_EQ(h->nvme_bytes(), 8'000'000'000'000ull);
}

TEST(PlanHardwareTest, BadFiguresAreErrorsNamingTheKey) {
  struct Case {
    std::string what;
    nlohmann::json node;
    std::string expected;
  };
  std::vector<Case> cases;
  auto with = [](auto change) {
    nlohmann::json j = Node();
    change(j);
    return j;
  };
  cases.push_back({"missing", with([](auto& j) { j["gpus"].erase("bf16_tflops"); }),
                   "gpus.bf16_tflops is missing"});
  cases.push_back({"negative", with([](auto& j) { j["host"]["memory_GBps"] = -5; }),
                   "host.memory_GBps must be a number in (0"});
  cases.push_back(
      {"zero", with([](auto& j) { j["nvme"][0]["write_GBps"] = 0; }), "nvme[0].write_GBps"});
  cases.push_back({"string", with([](auto& j) { j["gpus"]["memory_GiB"] = "80GB"; }),
                   "gpus.memory_GiB must be a number"});
  cases.push_back({"unknown key", with([](auto& j) { j["gpus"]["tflops"] = 5; }),
                   "'gpus.tflops' is not recognized"});
  cases.push_back(
      {"unknown top key", with([](auto& j) { j["cpu"] = 5; }), "'cpu' is not recognized"});
  cases.push_back(
      {"no version", with([](auto& j) { j.erase("zinf_hardware"); }), "no \"zinf_hardware\": 1"});
  cases.push_back({"no gpus", with([](auto& j) { j.erase("gpus"); }), "gpus is missing"});
  cases.push_back({"several GPUs, no peers", with([](auto& j) { j["gpus"].erase("peer_GBps"); }),
                   "gpus.peer_GBps is missing"});
  cases.push_back({"fractional count", with([](auto& j) { j["gpus"]["count"] = 1.5; }),
                   "gpus.count must be a whole number"});
  cases.push_back({"efficiency above 1",
                   with([](auto& j) { j["gpus"]["training_efficiency"] = 1.5; }),
                   "gpus.training_efficiency must be a number in (0, 1]"});
  cases.push_back({"drives not a list", with([](auto& j) {
                     j["nvme"] = {{"count", 1}};
                   }),
                   "nvme must be a list of drives"});
  cases.push_back({"not an object", nlohmann::json::array({1, 2}), "not a JSON object"});
  for (const Case& c : cases) {
    const std::string error = ErrorOf(c.node);
    EXPECT_NE(error.find(c.expected), std::string::npos) << c.what << ": " << error;
    EXPECT_NE(error.find("node.json"), std::string::npos) << c.what << ": " << error;
  }
  // A key named twice, text that is not JSON, and JSON nested past kMaxJsonDepth.
  const std::string twice = R"({"zinf_hardware": 1, "zinf_hardware": 1})";
  EXPECT_NE(NodeHardware::FromJson(twice, "x").status().ToString().find("zinf_hardware"),
            std::string::npos);
  EXPECT_FALSE(NodeHardware::FromJson("{\"gpus\": ", "x").ok());
  const std::string deep =
      std::string(kMaxJsonDepth + 1, '[') + std::string(kMaxJsonDepth + 1, ']');
  const Status too_deep = NodeHardware::FromJson(deep, "deep.json").status();
  EXPECT_EQ(too_deep.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_deep.ToString().find("deep"), std::string::npos) << too_deep;
}

TEST(PlanHardwareTest, EveryShippedDescriptionParses) {
  const std::vector<std::string> names = ShippedNames("hardware");
  ASSERT_GE(names.size(), 8u);
  for (const std::string& name : names) {
    StatusOr<std::string> path = ResolveShipped(name, "hardware", "--hardware");
    ASSERT_TRUE(path.ok()) << path.status();
    StatusOr<std::string> text = ReadInputFile(*path, "--hardware");
    ASSERT_TRUE(text.ok()) << text.status();
    StatusOr<NodeHardware> h = NodeHardware::FromJson(*text, *path);
    EXPECT_TRUE(h.ok()) << name << ": " << h.status();
  }
  for (const char* name : {"gpt-10b", "gpt-13b", "gpt-30b", "gpt-70b"}) {
    EXPECT_TRUE(ResolveShipped(name, "models", "--model").ok()) << name;
  }
  const Status unknown = ResolveShipped("no-such-node", "hardware", "--hardware").status();
  EXPECT_NE(unknown.ToString().find("dgx2-v100"), std::string::npos) << unknown;
}

StatusOr<HardwareEstimate> Plan(const ModelSpec& model, OffloadDevice param, OffloadDevice optim,
                                int world = 1) {
  StatusOr<NodeHardware> node = NodeHardware::FromJson(Node().dump(), "node.json");
  if (!node.ok()) return node.status();
  EngineConfig c;
  c.bf16 = true;
  c.offload_param_device = param;
  c.offload_optimizer_device = optim;
  if (param == OffloadDevice::kNvme) c.offload_param_nvme_path = {"/nvme"};
  if (optim == OffloadDevice::kNvme) c.offload_optimizer_nvme_path = {"/nvme"};
  return EstimateOnHardware(model, c, *node, world);
}

// The offload's time does not grow with the micro-batch, the compute does: the tokens that
// hide it are the same whatever the micro-batch, and at them the compute lasts as long as the
// offload (its lanes' busiest, at most the forward and backward, and the optimizer step).
TEST(PlanHardwareTest, HideTokensAreWhereTheComputeOutlastsTheOffload) {
  std::vector<double> hide;
  for (int batch : {1, 4}) {
    StatusOr<ModelSpec> model = GptModel(50257, 1024, 2048, 8, 16, batch);
    ASSERT_TRUE(model.ok());
    StatusOr<HardwareEstimate> e = Plan(*model, OffloadDevice::kCpu, OffloadDevice::kCpu);
    ASSERT_TRUE(e.ok()) << e.status();
    const TimeEstimate& t = e->estimate.time;
    EXPECT_EQ(e->tokens_per_step, 1024.0 * batch);
    const double offload = e->hide_tokens * t.compute / e->tokens_per_step;
    EXPECT_GE(offload, (t.step - t.compute - t.gather) * (1 - 1e-9));
    EXPECT_LE(offload, t.step * (1 + 1e-9));
    EXPECT_GT(e->model_tflops, 0);
    EXPECT_LT(e->model_tflops, 100 * kTrainingEfficiency);
    hide.push_back(e->hide_tokens);
  }
  EXPECT_NEAR(hide[0], hide[1], hide[0] * 1e-6);
}

// More offload, more bytes over the links and fewer in the GPU; two ranks split the shard.
TEST(PlanHardwareTest, PlacementsMoveBytesOffTheGpu) {
  StatusOr<ModelSpec> model = GptModel(50257, 1024, 4096, 16, 32, 2);
  ASSERT_TRUE(model.ok());
  StatusOr<HardwareEstimate> gpu = Plan(*model, OffloadDevice::kNone, OffloadDevice::kCpu);
  StatusOr<HardwareEstimate> cpu = Plan(*model, OffloadDevice::kCpu, OffloadDevice::kCpu);
  StatusOr<HardwareEstimate> nvme = Plan(*model, OffloadDevice::kNvme, OffloadDevice::kNvme);
  StatusOr<HardwareEstimate> two = Plan(*model, OffloadDevice::kCpu, OffloadDevice::kCpu, 2);
  ASSERT_TRUE(gpu.ok() && cpu.ok() && nvme.ok() && two.ok());
  EXPECT_GT(gpu->estimate.memory.peak_device, cpu->estimate.memory.peak_device);
  EXPECT_GT(cpu->estimate.memory.peak_host, nvme->estimate.memory.peak_host);
  EXPECT_GT(nvme->estimate.memory.nvme, 12 * model->parameter_count());
  EXPECT_GT(nvme->estimate.time.nvme_read, 0u);
  EXPECT_LT(two->estimate.memory.peak_host, cpu->estimate.memory.peak_host * 0.6);
  EXPECT_GT(two->estimate.time.bytes_gathered, 0u);
  EXPECT_FALSE(Plan(*model, OffloadDevice::kCpu, OffloadDevice::kCpu, 3).ok());  // 2 GPUs
}

TEST(PlanHardwareTest, AModelTooLargeForTheGpuDoesNotFit) {
  StatusOr<ModelSpec> model = GptModel(50257, 1024, 8192, 24, 64, 1);  // 19.7B
  ASSERT_TRUE(model.ok());
  StatusOr<HardwareEstimate> gpu = Plan(*model, OffloadDevice::kNone, OffloadDevice::kCpu);
  ASSERT_TRUE(gpu.ok());
  EXPECT_FALSE(gpu->estimate.fits);
  EXPECT_NE(gpu->estimate.why.find("GPU: needs"), std::string::npos) << gpu->estimate.why;
  StatusOr<HardwareEstimate> cpu = Plan(*model, OffloadDevice::kCpu, OffloadDevice::kCpu);
  ASSERT_TRUE(cpu.ok());
  EXPECT_TRUE(cpu->estimate.fits) << cpu->estimate.why;
}

}  // namespace
}  // namespace zinf::plan
