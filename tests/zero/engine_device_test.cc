// A trainer that computes on a stream of the engine's compute device, as a GPU trainer does:
// it waits for Fetch's ready event on its stream, copies the parameters it needs, writes the
// gradients into the engine's device buffers with device copies, and hands ReduceGradients
// and Release the events its stream recorded (Note [Fetch and release events]). The same
// trainer runs on every device; the trained weights must be bitwise those of the host device:
// - behind a modelled PCIe link (ZINF_HOST_LINK_GBPS), where nothing of the device's memory
//   is touched by the host except through streams: runs everywhere;
// - on cuda:0 (NCCL is not needed with one rank): skipped without a GPU, saying why.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/testing/temp_dir.h"
#include "zero/process_group.h"
#include "zinf/device.h"
#include "zinf/dtype.h"
#include "zinf/engine.h"

namespace zinf {
namespace {

constexpr int kSteps = 3, kAccumulation = 2;
const std::vector<std::vector<ParamSpec>> kModules = {
    {{"embed", {96, 40}}, {"embed.bias", {40}, ParamInit::kZeros}},
    {{"proj", {40, 72}}, {"proj.bias", {72}, ParamInit::kOnes}},
    {{"head", {72, 10}}}};

// Trains kSteps with gradients a fixed function of the fetched (compute-precision) weights
// and the micro-batch; returns every parameter after training, gathered in fp32.
StatusOr<std::vector<float>> TrainOnDevice(const std::string& device, const std::string& nvme) {
  std::string json = R"({"bf16": {"enabled": true}, "gradient_accumulation_steps": 2,
      "gradient_clipping": 1.0, "zero_optimization": {"stage": 3,
      "stage3_param_persistence_threshold": 50, "offload_optimizer": {"device": ")" +
                     std::string(nvme.empty() ? "cpu" : "nvme") + R"(", "nvme_path": ")" + nvme +
                     R"("}}, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})";
  ZINF_ASSIGN_OR_RETURN(EngineConfig config, EngineConfig::FromJson(json));
  ZINF_ASSIGN_OR_RETURN(
      std::unique_ptr<Engine> engine,
      Engine::Create(config,
                     {.device = device, .rank = 0, .world_size = 1, .optimizer_threads = 1}));
  std::vector<int> ids;
  for (size_t m = 0; m < kModules.size(); ++m) {
    ZINF_ASSIGN_OR_RETURN(int id, engine->RegisterModule("m" + std::to_string(m), kModules[m]));
    ids.push_back(id);
  }
  ZINF_RETURN_IF_ERROR(engine->Initialize());
  Device* dev = engine->compute_device();
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, dev->CreateStream());
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Event> used, dev->CreateEvent());
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Event> written, dev->CreateEvent());
  ZINF_ASSIGN_OR_RETURN(HostBuffer weights, dev->AllocateHost(96 * 40 * 2));
  ZINF_ASSIGN_OR_RETURN(HostBuffer grads, dev->AllocateHost(96 * 40 * 4));
  for (int step = 0; step < kSteps; ++step) {
    for (int micro = 0; micro < kAccumulation; ++micro) {
      for (auto it = ids.rbegin(); it != ids.rend(); ++it) {  // backward, last module first
        ZINF_ASSIGN_OR_RETURN(FetchedModule fetched, engine->Fetch(*it));
        ZINF_ASSIGN_OR_RETURN(std::vector<float*> g, engine->Gradients(*it));
        ZINF_RETURN_IF_ERROR(stream->Wait(*fetched.ready));
        for (size_t p = 0; p < fetched.tensors.size(); ++p) {
          const ParamTensor& t = fetched.tensors[p];
          // "Backward": the weights come down, the gradient is computed and goes up.
          ZINF_RETURN_IF_ERROR(
              stream->Copy(weights.data(), t.data, t.numel * 2, CopyKind::kDeviceToHost));
          ZINF_RETURN_IF_ERROR(stream->Synchronize());
          std::vector<float> w(t.numel);
          ConvertToFp32(weights.data(), ElementType::kBf16, w.data(), t.numel);
          float* out = grads.as<float>();
          for (uint64_t i = 0; i < t.numel; ++i) {
            out[i] = 0.5f * w[i] + 0.01f * static_cast<float>((i * 7 + step * 3 + micro) % 13);
          }
          ZINF_RETURN_IF_ERROR(stream->Copy(g[p], out, t.numel * 4, CopyKind::kHostToDevice));
          ZINF_RETURN_IF_ERROR(stream->Synchronize());  // `grads` is reused next
        }
        ZINF_RETURN_IF_ERROR(stream->Record(*written));
        ZINF_RETURN_IF_ERROR(engine->ReduceGradients(*it, written.get()));
        ZINF_RETURN_IF_ERROR(stream->Record(*used));
        ZINF_RETURN_IF_ERROR(engine->Release(*it, used.get()));
      }
    }
    ZINF_RETURN_IF_ERROR(engine->Step().status());
  }
  std::vector<float> all, one;
  for (const auto& module : kModules) {
    for (const ParamSpec& spec : module) {
      ZINF_RETURN_IF_ERROR(engine->GatherParameter(spec.name, &one));
      all.insert(all.end(), one.begin(), one.end());
    }
  }
  return all;
}

class EngineDeviceTest : public ::testing::Test {
 protected:
  void TearDown() override { ::unsetenv("ZINF_HOST_LINK_GBPS"); }
  testing::TempDir tmp_{"zinf-device"};
  const std::string dir_ = tmp_.path();
};

TEST_F(EngineDeviceTest, ModelledLinkTrainsBitwiseAsTheHostDevice) {
  for (const std::string& nvme : {std::string(), dir_}) {
    SCOPED_TRACE(nvme.empty() ? "optimizer in memory" : "optimizer on NVMe");
    StatusOr<std::vector<float>> direct = TrainOnDevice("host", nvme);
    ASSERT_TRUE(direct.ok()) << direct.status();
    ::setenv("ZINF_HOST_LINK_GBPS", "10", 1);
    StatusOr<std::vector<float>> linked = TrainOnDevice("host", nvme);
    ::unsetenv("ZINF_HOST_LINK_GBPS");
    ASSERT_TRUE(linked.ok()) << linked.status();
    EXPECT_TRUE(*linked == *direct) << "the modelled link changed the trained weights";
  }
}

TEST_F(EngineDeviceTest, CudaTrainsBitwiseAsTheHostDevice) {
  StatusOr<std::string> cuda = ResolveComputeDevice("cuda:0", 0);
  if (!cuda.ok()) GTEST_SKIP() << cuda.status().message();
  for (const std::string& nvme : {std::string(), dir_}) {
    SCOPED_TRACE(nvme.empty() ? "optimizer in memory" : "optimizer on NVMe");
    StatusOr<std::vector<float>> host = TrainOnDevice("host", nvme);
    ASSERT_TRUE(host.ok()) << host.status();
    StatusOr<std::vector<float>> gpu = TrainOnDevice(*cuda, nvme);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    EXPECT_TRUE(*gpu == *host) << "the GPU lane changed the trained weights";
  }
}

TEST(ComputeDeviceTest, NamesAreCheckedAndAutoFallsBackToHost) {
  EXPECT_EQ(*ResolveComputeDevice("host", 0), "host");
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:123456"}) {
    StatusOr<std::string> r = ResolveComputeDevice(bad, 0);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status();
  }
  const GpuReport gpus = ProbeGpus();
  StatusOr<std::string> picked = ResolveComputeDevice("auto", 0);
  ASSERT_TRUE(picked.ok()) << picked.status();
  EXPECT_EQ(*picked, gpus.gpus.empty() ? "host" : "cuda:0");
  StatusOr<std::string> missing = ResolveComputeDevice("cuda:99", 0);
  EXPECT_EQ(missing.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(missing.status().message().find("\"cuda:99\""), std::string::npos) << missing.status();
}

}  // namespace
}  // namespace zinf
