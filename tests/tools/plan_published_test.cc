// `zinf plan --hardware` against published results on the hardware the papers used: each case's
// prediction must stay within the tolerance bench/RESULTS.md states for it ("`zinf plan
// --hardware` against published results"). The published figures are fixed facts, so a change
// to the plan that moves a prediction out of its band fails here. The test prints the table.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "tools/plan_hardware.h"
#include "tools/plan_model.h"
#include "zinf/input_file.h"

namespace zinf::plan {
namespace {

StatusOr<NodeHardware> Shipped(const std::string& name) {
  ZINF_ASSIGN_OR_RETURN(std::string path, ResolveShipped(name, "hardware", "--hardware"));
  ZINF_ASSIGN_OR_RETURN(std::string text, ReadInputFile(path, "--hardware"));
  return NodeHardware::FromJson(text, path);
}

// ZeRO-Offload as DeepSpeed runs it on one GPU: fp16, parameters on the GPU, the optimizer
// and gradients on the CPU (zinf's "param none, optim cpu, fp16").
EngineConfig ZeroOffload() {
  EngineConfig c;
  c.zero_stage = 3;
  c.fp16 = true;
  c.offload_param_device = OffloadDevice::kNone;
  c.offload_optimizer_device = OffloadDevice::kCpu;
  return c;
}

// ZeRO-3 Offload: the parameters in host memory too.
EngineConfig Zero3Offload() {
  EngineConfig c = ZeroOffload();
  c.offload_param_device = OffloadDevice::kCpu;
  return c;
}

// ZeRO-Infinity: parameters, optimizer state and gradients on NVMe (and no overlapped step,
// whose room beside the state is zinf's).
EngineConfig ZeroInfinity() {
  EngineConfig c = ZeroOffload();
  c.offload_param_device = OffloadDevice::kNvme;
  c.offload_param_nvme_path = {"/local_nvme"};
  c.offload_optimizer_device = OffloadDevice::kNvme;
  c.offload_optimizer_nvme_path = {"/local_nvme"};
  c.gradients_on_nvme = true;
  c.overlap_optimizer = false;
  return c;
}

void PrintRow(const std::string& source, const std::string& run, const std::string& published,
              const std::string& predicted, const std::string& verdict) {
  std::printf("| %s | %s | %s | %s | %s |\n", source.c_str(), run.c_str(), published.c_str(),
              predicted.c_str(), verdict.c_str());
}

// Ren et al., 2021, "ZeRO-Offload: Democratizing Billion-Scale Model Training" (abstract and
// Figure 7): 40 TFLOPS on one V100 for a 10B model. The model is DeepSpeedExamples'
// ds_zero-offload_10B script's: 50 layers, hidden 4096, 32 heads, sequence 1024, batch 10.
TEST(PlanPublishedTest, ZeroOffload10BOnOneV100) {
  StatusOr<NodeHardware> node = Shipped("v100-zero-offload");
  ASSERT_TRUE(node.ok()) << node.status();
  StatusOr<ModelSpec> model = GptModel(50257, 1024, 4096, 50, 32, 10);
  ASSERT_TRUE(model.ok());
  StatusOr<HardwareEstimate> e = EstimateOnHardware(*model, ZeroOffload(), *node, 1);
  ASSERT_TRUE(e.ok()) << e.status();
  const double published = 40;
  const double error = e->model_tflops / published - 1;
  PrintRow("ZeRO-Offload (Ren et al., 2021), abstract, Fig. 7", "10B GPT-2, 1 V100 32GB, batch 10",
           "40 TFLOPS", std::to_string(e->model_tflops).substr(0, 4) + " TFLOPS",
           std::to_string(static_cast<int>(std::lround(error * 100))) + "%");
  EXPECT_TRUE(e->estimate.fits) << e->estimate.why;
  EXPECT_LE(std::fabs(error), 0.25) << "predicted " << e->model_tflops << " TFLOPS";
}

// Ren et al., 2021 (abstract): ZeRO-Offload trains models of over 13B parameters on one GPU
// (the fp16 parameters on it); DeepSpeed's ZeRO-3 Offload announcement (2021-03-08): 40B on one
// 32 GB V100 with 1.5 TB of host memory once the parameters are offloaded too. Both fit in the
// plan at micro-batch 1; a 40B model with its parameters on the GPU does not.
TEST(PlanPublishedTest, TheModelSizesOneV100Trains) {
  StatusOr<NodeHardware> node = Shipped("v100-zero-offload");
  ASSERT_TRUE(node.ok()) << node.status();
  StatusOr<ModelSpec> b13 = GptModel(50257, 1024, 5120, 40, 40, 1);
  StatusOr<ModelSpec> b40 = GptModel(50257, 1024, 8192, 50, 64, 1);
  ASSERT_TRUE(b13.ok() && b40.ok());
  StatusOr<HardwareEstimate> offload13 = EstimateOnHardware(*b13, ZeroOffload(), *node, 1);
  StatusOr<HardwareEstimate> offload40 = EstimateOnHardware(*b40, ZeroOffload(), *node, 1);
  StatusOr<HardwareEstimate> zero3_40 = EstimateOnHardware(*b40, Zero3Offload(), *node, 1);
  ASSERT_TRUE(offload13.ok() && offload40.ok() && zero3_40.ok());
  PrintRow("ZeRO-Offload (Ren et al., 2021), abstract", "13B on 1 V100, parameters on the GPU",
           "trains", offload13->estimate.fits ? "fits" : "does not fit",
           offload13->estimate.fits ? "agrees" : "misses");
  PrintRow("DeepSpeed ZeRO-3 Offload (2021-03-08), Fig. 3", "40B on 1 V100, parameters on the CPU",
           "trains", zero3_40->estimate.fits ? "fits" : "does not fit",
           zero3_40->estimate.fits ? "agrees" : "misses");
  EXPECT_TRUE(offload13->estimate.fits) << offload13->estimate.why;
  EXPECT_FALSE(offload40->estimate.fits);
  EXPECT_TRUE(zero3_40->estimate.fits) << zero3_40->estimate.why;
}

// Rajbhandari et al., 2021, "ZeRO-Infinity" (abstract): a trillion-parameter model fine-tuned
// on one DGX-2 node, parameters and optimizer state on NVMe. The plan says it does not fit, for
// the GPU: one 25600-wide layer's gathered parameters and gradients are larger than a V100.
// ZeRO-Infinity runs such a layer in tiles (its memory-centric tiling); zinf does not, so this
// is a known miss, held here so that it stays understood.
TEST(PlanPublishedTest, ATrillionOnOneDgx2NeedsTiling) {
  StatusOr<NodeHardware> node = Shipped("dgx2-v100");
  ASSERT_TRUE(node.ok()) << node.status();
  StatusOr<ModelSpec> model = GptModel(50257, 1024, 25600, 128, 160, 1);
  ASSERT_TRUE(model.ok());
  StatusOr<HardwareEstimate> e = EstimateOnHardware(*model, ZeroInfinity(), *node, 16);
  ASSERT_TRUE(e.ok()) << e.status();
  PrintRow("ZeRO-Infinity (Rajbhandari et al., 2021), abstract", "1T on 1 DGX-2, NVMe", "trains",
           e->estimate.fits ? "fits" : "does not fit (" + e->estimate.why + ")",
           e->estimate.fits ? "agrees" : "misses: no memory-centric tiling");
  EXPECT_FALSE(e->estimate.fits);
  EXPECT_NE(e->estimate.why.find("GPU: needs"), std::string::npos) << e->estimate.why;
  EXPECT_EQ(e->estimate.why.find("NVMe"), std::string::npos) << e->estimate.why;
  EXPECT_EQ(e->estimate.why.find("memory:"), std::string::npos) << e->estimate.why;
}

// Rajbhandari et al., 2021 (abstract) and DeepSpeed's ZeRO-3 Offload announcement: 49 TFLOPS
// per GPU for 1T on 512 V100s (32 DGX-2). The plan is one node's, and its V100 sustains
// training_efficiency x 125 TFLOPS at most whatever the batch: its ceiling is below the
// published figure, by the amount RESULTS.md states (the efficiency comes from a 1.2B model's
// narrow layers; 25600-wide ones run their matmuls nearer the peak).
TEST(PlanPublishedTest, TheV100CeilingIsBelowZeroInfinitysTrillionRun) {
  StatusOr<NodeHardware> node = Shipped("dgx2-v100");
  ASSERT_TRUE(node.ok()) << node.status();
  const double ceiling = node->gpu_flops * node->training_efficiency / 1e12;
  PrintRow("ZeRO-Infinity (Rajbhandari et al., 2021), abstract; ZeRO-3 Offload post",
           "1T on 512 V100 (32 DGX-2)", "49 TFLOPS/GPU",
           "at most " + std::to_string(ceiling).substr(0, 4) + " TFLOPS (any batch)",
           "misses: one efficiency per GPU, and one node");
  EXPECT_NEAR(ceiling / 49 - 1, -0.23, 0.02);
}

}  // namespace
}  // namespace zinf::plan
