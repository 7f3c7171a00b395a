// The GPT example's CUDA backend (examples/gpt/gpt_kernels_cuda.{cc,cu}) against its CPU
// backend, which gpt_test checks against PyTorch: loss, logits and every parameter gradient of
// one micro-batch, bitwise repeatability on the GPU, and a few AdamW steps through the engine;
// bf16 matmuls on tensor cores (the exact product of bf16-rounded inputs up to fp32
// summation, the model against the CPU's fp32 path, a training run whose loss falls, the
// engine's device tensors taken after their ready event and converted there), and layer-major
// micro-batches bitwise the one-by-one schedule there. The GPT computes
// where its engine does, so each GPU run has its engine on cuda:0. Without a GPU (or without
// CUDA built) those skip with CreateCudaDevice's reason, and asking the engine for the GPU
// must fail cleanly with Unavailable instead.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "examples/gpt/gpt_kernels.h"
#include "examples/gpt/gpt_model.h"
#include "tests/gpt/gpt_test_values.h"
#include "tests/gpt/layer_major_run.h"
#include "zinf/device.h"
#include "zinf/dtype.h"
#include "zinf/engine.h"

namespace gpt {
namespace {

using testing::RoundToBf16;
using testing::Values;

using zinf::DeviceKind;
using zinf::Engine;
using zinf::EngineConfig;

// Empty when a GPU is usable; otherwise why not.
std::string CudaUnavailableReason() {
  auto device = zinf::CreateCudaDevice({});
  return device.ok() ? std::string() : device.status().ToString();
}

#define SKIP_WITHOUT_GPU()                                                     \
  do {                                                                         \
    if (const std::string reason = CudaUnavailableReason(); !reason.empty()) { \
      GTEST_SKIP() << reason;                                                  \
    }                                                                          \
  } while (false)

// max |a - b| over max |b|: the error of `a` relative to the size of the tensor `b`.
double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, size = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - b[i]));
    size = std::max(size, std::fabs(double(b[i])));
  }
  return size == 0 ? diff : diff / size;
}

// Small and fp32, with more than one head, block and sequence so that every stride and batch
// of the attention matmuls is exercised.
const GptConfig kConfig{.vocab_size = 96, .seq_len = 16, .d_model = 64, .n_layer = 2, .n_head = 4};
constexpr int kBatch = 3;

// Tolerance. Both backends compute in fp32 (cuBLAS in pedantic math: no TF32) and differ
// only in summation order (GEMM blocking, the reductions of LayerNorm, softmax and
// cross-entropy, the column sums) and in their exp and tanh, as the CPU backend and PyTorch
// do: gpt_test measured at most 6e-7 of each tensor's largest magnitude there and allows 1e-5.
// The same bound holds here; a wrong stride or transpose moves results by O(1).
constexpr double kTolerance = 1e-5;

// An engine computing on `device` (the GPU is cuda:0); the GPT computes where it does.
std::unique_ptr<Engine> MakeEngine(DeviceKind device, const std::string& optimizer = "") {
  // Nothing stays gathered: every module really goes through Fetch and Release.
  auto config = EngineConfig::FromJson(
      R"({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0})" + optimizer +
      "}");
  EXPECT_TRUE(config.ok()) << config.status();
  auto engine = Engine::Create(*config, {.device = device == DeviceKind::kCuda ? "cuda:0" : "host",
                                         .rank = 0,
                                         .world_size = 1,
                                         .optimizer_threads = 1});
  EXPECT_TRUE(engine.ok()) << engine.status();
  return std::move(engine).value();
}

void MakeBatch(int step, std::vector<int32_t>* tokens, std::vector<int32_t>* targets) {
  tokens->resize(kBatch * kConfig.seq_len);
  targets->resize(tokens->size());
  for (size_t i = 0; i < tokens->size(); ++i) {
    // Repeated tokens, so that the embedding backward adds several rows into one.
    (*tokens)[i] = static_cast<int32_t>((i * 37 + 5 + step * 11) % 40);
    (*targets)[i] = static_cast<int32_t>((i * 11 + 1 + step) % kConfig.vocab_size);
  }
}

struct Result {
  double loss = 0, train_loss = 0;
  std::vector<float> logits;
  std::vector<std::vector<float>> grads;  // in parameter_names() order
};

// Loss, logits and gradients of one micro-batch on a freshly initialized model (the engine's
// initialization depends only on the seed and the names, so both devices start equal).
void RunOneBatch(DeviceKind device, bool checkpointing, Result* r) {
  auto engine = MakeEngine(device);
  GptConfig config = kConfig;
  config.activation_checkpointing = checkpointing;
  auto model = Gpt::Create(*engine, config);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(engine->Initialize().ok());
  std::vector<int32_t> tokens, targets;
  MakeBatch(0, &tokens, &targets);
  auto loss = (*model)->Loss(tokens.data(), targets.data(), kBatch, &r->logits);
  ASSERT_TRUE(loss.ok()) << loss.status();
  r->loss = *loss;
  auto train_loss = (*model)->TrainMicroBatch(tokens.data(), targets.data(), kBatch);
  ASSERT_TRUE(train_loss.ok()) << train_loss.status();
  r->train_loss = *train_loss;
  for (const std::string& name : config.parameter_names()) {
    r->grads.emplace_back();
    ASSERT_TRUE(engine->GatherGradient(name, &r->grads.back()).ok()) << name;
  }
}

TEST(GptCudaTest, MatchesTheCpuBackend) {
  SKIP_WITHOUT_GPU();
  for (bool checkpointing : {true, false}) {
    SCOPED_TRACE(checkpointing ? "activation checkpointing" : "no activation checkpointing");
    Result cpu, gpu;
    ASSERT_NO_FATAL_FAILURE(RunOneBatch(DeviceKind::kHost, checkpointing, &cpu));
    ASSERT_NO_FATAL_FAILURE(RunOneBatch(DeviceKind::kCuda, checkpointing, &gpu));
    EXPECT_NEAR(gpu.loss, cpu.loss, kTolerance * cpu.loss);
    EXPECT_EQ(gpu.train_loss, gpu.loss) << "training runs the same forward";
    ASSERT_EQ(gpu.logits.size(), cpu.logits.size());
    EXPECT_LT(RelativeError(gpu.logits, cpu.logits), kTolerance);
    const std::vector<std::string> names = kConfig.parameter_names();
    ASSERT_EQ(gpu.grads.size(), names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      // (The attention key bias's gradient is zero in exact arithmetic, so both sides hold
      // rounding noise there; measured against the whole c_attn bias gradient, as here, the
      // noise is far below the tolerance.)
      EXPECT_LT(RelativeError(gpu.grads[i], cpu.grads[i]), kTolerance) << names[i];
    }
  }
}

TEST(GptCudaTest, RepeatsBitwise) {
  SKIP_WITHOUT_GPU();
  Result a, b;
  ASSERT_NO_FATAL_FAILURE(RunOneBatch(DeviceKind::kCuda, true, &a));
  ASSERT_NO_FATAL_FAILURE(RunOneBatch(DeviceKind::kCuda, true, &b));
  EXPECT_EQ(a.loss, b.loss);
  const std::vector<std::string> names = kConfig.parameter_names();
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(std::memcmp(a.grads[i].data(), b.grads[i].data(), a.grads[i].size() * 4), 0)
        << names[i] << ": no atomics, fixed reduction orders";
  }
}

// Parameters after a few AdamW steps with two micro-batches each.
void Train(DeviceKind device, std::vector<double>* losses,
           std::vector<std::vector<float>>* params) {
  // eps 1e-3 for the reason gpt_ranks_test gives: the key bias's gradient is rounding noise,
  // which Adam would otherwise blow up to a full step.
  auto engine = MakeEngine(
      device, R"(, "gradient_accumulation_steps": 2, "optimizer": {"type": "AdamW", "params":
          {"lr": 0.01, "eps": 0.001, "weight_decay": 0.01}})");
  auto model = Gpt::Create(*engine, kConfig);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(engine->Initialize().ok());
  std::vector<int32_t> tokens, targets;
  for (int step = 0; step < 3; ++step) {
    for (int k = 0; k < 2; ++k) {
      MakeBatch(step * 2 + k, &tokens, &targets);
      auto loss = (*model)->TrainMicroBatch(tokens.data(), targets.data(), kBatch);
      ASSERT_TRUE(loss.ok()) << loss.status();
      losses->push_back(*loss);
    }
    auto summary = engine->Step();
    ASSERT_TRUE(summary.ok()) << summary.status();
  }
  for (const std::string& name : kConfig.parameter_names()) {
    params->emplace_back();
    ASSERT_TRUE(engine->GatherParameter(name, &params->back()).ok()) << name;
  }
}

TEST(GptCudaTest, TrainsToTheWeightsTheCpuBackendDoes) {
  SKIP_WITHOUT_GPU();
  std::vector<double> cpu_losses, gpu_losses;
  std::vector<std::vector<float>> cpu, gpu;
  ASSERT_NO_FATAL_FAILURE(Train(DeviceKind::kHost, &cpu_losses, &cpu));
  ASSERT_NO_FATAL_FAILURE(Train(DeviceKind::kCuda, &gpu_losses, &gpu));
  for (size_t i = 0; i < cpu_losses.size(); ++i) {
    EXPECT_NEAR(gpu_losses[i], cpu_losses[i], 1e-4 * cpu_losses[i]) << "micro-batch " << i;
  }
  // Adam's first steps move every weight by about lr = 0.01 whatever the gradient's size, so
  // rounding differences in the gradients stay far below that: 1e-4 absolute is a hundredth
  // of one step, and parameters are O(1) at most.
  const std::vector<std::string> names = kConfig.parameter_names();
  for (size_t i = 0; i < names.size(); ++i) {
    double diff = 0;
    for (size_t j = 0; j < cpu[i].size(); ++j) {
      diff = std::max(diff, std::fabs(double(gpu[i][j]) - cpu[i][j]));
    }
    EXPECT_LT(diff, 1e-4) << names[i];
  }
}

// Note [Layer-major GPT] on the GPU (the run in tests/gpt/layer_major_run.h): the same cuBLAS
// products of the same shapes and the same order of gradient sums, so bitwise there too.
TEST(GptCudaTest, LayerMajorIsBitwiseTheMicroBatchesOneByOne) {
  SKIP_WITHOUT_GPU();
  testing::ExpectLayerMajorIsBitwiseTheMicroBatchesOneByOne("cuda:0");
}

// ---- bf16 matmuls (cublasGemmStridedBatchedEx, bf16 in, fp32 accumulation).

// The bf16 backend, or the reason there is none (no GPU, or one older than compute
// capability 8.0).
std::unique_ptr<GptKernels> Bf16Kernels(std::string* skip_reason) {
  auto kernels = CreateCudaKernels(0, 0, zinf::ElementType::kBf16);
  if (!kernels.ok()) {
    EXPECT_EQ(kernels.status().code(), zinf::StatusCode::kUnavailable) << kernels.status();
    *skip_reason = kernels.status().ToString();
    return nullptr;
  }
  return std::move(kernels).value();
}

// Device memory holding `bytes` of `host`.
zinf::DeviceBuffer Upload(GptKernels& k, const void* host, size_t bytes) {
  auto buffer = k.device().Allocate(bytes);
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  if (!buffer.ok()) return {};
  auto stream = k.device().CreateStream();
  EXPECT_TRUE(stream.ok()) << stream.status();
  EXPECT_TRUE((*stream)->Copy(buffer->data(), host, bytes, zinf::CopyKind::kHostToDevice).ok());
  EXPECT_TRUE((*stream)->Synchronize().ok());
  return std::move(buffer).value();
}

std::vector<char> Download(GptKernels& k, const void* device, size_t bytes) {
  std::vector<char> out(bytes);
  auto stream = k.device().CreateStream();
  EXPECT_TRUE(stream.ok()) << stream.status();
  EXPECT_TRUE((*stream)->Copy(out.data(), device, bytes, zinf::CopyKind::kDeviceToHost).ok());
  EXPECT_TRUE((*stream)->Synchronize().ok());
  return out;
}

// The forward form y = x W^T + bias and the batched attention form q k^T, with fp32 operands
// converted on the GPU and a weight passed directly in bf16: each element must be the exact
// product of the bf16-rounded inputs up to fp32 summation error. Tensor cores may truncate
// where the CPU rounds, so the bound is twice the CPU test's (k + 3) units of fp32 roundoff of
// sum |a b|; an unrounded operand would miss it by a hundred times that.
TEST(GptCudaTest, Bf16MatmulIsTheExactProductOfRoundedInputs) {
  SKIP_WITHOUT_GPU();
  std::string skip;
  std::unique_ptr<GptKernels> k = Bf16Kernels(&skip);
  if (k == nullptr) GTEST_SKIP() << skip;
  constexpr int64_t kRows = 37, kIn = 50, kOut = 29, kHeads = 3, kT = 11, kHeadDim = 8;
  constexpr int64_t kD = kHeads * kHeadDim;
  const std::vector<float> x = Values(kRows * kIn, 1), w = Values(kOut * kIn, 2),
                           bias = Values(kOut, 3), qkv = Values(kT * 3 * kD, 4);
  std::vector<uint16_t> w_bf16(w.size());
  zinf::ConvertFromFp32(w.data(), zinf::ElementType::kBf16, w_bf16.data(), w.size());
  zinf::DeviceBuffer dx = Upload(*k, x.data(), x.size() * 4),
                     dw = Upload(*k, w_bf16.data(), w_bf16.size() * 2),
                     db = Upload(*k, bias.data(), bias.size() * 4),
                     dqkv = Upload(*k, qkv.data(), qkv.size() * 4);
  auto y = k->device().Allocate(kRows * kOut * 4);
  auto scores = k->device().Allocate(kHeads * kT * kT * 4);
  ASSERT_TRUE(y.ok() && scores.ok());
  k->Matmul(Matrix(dx.as<float>(), kRows, kIn),
            Transposed(Matrix(Tensor{dw.data(), zinf::ElementType::kBf16}, kOut, kIn)),
            Matrix(y->as<float>(), kRows, kOut), db.as<float>());
  auto heads = [&](const float* at) { return Batched(at, kHeads, kT, kHeadDim, kHeadDim, 3 * kD); };
  k->Matmul(heads(dqkv.as<float>()), Transposed(heads(dqkv.as<float>() + kD)),
            Batched(scores->as<float>(), kHeads, kT, kT, kT * kT, kT), nullptr, 0.35f);
  ASSERT_TRUE(k->Synchronize().ok());
  const std::vector<char> y_bytes = Download(*k, y->data(), kRows * kOut * 4),
                          s_bytes = Download(*k, scores->data(), kHeads * kT * kT * 4);
  const float* got_y = reinterpret_cast<const float*>(y_bytes.data());
  const float* got_s = reinterpret_cast<const float*>(s_bytes.data());
  double worst = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t j = 0; j < kOut; ++j) {
      double exact = bias[j], size = std::fabs(bias[j]);
      for (int64_t i = 0; i < kIn; ++i) {
        const double p = double(RoundToBf16(x[r * kIn + i])) * RoundToBf16(w[j * kIn + i]);
        exact += p;
        size += std::fabs(p);
      }
      worst = std::max(worst, std::fabs(got_y[r * kOut + j] - exact) / size / (kIn + 3));
    }
  }
  for (int64_t h = 0; h < kHeads; ++h) {
    for (int64_t r = 0; r < kT; ++r) {
      for (int64_t j = 0; j < kT; ++j) {
        double exact = 0, size = 0;
        for (int64_t i = 0; i < kHeadDim; ++i) {
          const double p = double(RoundToBf16(qkv[r * 3 * kD + h * kHeadDim + i])) *
                           RoundToBf16(qkv[j * 3 * kD + kD + h * kHeadDim + i]);
          exact += p;
          size += std::fabs(p);
        }
        const float got = got_s[(h * kT + r) * kT + j];
        worst = std::max(worst, std::fabs(got - 0.35 * exact) / (0.35 * size) / (kHeadDim + 3));
      }
    }
  }
  EXPECT_LE(worst, 2.0 / (1 << 24)) << "in units of (k + 3) fp32 roundoffs of sum |a b|";
}

// Parameters() on the GPU takes the engine's device tensors once their `ready` event has
// completed (recorded here on another stream, after copies the host does not wait for): fp32
// rounded to bf16 there (nearest even, as the engine rounds on the CPU), bf16 widened exactly,
// and a tensor already of its wanted type handed back as it is, the engine's own memory.
TEST(GptCudaTest, ParametersWaitForTheFetchAndConvertOnTheGpu) {
  SKIP_WITHOUT_GPU();
  std::string skip;
  std::unique_ptr<GptKernels> k = Bf16Kernels(&skip);
  if (k == nullptr) GTEST_SKIP() << skip;
  const std::vector<float> w = Values(5000, 5), g = Values(70, 6);
  std::vector<uint16_t> w_bf16(w.size()), g_bf16(g.size());
  zinf::ConvertFromFp32(w.data(), zinf::ElementType::kBf16, w_bf16.data(), w.size());
  zinf::ConvertFromFp32(g.data(), zinf::ElementType::kBf16, g_bf16.data(), g.size());
  std::vector<float> g_widened(g.size());
  zinf::ConvertToFp32(g_bf16.data(), zinf::ElementType::kBf16, g_widened.data(), g.size());
  auto dw = k->device().Allocate(w.size() * 4), dgb = k->device().Allocate(g.size() * 2),
       dg = k->device().Allocate(g.size() * 4);
  auto fetch = k->device().CreateStream();
  auto ready = k->device().CreateEvent();
  ASSERT_TRUE(dw.ok() && dgb.ok() && dg.ok() && fetch.ok() && ready.ok());
  zinf::Stream& s = **fetch;
  ASSERT_TRUE(s.Copy(dw->data(), w.data(), w.size() * 4, zinf::CopyKind::kHostToDevice).ok());
  ASSERT_TRUE(s.Copy(dgb->data(), g_bf16.data(), g.size() * 2, zinf::CopyKind::kHostToDevice).ok());
  ASSERT_TRUE(s.Copy(dg->data(), g.data(), g.size() * 4, zinf::CopyKind::kHostToDevice).ok());
  ASSERT_TRUE(s.Record(**ready).ok());
  auto out = k->Parameters(
      Slot::kBlock,
      {{dw->data(), zinf::ElementType::kFp32},
       {dgb->data(), zinf::ElementType::kBf16},
       {dg->data(), zinf::ElementType::kFp32}},
      {5000, 70, 70},
      {zinf::ElementType::kBf16, zinf::ElementType::kFp32, zinf::ElementType::kFp32}, ready->get());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].dtype, zinf::ElementType::kBf16);
  EXPECT_EQ((*out)[2].data, dg->data()) << "a tensor of the wanted type is used in place";
  ASSERT_TRUE(k->Synchronize().ok());
  const std::vector<char> w_got = Download(*k, (*out)[0].data, w.size() * 2);
  EXPECT_EQ(std::memcmp(w_got.data(), w_bf16.data(), w.size() * 2), 0);
  const std::vector<char> g_got = Download(*k, (*out)[1].data, g.size() * 4);
  EXPECT_EQ(std::memcmp(g_got.data(), g_widened.data(), g.size() * 4), 0);
}

std::unique_ptr<Engine> MakeBf16Engine(DeviceKind device, const std::string& extra = "") {
  return MakeEngine(device, R"(, "bf16": {"enabled": true})" + extra);
}

// The model with bf16 matmuls on the GPU against the CPU's fp32 path from the same
// bf16-representable parameters, within the tolerance gpt_test derives for the CPU's bf16
// path (GptBf16Test.MatmulsFollowTheFp32Path): 5e-2 of each tensor's largest magnitude.
TEST(GptCudaTest, Bf16MatmulsFollowTheCpuFp32Path) {
  SKIP_WITHOUT_GPU();
  std::string skip;
  if (Bf16Kernels(&skip) == nullptr) GTEST_SKIP() << skip;
  Result r[2];
  const DeviceKind devices[2] = {DeviceKind::kHost, DeviceKind::kCuda};
  const MatmulPrecision precisions[2] = {MatmulPrecision::kFp32, MatmulPrecision::kBf16};
  for (int i = 0; i < 2; ++i) {
    auto engine = MakeBf16Engine(devices[i]);
    auto model = Gpt::Create(*engine, kConfig, {.matmul_precision = precisions[i]});
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_TRUE(engine->Initialize().ok());
    EXPECT_EQ((*model)->matmul_type(),
              i == 0 ? zinf::ElementType::kFp32 : zinf::ElementType::kBf16);
    std::vector<int32_t> tokens, targets;
    MakeBatch(0, &tokens, &targets);
    auto loss = (*model)->Loss(tokens.data(), targets.data(), kBatch, &r[i].logits);
    ASSERT_TRUE(loss.ok()) << loss.status();
    r[i].loss = *loss;
    auto train_loss = (*model)->TrainMicroBatch(tokens.data(), targets.data(), kBatch);
    ASSERT_TRUE(train_loss.ok()) << train_loss.status();
    for (const std::string& name : kConfig.parameter_names()) {
      r[i].grads.emplace_back();
      ASSERT_TRUE(engine->GatherGradient(name, &r[i].grads.back()).ok()) << name;
    }
  }
  constexpr double kBf16Tolerance = 5e-2;
  EXPECT_NEAR(r[1].loss, r[0].loss, 1e-3 * r[0].loss);
  EXPECT_LT(RelativeError(r[1].logits, r[0].logits), kBf16Tolerance);
  const std::vector<std::string> names = kConfig.parameter_names();
  for (size_t i = 0; i < names.size(); ++i) {
    // (The c_attn bias's key part is rounding noise in both; see gpt_test.)
    if (names[i].find("c_attn.bias") != std::string::npos) continue;
    EXPECT_LT(RelativeError(r[1].grads[i], r[0].grads[i]), kBf16Tolerance) << names[i];
  }
}

TEST(GptCudaTest, Bf16TrainingLossFalls) {
  SKIP_WITHOUT_GPU();
  std::string skip;
  if (Bf16Kernels(&skip) == nullptr) GTEST_SKIP() << skip;
  auto engine = MakeBf16Engine(DeviceKind::kCuda, R"(, "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}})");
  auto model = Gpt::Create(*engine, kConfig, {.matmul_precision = MatmulPrecision::kAuto});
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE(engine->Initialize().ok());
  EXPECT_EQ((*model)->matmul_type(), zinf::ElementType::kBf16) << "auto under bf16.enabled";
  std::vector<int32_t> tokens(kBatch * kConfig.seq_len), targets(tokens.size());
  std::vector<double> losses;
  for (int step = 0; step < 40; ++step) {
    // Period 8, as in gpt_test's GptBf16Test.TrainingLossFalls.
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int32_t>(((i + step) % 8) * 7 + 3);
      targets[i] = static_cast<int32_t>(((i + step + 1) % 8) * 7 + 3);
    }
    auto loss = (*model)->TrainMicroBatch(tokens.data(), targets.data(), kBatch);
    ASSERT_TRUE(loss.ok()) << loss.status();
    losses.push_back(*loss);
    ASSERT_TRUE(engine->Step().ok());
  }
  double tail = 0;
  for (size_t i = losses.size() - 10; i < losses.size(); ++i) tail += losses[i] / 10;
  EXPECT_GT(losses.front(), 0.8 * std::log(double(kConfig.vocab_size)));
  EXPECT_LT(tail, 0.75 * std::log(8.0)) << "learnt the transitions, not only the 8 tokens";
}

// Where there is no GPU (always, in a build without CUDA), asking the engine for one, where
// the GPT would compute, is a clean Unavailable naming the device.
TEST(GptCudaTest, UnavailableWithoutAGpu) {
  const std::string reason = CudaUnavailableReason();
  if (reason.empty()) GTEST_SKIP() << "a GPU is usable here";
  auto config = EngineConfig::FromJson(R"({"zero_optimization": {"stage": 3}})");
  ASSERT_TRUE(config.ok()) << config.status();
  for (const char* device : {"cuda", "cuda:0"}) {
    auto engine = Engine::Create(*config, {.device = device, .rank = 0, .world_size = 1});
    ASSERT_FALSE(engine.ok()) << device;
    EXPECT_EQ(engine.status().code(), zinf::StatusCode::kUnavailable) << engine.status();
    EXPECT_NE(engine.status().ToString().find("cuda:0"), std::string::npos) << engine.status();
  }
}

// A CPU run never loads cuBLAS: the CUDA backend opens it only when it is asked for, because
// its libraries alone would add about 150 MiB to every process's RSS.
TEST(GptCudaTest, CpuRunsDoNotLoadCublas) {
  Result r;
  RunOneBatch(DeviceKind::kHost, true, &r);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    EXPECT_EQ(line.find("libcublas"), std::string::npos) << line;
  }
}

}  // namespace
}  // namespace gpt
