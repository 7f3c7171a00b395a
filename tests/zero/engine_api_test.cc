// The engine's single-process API beyond training: setting and reading parameters and
// gradients, and the NVMe parameter tier's prefetch, for every placement of parameters and
// optimizer state.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/engine_setup.h"
#include "tests/testing/temp_dir.h"
#include "zinf/device.h"
#include "zinf/dtype.h"
#include "zinf/engine.h"

namespace zinf {
namespace {

struct NamedPlacement {
  const char* name;
  testing::Placement placement;
};
void PrintTo(const NamedPlacement& p, std::ostream* os) { *os << p.name; }

class EngineApiTest : public ::testing::TestWithParam<NamedPlacement> {
 protected:
  // A one-rank engine with modules "a" {a.w [3, 5], a.b [3]} and "b" {b.w [7]}, placed as
  // the test parameter says.
  std::unique_ptr<Engine> MakeEngine(int accumulation = 1) {
    auto config = EngineConfig::FromJson(
        R"({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, )" +
        testing::OffloadJson(GetParam().placement, dir_) + R"(}, "gradient_accumulation_steps": )" +
        std::to_string(accumulation) + "}");
    EXPECT_TRUE(config.ok()) << config.status();
    auto engine = Engine::Create(
        *config, {.device = "host", .rank = 0, .world_size = 1, .optimizer_threads = 1});
    EXPECT_TRUE(engine.ok()) << engine.status();
    EXPECT_TRUE((*engine)->RegisterModule("a", {{"a.w", {3, 5}}, {"a.b", {3}}}).ok());
    EXPECT_TRUE((*engine)->RegisterModule("b", {{"b.w", {7}}}).ok());
    EXPECT_TRUE((*engine)->Initialize().ok());
    return std::move(*engine);
  }

  // One micro-batch: forward a then b, backward b then a (the other way round when
  // `reversed`), with gradient g on each parameter's first element; returns what forward saw.
  std::vector<float> MicroBatch(Engine& e, bool reversed, float g) {
    std::vector<float> seen;
    const std::vector<int> order = reversed ? std::vector<int>{1, 0} : std::vector<int>{0, 1};
    for (int id : order) {
      auto p = e.Fetch(id);
      EXPECT_TRUE(p.ok()) << p.status();
      seen.insert(seen.end(), p->params[0], p->params[0] + (id == 0 ? 15 : 7));
      EXPECT_TRUE(e.Release(id).ok());
    }
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      EXPECT_TRUE(e.Fetch(*it).ok());
      auto grads = e.Gradients(*it);
      EXPECT_TRUE(grads.ok());
      for (float* gp : *grads) gp[0] = g;
      EXPECT_TRUE(e.ReduceGradients(*it).ok());
      EXPECT_TRUE(e.Release(*it).ok());
    }
    return seen;
  }

  testing::TempDir root_{"zinf-engine-api"};
  std::string dir_ = root_.path();  // where the next engine's swap files go
};

TEST_P(EngineApiTest, SetParameterIsWhatFetchAndGatherSee) {
  auto engine = MakeEngine();
  std::vector<float> w(15);
  for (int i = 0; i < 15; ++i) w[i] = 0.5f * i - 3;
  ASSERT_TRUE(engine->SetParameter("a.w", w.data(), w.size()).ok());
  std::vector<float> got;
  ASSERT_TRUE(engine->GatherParameter("a.w", &got).ok());
  EXPECT_EQ(got, w);
  auto fetched = engine->Fetch(0);
  ASSERT_TRUE(fetched.ok());
  EXPECT_EQ(std::vector<float>(fetched->params[0], fetched->params[0] + 15), w);
  ASSERT_TRUE(engine->Release(0).ok());

  EXPECT_EQ(engine->SetParameter("a.w", w.data(), 14).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->SetParameter("nope", w.data(), 15).code(), StatusCode::kInvalidArgument);
}

TEST_P(EngineApiTest, SetParameterSurvivesAStepAsTheOptimizerSeesIt) {
  auto engine = MakeEngine();
  std::vector<float> w(15, 1.0f);
  ASSERT_TRUE(engine->SetParameter("a.w", w.data(), w.size()).ok());
  for (int id : {0, 1}) {
    ASSERT_TRUE(engine->Fetch(id).ok());
    ASSERT_TRUE(engine->Gradients(id).ok());  // zero gradients: AdamW only decays (wd 0: none)
    ASSERT_TRUE(engine->ReduceGradients(id).ok());
    ASSERT_TRUE(engine->Release(id).ok());
  }
  auto summary = engine->Step();
  ASSERT_TRUE(summary.ok());
  std::vector<float> got;
  ASSERT_TRUE(engine->GatherParameter("a.w", &got).ok());
  EXPECT_EQ(got, w) << "a zero gradient must leave the set value in place";
  // Memory per tier: gradient accumulators at least on the host; swap files only with NVMe.
  EXPECT_GE(summary->host_bytes, 25u * 4);
  EXPECT_EQ(summary->nvme_bytes > 0,
            GetParam().placement.optimizer_nvme || GetParam().placement.params_nvme);
}

TEST_P(EngineApiTest, GatherGradientIsTheMeanOverMicroBatches) {
  auto engine = MakeEngine(/*accumulation=*/2);
  for (int micro = 0; micro < 2; ++micro) {
    ASSERT_TRUE(engine->Fetch(0).ok());
    auto grads = engine->Gradients(0);
    ASSERT_TRUE(grads.ok());
    for (int i = 0; i < 15; ++i) (*grads)[0][i] = static_cast<float>(i + 10 * micro);
    for (int i = 0; i < 3; ++i) (*grads)[1][i] = -1.0f;
    ASSERT_TRUE(engine->ReduceGradients(0).ok());
    ASSERT_TRUE(engine->Release(0).ok());
  }
  std::vector<float> g;
  ASSERT_TRUE(engine->GatherGradient("a.w", &g).ok());
  ASSERT_EQ(g.size(), 15u);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(g[i], i + 5.0f) << i;
  ASSERT_TRUE(engine->GatherGradient("a.b", &g).ok());
  EXPECT_EQ(g, std::vector<float>(3, -1.0f));
  EXPECT_EQ(engine->GatherGradient("nope", &g).code(), StatusCode::kInvalidArgument);
}

// Prefetching follows the first step's order; a later step in another order must still see
// the current values (read on demand), equal to those of an engine that always keeps order.
TEST_P(EngineApiTest, FetchOrderChangeStaysCorrect) {
  auto steady = MakeEngine();
  dir_ += "/second";  // each engine needs swap files of its own
  std::filesystem::create_directories(dir_);
  auto changing = MakeEngine();
  for (int step = 0; step < 4; ++step) {
    const float g = 0.5f * (step + 1);
    const std::vector<float> expected = MicroBatch(*steady, false, g);
    std::vector<float> seen = MicroBatch(*changing, step == 2, g);
    if (step == 2) std::rotate(seen.begin(), seen.begin() + 7, seen.end());  // b came first
    EXPECT_EQ(seen, expected) << "step " << step;
    ASSERT_TRUE(steady->Step().ok());
    ASSERT_TRUE(changing->Step().ok());
  }
}

// stage3_max_live_parameters bounds what prefetching keeps live: with room for module a
// (18 elements) alone, fetching a must not read b (7) ahead; with the default it does.
TEST(EnginePrefetchTest, MaxLiveParametersBoundsPrefetching) {
  for (const uint64_t max_live : {18u, 1000u}) {
    const testing::TempDir tmp("zinf-max-live");
    const std::string& dir = tmp.path();
    auto config = EngineConfig::FromJson(
        R"({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
            "stage3_max_live_parameters": )" +
        std::to_string(max_live) + R"(, "offload_param": {"device": "nvme", "nvme_path": ")" + dir +
        R"("}}})");
    ASSERT_TRUE(config.ok()) << config.status();
    auto engine = Engine::Create(
        *config, {.device = "host", .rank = 0, .world_size = 1, .optimizer_threads = 1});
    ASSERT_TRUE(engine.ok()) << engine.status();
    Engine& e = **engine;
    ASSERT_TRUE(e.RegisterModule("a", {{"a.w", {3, 5}}, {"a.b", {3}}}).ok());
    ASSERT_TRUE(e.RegisterModule("b", {{"b.w", {7}}}).ok());
    ASSERT_TRUE(e.Initialize().ok());
    uint64_t peak = 0;
    for (int step = 0; step < 3; ++step) {
      for (int id : {0, 1}) {
        ASSERT_TRUE(e.Fetch(id).ok());
        auto grads = e.Gradients(id);
        ASSERT_TRUE(grads.ok());
        ASSERT_TRUE(e.ReduceGradients(id).ok());
        ASSERT_TRUE(e.Release(id).ok());
      }
      auto summary = e.Step();
      ASSERT_TRUE(summary.ok()) << summary.status();
      peak = summary->peak_live_parameters;  // steps after the first prefetch
    }
    EXPECT_EQ(peak, max_live == 18u ? 18u : 25u) << "max_live " << max_live;
  }
}

// The read-ahead window is stage3_prefetch_bucket_size elements past the module fetched,
// reads already in flight included: with 8 modules of 7 elements and a window of 14, at most
// the fetched module and the next two are live, however many steps run.
TEST(EnginePrefetchTest, PrefetchWindowDoesNotGrow) {
  const testing::TempDir tmp("zinf-window");
  const std::string& dir = tmp.path();
  auto config = EngineConfig::FromJson(
      R"({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
          "stage3_prefetch_bucket_size": 14, "offload_param": {"device": "nvme",
          "nvme_path": ")" +
      dir + R"("}}})");
  ASSERT_TRUE(config.ok()) << config.status();
  auto engine = Engine::Create(
      *config, {.device = "host", .rank = 0, .world_size = 1, .optimizer_threads = 1});
  ASSERT_TRUE(engine.ok()) << engine.status();
  Engine& e = **engine;
  for (int m = 0; m < 8; ++m) {
    ASSERT_TRUE(e.RegisterModule("m" + std::to_string(m), {{"w" + std::to_string(m), {7}}}).ok());
  }
  ASSERT_TRUE(e.Initialize().ok());
  for (int step = 0; step < 3; ++step) {
    for (int id = 0; id < 8; ++id) {
      ASSERT_TRUE(e.Fetch(id).ok());
      ASSERT_TRUE(e.Gradients(id).ok());
      ASSERT_TRUE(e.ReduceGradients(id).ok());
      ASSERT_TRUE(e.Release(id).ok());
    }
    auto summary = e.Step();
    ASSERT_TRUE(summary.ok()) << summary.status();
    EXPECT_EQ(summary->peak_live_parameters, step == 0 ? 7u : 21u) << "step " << step;
  }
}

// A model of 2^18 modules (as n_layer 2^18 would give) registers in linear time: the name
// checks are lookups, not scans of what is registered.
TEST(EngineRegistrationTest, ManyModulesRegisterInLinearTime) {
  auto config = EngineConfig::FromJson("{}");
  ASSERT_TRUE(config.ok());
  auto engine = Engine::Create(
      *config, {.device = "host", .rank = 0, .world_size = 1, .optimizer_threads = 1});
  ASSERT_TRUE(engine.ok()) << engine.status();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < (1 << 18); ++i) {
    const std::string name = "layer" + std::to_string(i);
    ASSERT_TRUE((*engine)->RegisterModule(name, {{name + ".w", {4}}}).ok()) << i;
  }
  // Quadratic checks take minutes here (3.4e10 comparisons); linear ones well under a second.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  EXPECT_EQ((*engine)->RegisterModule("layer7", {{"x", {1}}}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(EngineRegistrationTest, ImpossibleSizesFailAtOnceSayingWhatTheyNeed) {
  auto config = EngineConfig::FromJson("{}");
  ASSERT_TRUE(config.ok());
  auto engine = Engine::Create(
      *config, {.device = "host", .rank = 0, .world_size = 1, .optimizer_threads = 1});
  ASSERT_TRUE(engine.ok()) << engine.status();
  Engine& e = **engine;
  // A shape whose element count overflows 64 bits.
  auto overflow = e.RegisterModule("huge", {{"huge.w", {int64_t{1} << 40, int64_t{1} << 40}}});
  EXPECT_EQ(overflow.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(overflow.status().message().find("huge.w"), std::string::npos) << overflow.status();
  // A duplicate inside one module leaves nothing behind: the module registers once fixed.
  EXPECT_EQ(e.RegisterModule("m", {{"m.w", {2}}, {"m.w", {2}}}).status().code(),
            StatusCode::kInvalidArgument);
  // 2^40 elements: 16 TiB of accumulators, master and Adam state, more than any test machine.
  ASSERT_TRUE(e.RegisterModule("m", {{"m.w", {int64_t{1} << 40}}}).ok());
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = e.Initialize();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("GiB of host memory"), std::string::npos) << s;
  EXPECT_NE(s.message().find("this machine has"), std::string::npos) << s;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

// A swap file's content is checksummed (zinf.nvme_checksum, on by default): a byte flipped
// on disk under a parameter is DataLoss naming the file and offset, not a silently wrong
// weight. With the key off the same flip goes unnoticed, which is what the key costs.
TEST(EngineChecksumTest, FlippedSwapByteIsDataLoss) {
  for (const bool checksum : {true, false}) {
    const testing::TempDir tmp("zinf-flip");
    const std::string& dir = tmp.path();
    auto config = EngineConfig::FromJson(
        R"({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
            "offload_param": {"device": "nvme", "nvme_path": ")" +
        dir + R"("}}, "zinf": {"nvme_checksum": )" + (checksum ? "true" : "false") + "}}");
    ASSERT_TRUE(config.ok()) << config.status();
    auto engine = Engine::Create(
        *config, {.device = "host", .rank = 0, .world_size = 1, .optimizer_threads = 1});
    ASSERT_TRUE(engine.ok()) << engine.status();
    Engine& e = **engine;
    ASSERT_TRUE(e.RegisterModule("a", {{"a.w", {64, 64}}}).ok());
    ASSERT_TRUE(e.Initialize().ok());
    std::vector<float> before;
    ASSERT_TRUE(e.GatherParameter("a.w", &before).ok());
    // The swap file, by this process's descriptor (it may be unlinked already).
    int flipped = 0;
    for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      const std::string target = std::filesystem::read_symlink(fd.path(), ec).string();
      if (ec || target.find("zinf-swap-rank0") == std::string::npos) continue;
      const int f = open(fd.path().c_str(), O_RDWR);
      ASSERT_GE(f, 0) << target;
      char byte = 0;
      ASSERT_EQ(pread(f, &byte, 1, 2), 1);
      byte ^= 0x10;  // a high mantissa bit of a.w[0], which no rounding hides
      ASSERT_EQ(pwrite(f, &byte, 1, 2), 1);
      close(f);
      ++flipped;
    }
    ASSERT_EQ(flipped, 1) << "one swap file";
    auto fetched = e.Fetch(0);
    if (checksum) {
      ASSERT_EQ(fetched.status().code(), StatusCode::kDataLoss) << fetched.status();
      EXPECT_NE(fetched.status().message().find("zinf-swap-rank0"), std::string::npos)
          << fetched.status();
      EXPECT_NE(fetched.status().message().find("offset"), std::string::npos) << fetched.status();
    } else {
      ASSERT_TRUE(fetched.ok()) << fetched.status();
      EXPECT_NE(fetched->params[0][0], before[0]) << "the flip reached the weight unnoticed";
      EXPECT_EQ(fetched->params[0][1], before[1]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Zero, EngineApiTest,
                         ::testing::Values(NamedPlacement{"memory", {false, false}},
                                           NamedPlacement{"optimizer_nvme", {true, false}},
                                           NamedPlacement{"params_nvme", {false, true}},
                                           NamedPlacement{"all_nvme", {true, true}}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace zinf

namespace zinf {
namespace {

// A model larger than one chunk of the NVMe optimizer step (8M elements), with a parameter
// that straddles the chunk boundary: its new values reach the parameter tier in two pieces.
// Every placement must give bitwise what the all-in-memory engine gives, in every compute
// precision (Note [Compute precision]): with bf16 or fp16 every placement computes with the
// same 16-bit weights, the parameter tier moves half the bytes, and the master stays fp32.
class EngineMultiChunkTest : public ::testing::TestWithParam<ElementType> {};

struct MultiChunkRun {
  std::vector<float> master;     // GatherParameter after the last step
  bool fetched_rounded = true;   // every fetched value is one of the precision's
  uint64_t nvme_read_bytes = 0;  // in the last step
};

TEST_P(EngineMultiChunkTest, EveryPlacementMatchesMemoryBitwise) {
  const ElementType precision = GetParam();
  const testing::TempDir root("zinf-multichunk");
  auto run = [&](const std::string& placement) {
    const std::string dir = root.Sub(placement);
    const std::string nvme = R"({"device": "nvme", "nvme_path": ")" + dir + "\"}";
    // Half the optimizer's chunks on NVMe, half in host memory (zinf.optimizer_nvme_ratio).
    const std::string half_nvme = R"({"device": "nvme", "nvme_path": ")" + dir + "\"}";
    const bool params_nvme = placement == "params_nvme" || placement == "all_nvme";
    const bool optimizer_nvme = placement == "optimizer_nvme" || placement == "all_nvme";
    auto config = EngineConfig::FromJson(
        R"({"zero_optimization": {"stage": 3, "offload_optimizer": )" +
        (placement == "optimizer_half_nvme" ? half_nvme
         : optimizer_nvme                   ? nvme
                                            : R"({"device": "cpu"})") +
        R"(, "offload_param": )" + (params_nvme ? nvme : R"({"device": "none"})") +
        R"(}, "bf16": {"enabled": )" + (precision == ElementType::kBf16 ? "true" : "false") +
        R"(}, "fp16": {"enabled": )" + (precision == ElementType::kFp16 ? "true" : "false") +
        R"(}, "zinf": {"optimizer_nvme_ratio": )" +
        (placement == "optimizer_half_nvme" ? "0.5" : "1") + "}}");
    EXPECT_TRUE(config.ok()) << config.status();
    auto engine = Engine::Create(*config, {.device = "host", .rank = 0, .world_size = 1});
    EXPECT_TRUE(engine.ok()) << engine.status();
    Engine& e = **engine;
    const std::vector<uint64_t> sizes = {3000000, 6000000, 500000};  // 8M boundary inside p1
    EXPECT_TRUE(e.RegisterModule("m0", {{"p0", {3000000}}}).ok());
    EXPECT_TRUE(e.RegisterModule("m1", {{"p1", {6000000}}, {"p2", {500000}}}).ok());
    EXPECT_TRUE(e.Initialize().ok());
    MultiChunkRun result;
    std::vector<uint16_t> half(2);  // room for one fp32 value too
    float back = 0;
    for (int step = 0; step < 2; ++step) {
      for (int id : {0, 1}) {
        auto p = e.Fetch(id);
        auto g = e.Gradients(id);
        EXPECT_TRUE(p.ok() && g.ok());
        for (size_t k = 0; k < p->params.size(); ++k) {
          const uint64_t n = sizes[id == 0 ? 0 : 1 + k];
          for (uint64_t i = 0; i < n; i += 997) {
            ConvertFromFp32(&p->params[k][i], precision, half.data(), 1);
            ConvertToFp32(half.data(), precision, &back, 1);
            result.fetched_rounded &= back == p->params[k][i];
          }
          for (uint64_t i = 0; i < n; ++i) g->at(k)[i] = std::sin(50.0f * p->params[k][i] + step);
        }
        EXPECT_TRUE(e.ReduceGradients(id).ok());
        EXPECT_TRUE(e.Release(id).ok());
      }
      auto summary = e.Step();
      EXPECT_TRUE(summary.ok()) << summary.status();
      if (summary.ok()) result.nvme_read_bytes = summary->bytes_nvme_read;
    }
    std::vector<float> one;
    for (const char* name : {"p0", "p1", "p2"}) {
      EXPECT_TRUE(e.GatherParameter(name, &one).ok());
      result.master.insert(result.master.end(), one.begin(), one.end());
    }
    return result;
  };
  const MultiChunkRun memory = run("memory");
  EXPECT_TRUE(memory.fetched_rounded);
  uint64_t optimizer_nvme_read = 0;
  for (const char* placement :
       {"params_nvme", "optimizer_nvme", "optimizer_half_nvme", "all_nvme"}) {
    const MultiChunkRun other = run(placement);
    if (std::string(placement) == "optimizer_nvme") optimizer_nvme_read = other.nvme_read_bytes;
    if (std::string(placement) == "optimizer_half_nvme") {
      // One of the two 8M-element chunks stays in host memory.
      EXPECT_GT(other.nvme_read_bytes, 0u);
      EXPECT_LT(other.nvme_read_bytes, optimizer_nvme_read);
    }
    EXPECT_TRUE(other.master == memory.master) << placement;
    EXPECT_TRUE(other.fetched_rounded) << placement;
    if (std::string(placement) == "params_nvme") {
      // One read of each shard per fetch (no prefetch needed twice): the tier's bytes.
      EXPECT_EQ(other.nvme_read_bytes, 9500000 * ElementSize(precision)) << placement;
    }
  }
  if (precision != ElementType::kFp32) {
    // The master is not rounded: some of its values lie between the 16-bit ones.
    size_t unrounded = 0;
    std::vector<uint16_t> h(memory.master.size());
    std::vector<float> back(memory.master.size());
    ConvertFromFp32(memory.master.data(), precision, h.data(), h.size());
    ConvertToFp32(h.data(), precision, back.data(), back.size());
    for (size_t i = 0; i < back.size(); ++i) unrounded += back[i] != memory.master[i];
    EXPECT_GT(unrounded, memory.master.size() / 2);
  }
}

INSTANTIATE_TEST_SUITE_P(Zero, EngineMultiChunkTest,
                         ::testing::Values(ElementType::kFp32, ElementType::kBf16,
                                           ElementType::kFp16),
                         [](const auto& info) { return std::string(ElementTypeName(info.param)); });

}  // namespace
}  // namespace zinf

namespace zinf {
namespace {

// Every ready-made config the examples ship is one the engine takes (the GPT's "model"
// object is train_gpt's own and is left out, as train_gpt does).
TEST(ShippedConfigsTest, EngineTakesEveryExampleConfig) {
  int checked = 0;
  for (const char* example : {"mlp", "gpt"}) {
    const std::filesystem::path dir =
        std::filesystem::path(ZINF_SOURCE_DIR) / "examples" / example / "configs";
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      std::ifstream in(entry.path());
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      nlohmann::json json = nlohmann::json::parse(text);
      json.erase("model");
      std::string config = json.dump();
      for (size_t at; (at = config.find("@NVME_PATH@")) != std::string::npos;) {
        config.replace(at, 11, "/tmp");
      }
      const auto parsed = EngineConfig::FromJson(config);
      EXPECT_TRUE(parsed.ok()) << entry.path() << ": " << parsed.status();
      ++checked;
    }
  }
  EXPECT_GE(checked, 9);
}

}  // namespace
}  // namespace zinf

namespace zinf {
namespace {

// local_rank() is torchrun's LOCAL_RANK (0 when unset): the GPU a trainer picks.
TEST(EngineEnvironmentTest, LocalRankComesFromTheEnvironment) {
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) unsetenv(v);
  auto config = EngineConfig::FromJson("{}");
  ASSERT_TRUE(config.ok());
  auto plain = Engine::Create(*config, {.device = "host", .rank = 0, .world_size = 1});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->local_rank(), 0);
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "4", 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  setenv("LOCAL_RANK", "1", 1);
  auto launched = Engine::Create(*config, {.device = "host", .rank = 0, .world_size = 1});
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) unsetenv(v);
  ASSERT_TRUE(launched.ok()) << launched.status();
  EXPECT_EQ((*launched)->local_rank(), 1);
}

// The compute device: the host device works, a GPU that is not there is refused at Create
// with a message naming it; and Fetch hands out the compute-precision tensors beside the fp32
// view.
TEST(EngineDeviceTest, HostDeviceTensorsAndMissingGpusRefused) {
  auto config = EngineConfig::FromJson(R"({"bf16": {"enabled": true}})");
  ASSERT_TRUE(config.ok());
  auto cuda = Engine::Create(*config, {.device = "cuda:99", .rank = 0, .world_size = 1});
  EXPECT_EQ(cuda.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(cuda.status().message().find("\"cuda:99\""), std::string::npos) << cuda.status();
  auto engine = Engine::Create(*config, {.device = "host", .rank = 0, .world_size = 1});
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE((*engine)->RegisterModule("m", {{"w", {3, 5}}}).ok());
  ASSERT_TRUE((*engine)->Initialize().ok());
  auto fetched = (*engine)->Fetch(0);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  ASSERT_EQ(fetched->tensors.size(), 1u);
  EXPECT_EQ(fetched->tensors[0].dtype, ElementType::kBf16);
  EXPECT_EQ(fetched->tensors[0].numel, 15u);
  std::vector<float> widened(15);
  ConvertToFp32(fetched->tensors[0].data, ElementType::kBf16, widened.data(), 15);
  EXPECT_EQ(widened, std::vector<float>(fetched->params[0], fetched->params[0] + 15));
  EXPECT_TRUE((*engine)->Release(0).ok());
}

// The default device is "auto": cuda:LOCAL_RANK where this node has that GPU, else the host
// device. "cuda" insists on that GPU; other names are refused naming what is allowed.
TEST(EngineDeviceTest, AutoPicksTheLocalGpuOrTheHost) {
  unsetenv("LOCAL_RANK");
  auto config = EngineConfig::FromJson("{}");
  ASSERT_TRUE(config.ok());
  const bool gpu = !ProbeGpus().gpus.empty();
  auto picked = Engine::Create(*config, {.rank = 0, .world_size = 1});
  ASSERT_TRUE(picked.ok()) << picked.status();
  EXPECT_EQ((*picked)->compute_device_name(), gpu ? "cuda:0" : "host");
  auto cuda = Engine::Create(*config, {.device = "cuda", .rank = 0, .world_size = 1});
  if (gpu) {
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    EXPECT_EQ((*cuda)->compute_device_name(), "cuda:0");
  } else {
    EXPECT_EQ(cuda.status().code(), StatusCode::kUnavailable) << cuda.status();
    EXPECT_NE(cuda.status().message().find("\"cuda:0\""), std::string::npos) << cuda.status();
  }
  auto bad = Engine::Create(*config, {.device = "gpu0", .rank = 0, .world_size = 1});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find("\"cuda:N\""), std::string::npos) << bad.status();
}

// EngineOptions::fp32_view off: Fetch hands out the bf16 tensors alone, and training goes on
// as with it.
TEST(EngineDeviceTest, WithoutTheFp32ViewOnlyTheComputePrecisionIsFetched) {
  auto config = EngineConfig::FromJson(R"({"bf16": {"enabled": true},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})");
  ASSERT_TRUE(config.ok());
  std::vector<float> trained[2];
  for (bool view : {true, false}) {
    auto engine = Engine::Create(
        *config,
        {.device = "host", .rank = 0, .world_size = 1, .optimizer_threads = 1, .fp32_view = view});
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_TRUE((*engine)->RegisterModule("m", {{"w", {256, 256}}}).ok());
    ASSERT_TRUE((*engine)->Initialize().ok());
    auto fetched = (*engine)->Fetch(0);
    ASSERT_TRUE(fetched.ok()) << fetched.status();
    EXPECT_EQ(fetched->tensors.size(), 1u);
    EXPECT_EQ(fetched->params.size(), view ? 1u : 0u);
    auto grads = (*engine)->Gradients(0);
    ASSERT_TRUE(grads.ok());
    for (int i = 0; i < 256 * 256; ++i) (*grads)[0][i] = 0.001f * (i % 7);
    ASSERT_TRUE((*engine)->ReduceGradients(0).ok());
    ASSERT_TRUE((*engine)->Release(0).ok());
    ASSERT_TRUE((*engine)->Step().ok());
    ASSERT_TRUE((*engine)->GatherParameter("w", &trained[view ? 0 : 1]).ok());
  }
  EXPECT_EQ(trained[0], trained[1]);
}

// Note [Fetch and release events]: a trainer computing on a stream of the compute device
// (a GPU's, here the host device's) waits for Fetch's `ready`, hands Release an event of its
// own and gets its tensors' memory kept until that event; a module fetched again meanwhile
// keeps its copies; ReduceGradients reads gradients only after `ready`. On the direct host
// device and behind a modelled link, where the gradients go through the buckets' streams.
class EngineEventTest : public ::testing::TestWithParam<const char*> {};

TEST_P(EngineEventTest, TrainersStreamIsOrderedByEvents) {
  ::setenv("ZINF_HOST_LINK_GBPS", GetParam(), 1);
  auto config = EngineConfig::FromJson(R"({"bf16": {"enabled": true},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})");
  ASSERT_TRUE(config.ok());
  auto created = Engine::Create(
      *config, {.device = "host", .rank = 0, .world_size = 1, .optimizer_threads = 1});
  ASSERT_TRUE(created.ok()) << created.status();
  Engine& e = **created;
  ASSERT_TRUE(e.RegisterModule("a", {{"a.w", {64, 64}}}).ok());
  ASSERT_TRUE(e.RegisterModule("b", {{"b.w", {64, 64}}}).ok());
  EXPECT_EQ(e.compute_device(), nullptr);
  ASSERT_TRUE(e.Initialize().ok());
  ::unsetenv("ZINF_HOST_LINK_GBPS");
  Device* device = e.compute_device();
  ASSERT_NE(device, nullptr);
  auto stream = device->CreateStream();
  auto used = device->CreateEvent();
  auto written = device->CreateEvent();
  ASSERT_TRUE(stream.ok() && used.ok() && written.ok());
  Stream& compute = **stream;
  std::vector<float> expected;
  ASSERT_TRUE(e.GatherParameter("a.w", &expected).ok());
  std::vector<uint16_t> bf16(expected.size());  // what the bf16 compute copy holds
  ConvertFromFp32(expected.data(), ElementType::kBf16, bf16.data(), expected.size());
  ConvertToFp32(bf16.data(), ElementType::kBf16, expected.data(), expected.size());

  auto a = e.Fetch(0);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_NE(a->ready, nullptr);
  EXPECT_TRUE(*a->ready->Query());  // the host device: complete on return
  const float* weights = a->params[0];
  // The trainer's stream reads the weights only once the engine calls below have returned:
  // had any of them waited for the trainer's event, it would have waited for itself, and the
  // stream gives up after 10 s, saying so.
  std::vector<float> seen;
  std::atomic<bool> go{false};
  bool gave_up = false;
  ASSERT_TRUE(compute.Wait(*a->ready).ok());
  ASSERT_TRUE(compute
                  .HostFunc([&] {
                    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
                    while (!go.load() && std::chrono::steady_clock::now() < until) {
                      std::this_thread::sleep_for(std::chrono::milliseconds(1));
                    }
                    gave_up = !go.load();
                    seen.assign(weights, weights + expected.size());
                    return OkStatus();
                  })
                  .ok());
  ASSERT_TRUE(compute.Record(**used).ok());
  ASSERT_TRUE(e.Release(0, used->get()).ok());
  ASSERT_TRUE(e.Fetch(1).ok());
  ASSERT_TRUE(e.Release(1).ok());
  auto again = e.Fetch(0);  // before the pending release went: the same copies
  go = true;
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->params[0], weights);
  ASSERT_TRUE(compute.Synchronize().ok());
  EXPECT_FALSE(gave_up) << "Release or Fetch waited for the trainer's stream";
  EXPECT_EQ(seen, expected);

  // Backward on the trainer's stream writes the gradient late; ReduceGradients waits for it.
  auto grads = e.Gradients(0);
  ASSERT_TRUE(grads.ok());
  float* g = (*grads)[0];
  ASSERT_TRUE(compute
                  .HostFunc([g] {
                    std::this_thread::sleep_for(std::chrono::milliseconds(200));
                    for (int i = 0; i < 64 * 64; ++i) g[i] = 0.5f + i;
                    return OkStatus();
                  })
                  .ok());
  ASSERT_TRUE(compute.Record(**written).ok());
  ASSERT_TRUE(e.ReduceGradients(0, written->get()).ok());
  ASSERT_TRUE(e.Release(0, nullptr).ok());
  ASSERT_TRUE(e.Fetch(1).ok());
  auto gb = e.Gradients(1);
  ASSERT_TRUE(gb.ok());
  ASSERT_TRUE(e.ReduceGradients(1).ok());
  ASSERT_TRUE(e.Release(1).ok());
  std::vector<float> reduced;
  ASSERT_TRUE(e.GatherGradient("a.w", &reduced).ok());
  ASSERT_EQ(reduced.size(), 64u * 64);
  for (int i = 0; i < 64 * 64; ++i) ASSERT_EQ(reduced[i], 0.5f + i) << i;
  EXPECT_TRUE(e.Step().ok());
}

INSTANTIATE_TEST_SUITE_P(Engine, EngineEventTest, ::testing::Values("", "20"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(*info.param == 0 ? "direct" : "modelled_link");
                         });

}  // namespace
}  // namespace zinf
