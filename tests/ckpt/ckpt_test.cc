// Checkpoints in one process: resume is bitwise for every placement; a corrupt, truncated,
// missing or mismatched checkpoint is refused with the file and the problem named, and leaves
// the engine as it was; the safetensors export holds the model's tensors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "tests/ckpt/ckpt_testing.h"
#include "tests/testing/safetensors.h"

namespace zinf {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;
using testing::AllCkptParams;
using testing::MakeCkptEngine;
using testing::TrainCkptEngine;

class CkptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = (fs::temp_directory_path() / ("zinf-ckpt-" + std::to_string(getpid()))).string();
    fs::create_directories(root_ + "/nvme1");
    fs::create_directories(root_ + "/nvme2");
    fs::create_directories(root_ + "/nvme3");
  }
  void TearDown() override { fs::remove_all(root_); }

  std::unique_ptr<Engine> Make(const std::string& placement = "memory", int nvme = 1) {
    auto e = MakeCkptEngine(placement, root_ + "/nvme" + std::to_string(nvme), 0, 1, 0);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }
  std::string Ckpt() const { return root_ + "/ckpt"; }
  std::string RankFile(const std::string& tag) const {
    return Ckpt() + "/" + tag + "/" + ckpt::ShardFileName(0);
  }

  std::string root_;
};

class CkptResumeTest : public CkptTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(CkptResumeTest, ResumeContinuesBitwise) {
  auto original = Make(GetParam(), 1);
  ASSERT_TRUE(TrainCkptEngine(*original, 0, 3).ok());
  ASSERT_TRUE(original->SaveCheckpoint(Ckpt(), "step-3", R"({"next_step": 3})").ok());
  ASSERT_TRUE(TrainCkptEngine(*original, 3, 6).ok());
  const std::vector<float> expected = *AllCkptParams(*original);

  auto resumed = Make(GetParam(), 2);
  auto client = resumed->LoadCheckpoint(Ckpt());
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(nlohmann::json::parse(*client)["next_step"], 3);
  ASSERT_TRUE(TrainCkptEngine(*resumed, 3, 6).ok());
  EXPECT_EQ(*AllCkptParams(*resumed), expected);
  EXPECT_EQ(resumed->loss_scale(), original->loss_scale());

  // Without the load the run would differ: the comparison can fail.
  auto fresh = Make(GetParam(), 3);
  ASSERT_TRUE(TrainCkptEngine(*fresh, 3, 6).ok());
  EXPECT_NE(*AllCkptParams(*fresh), expected);
}

INSTANTIATE_TEST_SUITE_P(Ckpt, CkptResumeTest,
                         ::testing::Values("memory", "params_nvme", "optimizer_nvme", "all_nvme"));

TEST_F(CkptTest, NewSaveReplacesTheOldOnlyAfterItIsComplete) {
  auto e = Make();
  ASSERT_TRUE(e->SaveCheckpoint(Ckpt(), "step-0").ok());
  ASSERT_TRUE(TrainCkptEngine(*e, 0, 1).ok());
  // What an interrupted save leaves: a tag directory with a partial file and no manifest.
  fs::create_directories(Ckpt() + "/step-1");
  std::ofstream(RankFile("step-1") + ".tmp") << "partial";
  EXPECT_EQ(*ckpt::ResolveCheckpoint(Ckpt()), Ckpt() + "/step-0");
  ASSERT_TRUE(e->SaveCheckpoint(Ckpt(), "step-1").ok()) << "a leftover partial save is cleared";
  EXPECT_EQ(*ckpt::ResolveCheckpoint(Ckpt()), Ckpt() + "/step-1");
  EXPECT_FALSE(fs::exists(Ckpt() + "/step-0")) << "older checkpoints go once the new is latest";
  EXPECT_FALSE(fs::exists(RankFile("step-1") + ".tmp"));
  EXPECT_EQ(e->SaveCheckpoint(Ckpt(), "step-1").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(e->SaveCheckpoint(Ckpt(), "../x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->SaveCheckpoint(Ckpt(), "s", "[1]").code(), StatusCode::kInvalidArgument);
}

TEST_F(CkptTest, SaveWithGradientsPendingIsRefused) {
  auto e = Make();
  ASSERT_TRUE(e->Fetch(0).ok());
  ASSERT_TRUE(e->Gradients(0).ok());
  ASSERT_TRUE(e->ReduceGradients(0).ok());
  Status s = e->SaveCheckpoint(Ckpt(), "mid");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("gradients pending"));
}

// Loading `dir` must fail with `code` and `message` and leave the engine's parameters as they
// were.
void ExpectRefused(Engine& e, const std::string& dir, StatusCode code, const std::string& message) {
  const std::vector<float> before = *AllCkptParams(e);
  auto loaded = e.LoadCheckpoint(dir);
  EXPECT_EQ(loaded.status().code(), code) << loaded.status();
  EXPECT_THAT(loaded.status().message(), HasSubstr(message));
  EXPECT_EQ(*AllCkptParams(e), before) << "a refused checkpoint must change nothing";
}

TEST_F(CkptTest, CorruptTruncatedMissingAndMismatchedAreRefused) {
  auto saver = Make();
  ASSERT_TRUE(TrainCkptEngine(*saver, 0, 2).ok());
  ASSERT_TRUE(saver->SaveCheckpoint(Ckpt(), "step-2").ok());
  const std::string file = RankFile("step-2");
  const std::string good = [&] {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  auto restore = [&] { std::ofstream(file, std::ios::binary) << good; };
  auto target = Make("memory", 2);  // a different, untrained model

  {  // one flipped bit in the parameters
    std::string bad = good;
    bad[4096 + 100] ^= 0x10;
    std::ofstream(file, std::ios::binary) << bad;
    ExpectRefused(*target, Ckpt(), StatusCode::kDataLoss, "fails its checksum");
    ExpectRefused(*target, Ckpt(), StatusCode::kDataLoss, file);
  }
  {  // truncated
    std::ofstream(file, std::ios::binary) << good.substr(0, good.size() / 2);
    ExpectRefused(*target, Ckpt(), StatusCode::kDataLoss, "truncated or corrupt");
  }
  fs::remove(file);
  ExpectRefused(*target, Ckpt(), StatusCode::kDataLoss, file + " is missing");
  restore();
  {  // a manifest cut short
    const std::string manifest = Ckpt() + "/step-2/manifest.json";
    std::ifstream in(manifest);
    const std::string text(std::istreambuf_iterator<char>(in), {});
    std::ofstream(manifest) << text.substr(0, text.size() / 2);
    ExpectRefused(*target, Ckpt(), StatusCode::kDataLoss, "manifest");
    std::ofstream(manifest) << text;
  }
  ExpectRefused(*target, root_ + "/nowhere", StatusCode::kInvalidArgument,
                "is not a zinf checkpoint");

  // A different model: same names, another shape.
  auto other = Engine::Create(*EngineConfig::FromJson("{}"), {.rank = 0, .world_size = 1});
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*other)->RegisterModule("a", {{"a.w", {11, 37}}, {"a.b", {37}}}).ok());
  ASSERT_TRUE((*other)->RegisterModule("b", {{"b.w", {5001}}}).ok());
  ASSERT_TRUE((*other)->Initialize().ok());
  auto mismatched = (*other)->LoadCheckpoint(Ckpt());
  EXPECT_EQ(mismatched.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(mismatched.status().message(), HasSubstr("different model"));

  // After all that, the intact checkpoint still loads.
  EXPECT_TRUE(target->LoadCheckpoint(Ckpt()).ok());
  EXPECT_EQ(*AllCkptParams(*target), *AllCkptParams(*saver));
}

TEST_F(CkptTest, ExportHoldsEveryParameterInFp32AndBf16) {
  auto e = Make("all_nvme");
  ASSERT_TRUE(TrainCkptEngine(*e, 0, 2).ok());
  ASSERT_TRUE(e->SaveCheckpoint(Ckpt(), "step-2").ok());
  ASSERT_TRUE(
      ckpt::ExportSafetensors(Ckpt(), root_ + "/m.safetensors", ckpt::ExportDType::kFp32).ok());
  ASSERT_TRUE(
      ckpt::ExportSafetensors(Ckpt(), root_ + "/h.safetensors", ckpt::ExportDType::kBf16).ok());
  EXPECT_EQ(testing::ReadSafeTensors(root_ + "/m.safetensors").header_bytes % 8, 0u)
      << "the data must be 8-byte aligned";
  const auto full = testing::ReadSafeTensors(root_ + "/m.safetensors").tensors;
  const auto half = testing::ReadSafeTensors(root_ + "/h.safetensors").tensors;
  ASSERT_EQ(full.size(), 3u);
  EXPECT_EQ(full.at("a.w").shape, (std::vector<int64_t>{37, 11}));
  EXPECT_EQ(half.at("b.w").dtype, "BF16");
  for (const std::string& name : testing::kCkptParams) {
    std::vector<float> value;
    ASSERT_TRUE(e->GatherParameter(name, &value).ok());
    EXPECT_EQ(full.at(name).dtype, "F32");
    ASSERT_EQ(full.at(name).bytes.size(), value.size() * 4);
    EXPECT_EQ(std::memcmp(full.at(name).bytes.data(), value.data(), value.size() * 4), 0) << name;
    ASSERT_EQ(half.at(name).bytes.size(), value.size() * 2);
    for (size_t i = 0; i < value.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, half.at(name).bytes.data() + 2 * i, 2);
      const uint32_t widened = static_cast<uint32_t>(h) << 16;
      float back;
      std::memcpy(&back, &widened, 4);
      EXPECT_NEAR(back, value[i], std::fabs(value[i]) / 256) << name << "[" << i << "]";
    }
  }
  // A damaged shard is refused, and no output file is left behind.
  std::fstream f(RankFile("step-2"), std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(10);
  f.put('\x7f');
  f.close();
  Status s = ckpt::ExportSafetensors(Ckpt(), root_ + "/bad.safetensors", ckpt::ExportDType::kFp32);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_FALSE(fs::exists(root_ + "/bad.safetensors"));
}

}  // namespace
}  // namespace zinf
