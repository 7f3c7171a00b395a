// Checkpoints in one process: resume is bitwise for every placement; a corrupt, truncated,
// missing or mismatched checkpoint is refused with the file and the problem named, and leaves
// the engine as it was; the safetensors export holds the model's tensors; an edited manifest,
// a `latest` that points elsewhere or a directory that cannot be searched is an error that
// names it, never a crash or a silently wrong export.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "ckpt/checkpoint.h"
#include "core/crc32c.h"
#include "tests/ckpt/ckpt_testing.h"
#include "tests/testing/safetensors.h"
#include "tests/testing/temp_dir.h"

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
    fs::create_directories(root_ + "/nvme1");
    fs::create_directories(root_ + "/nvme2");
    fs::create_directories(root_ + "/nvme3");
  }

  std::unique_ptr<Engine> Make(const std::string& placement = "memory", int nvme = 1) {
    auto e = MakeCkptEngine(placement, root_ + "/nvme" + std::to_string(nvme), 0, 1, 0);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }
  std::string Ckpt() const { return root_ + "/ckpt"; }
  std::string RankFile(const std::string& tag) const {
    return Ckpt() + "/" + tag + "/" + ckpt::ShardFileName(0);
  }

  testing::TempDir tmp_{"zinf-ckpt"};
  const std::string root_ = tmp_.path();
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

TEST_F(CkptTest, ACommitRemovesSavesKilledUnderOtherTags) {
  auto e = Make();
  ASSERT_TRUE(e->SaveCheckpoint(Ckpt(), "step-0").ok());
  // A save killed (SIGKILL) under another tag, before its manifest: shard files, one still
  // temporary, and the manifest's temporary file. And a directory of the user's, which looks
  // like nothing zinf writes: it stays.
  fs::create_directories(Ckpt() + "/step-7");
  std::ofstream(Ckpt() + "/step-7/" + ckpt::ShardFileName(0)) << "complete shard";
  std::ofstream(Ckpt() + "/step-7/" + ckpt::ShardFileName(1) + ".tmp") << "partial";
  std::ofstream(Ckpt() + "/step-7/manifest.json.tmp") << "{";
  fs::create_directories(Ckpt() + "/notes");
  std::ofstream(Ckpt() + "/notes/todo.txt") << "mine";
  ASSERT_TRUE(TrainCkptEngine(*e, 0, 1).ok());
  ASSERT_TRUE(e->SaveCheckpoint(Ckpt(), "step-1").ok());
  EXPECT_FALSE(fs::exists(Ckpt() + "/step-7"));
  EXPECT_TRUE(fs::exists(Ckpt() + "/notes/todo.txt"));
  EXPECT_EQ(*ckpt::ResolveCheckpoint(Ckpt()), Ckpt() + "/step-1");
  // Tags that could never commit.
  for (const char* tag : {"latest", "step-2.tmp"}) {
    Status s = e->SaveCheckpoint(Ckpt(), tag);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << tag;
    EXPECT_THAT(s.message(), HasSubstr("is reserved"));
  }
}

TEST_F(CkptTest, AFailedSaveLeavesNothingHalfWritten) {
  auto e = Make();
  ASSERT_TRUE(e->SaveCheckpoint(Ckpt(), "step-0").ok());
  // Files may grow to 4 KiB only: the shard's second section cannot be written (EFBIG), as on
  // a full disk, and works the same as root.
  struct rlimit old_limit {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  const struct rlimit small = {4096, old_limit.rlim_max};
  const sighandler_t old_handler = signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const Status s = e->SaveCheckpoint(Ckpt(), "step-1");
  setrlimit(RLIMIT_FSIZE, &old_limit);
  signal(SIGXFSZ, old_handler);
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(fs::exists(Ckpt() + "/step-1")) << "a failed save left its tag behind";
  EXPECT_EQ(*ckpt::ResolveCheckpoint(Ckpt()), Ckpt() + "/step-0");
}

TEST_F(CkptTest, StrictModeRefusesAManifestWithoutChecksum) {
  auto e = Make();
  ASSERT_TRUE(e->SaveCheckpoint(Ckpt(), "step-0").ok());
  // Format 1: the same manifest, no checksum.
  const std::string path = Ckpt() + "/step-0/manifest.json";
  nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
  j["format_version"] = 1;
  j.erase("checksum");
  std::ofstream(path, std::ios::trunc) << j.dump();
  ASSERT_TRUE(ckpt::ReadManifest(Ckpt() + "/step-0").ok()) << "format 1 is still read";
  setenv(ckpt::kStrictCheckpointsEnv, "1", 1);
  auto strict = ckpt::ReadManifest(Ckpt() + "/step-0");
  unsetenv(ckpt::kStrictCheckpointsEnv);
  EXPECT_EQ(strict.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(strict.status().message(), HasSubstr("has no checksum"));
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
  auto other =
      Engine::Create(*EngineConfig::FromJson("{}"), {.device = "host", .rank = 0, .world_size = 1});
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

// Module buffers (BatchNorm's statistics): replicated, rank 0's saved, restored on load, and
// exported beside the parameters in their own dtype.
TEST_F(CkptTest, BuffersAreSavedRestoredAndExported) {
  auto e = Make();
  const std::vector<float> mean = {0.5f, -1.25f, 3.0f};
  const int64_t count = 7;
  ASSERT_TRUE(e->SetBuffer("bn.running_mean", "F32", {3}, mean.data(), 12).ok());
  ASSERT_TRUE(e->SetBuffer("bn.num_batches_tracked", "I64", {}, &count, 8).ok());
  ASSERT_TRUE(TrainCkptEngine(*e, 0, 1).ok());
  ASSERT_TRUE(e->SaveCheckpoint(Ckpt(), "step-1").ok());
  std::ifstream manifest_file(Ckpt() + "/step-1/manifest.json");
  const nlohmann::json manifest = nlohmann::json::parse(manifest_file);
  EXPECT_EQ(manifest["format_version"], 3);
  EXPECT_EQ(manifest["buffers"].size(), 2u);

  // The buffers move on after the save; a load brings back the saved values.
  const std::vector<float> later = {9.f, 9.f, 9.f};
  const int64_t later_count = 8;
  ASSERT_TRUE(e->SetBuffer("bn.running_mean", "F32", {3}, later.data(), 12).ok());
  ASSERT_TRUE(e->SetBuffer("bn.num_batches_tracked", "I64", {}, &later_count, 8).ok());
  auto fresh = Make("memory", 2);
  ASSERT_TRUE(fresh->SetBuffer("bn.running_mean", "F32", {3}, later.data(), 12).ok());
  ASSERT_TRUE(fresh->SetBuffer("bn.num_batches_tracked", "I64", {}, &later_count, 8).ok());
  ASSERT_TRUE(fresh->LoadCheckpoint(Ckpt()).ok());
  std::vector<float> got(3);
  int64_t got_count = 0;
  ASSERT_TRUE(fresh->GetBuffer("bn.running_mean", got.data(), 12).ok());
  ASSERT_TRUE(fresh->GetBuffer("bn.num_batches_tracked", &got_count, 8).ok());
  EXPECT_EQ(got, mean);
  EXPECT_EQ(got_count, 7);

  // Exported after the parameters, as saved.
  ASSERT_TRUE(ckpt::ExportSafetensors(Ckpt(), root_ + "/m.safetensors", ElementType::kBf16).ok());
  const auto tensors = testing::ReadSafeTensors(root_ + "/m.safetensors").tensors;
  EXPECT_EQ(tensors.size(), 5u);
  EXPECT_EQ(tensors.at("bn.running_mean").dtype, "F32");
  ASSERT_EQ(tensors.at("bn.running_mean").bytes.size(), 12u);
  EXPECT_EQ(std::memcmp(tensors.at("bn.running_mean").bytes.data(), mean.data(), 12), 0);
  EXPECT_EQ(tensors.at("bn.num_batches_tracked").dtype, "I64");
  EXPECT_TRUE(tensors.at("bn.num_batches_tracked").shape.empty());

  // A model with another set of buffers is refused by name, and nothing changes.
  auto other = Make("memory", 3);
  ASSERT_TRUE(other->SetBuffer("bn.running_var", "F32", {3}, later.data(), 12).ok());
  auto refused = other->LoadCheckpoint(Ckpt());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("no buffer 'bn.running_var'"), std::string::npos)
      << refused.status();
  auto none = Make("memory", 4);
  refused = none->LoadCheckpoint(Ckpt());
  EXPECT_NE(refused.status().message().find("buffer 'bn.running_mean', which this model does "
                                            "not have"),
            std::string::npos)
      << refused.status();
  // Bad input names the buffer.
  EXPECT_EQ(e->SetBuffer("bn.running_mean", "F32", {4}, later.data(), 16).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(e->SetBuffer("x", "F33", {1}, later.data(), 4).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->SetBuffer("a.w", "F32", {1}, later.data(), 4).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->GetBuffer("nope", got.data(), 12).code(), StatusCode::kInvalidArgument);
}

TEST_F(CkptTest, ExportHoldsEveryParameterInFp32AndBf16) {
  auto e = Make("all_nvme");
  ASSERT_TRUE(TrainCkptEngine(*e, 0, 2).ok());
  ASSERT_TRUE(e->SaveCheckpoint(Ckpt(), "step-2").ok());
  ASSERT_TRUE(ckpt::ExportSafetensors(Ckpt(), root_ + "/m.safetensors", ElementType::kFp32).ok());
  ASSERT_TRUE(ckpt::ExportSafetensors(Ckpt(), root_ + "/h.safetensors", ElementType::kBf16).ok());
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
  Status s = ckpt::ExportSafetensors(Ckpt(), root_ + "/bad.safetensors", ElementType::kFp32);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_FALSE(fs::exists(root_ + "/bad.safetensors"));
}

// ---- The manifest is checked, not trusted ----

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The checksum as checkpoint.h defines it: CRC32C of the compact dump without "checksum".
// Tests use it to make an edit that only the other checks can catch.
void Reseal(nlohmann::json& j) {
  j.erase("checksum");
  const std::string canonical = j.dump();
  char hex[16];
  std::snprintf(hex, sizeof(hex), "%08x", Crc32c(canonical.data(), canonical.size()));
  j["checksum"] = std::string("crc32c:") + hex;
}

class ManifestTest : public CkptTest {
 protected:
  void SetUp() override {
    CkptTest::SetUp();
    auto e = Make();
    ASSERT_TRUE(TrainCkptEngine(*e, 0, 2).ok());
    ASSERT_TRUE(e->SaveCheckpoint(Ckpt(), "step-2", R"({"step": 2})").ok());
    manifest_ = Ckpt() + "/step-2/manifest.json";
    good_ = ReadText(manifest_);
  }
  void TearDown() override {
    chmod(Ckpt().c_str(), 0755);
    CkptTest::TearDown();
  }

  // Writes the manifest after `edit`, resealed (a valid checksum) when `reseal`.
  void Edit(const std::function<void(nlohmann::json&)>& edit, bool reseal = true) {
    nlohmann::json j = nlohmann::json::parse(good_);
    edit(j);
    if (reseal) Reseal(j);
    std::ofstream(manifest_, std::ios::trunc) << j.dump(1);
  }
  void Restore() { std::ofstream(manifest_, std::ios::trunc) << good_; }

  // Export must fail with `code` and a message holding `message`, writing nothing.
  void ExpectExportRefused(StatusCode code, const std::string& message,
                           const std::string& from = "") {
    const std::string out = root_ + "/out.safetensors";
    Status s = ckpt::ExportSafetensors(from.empty() ? Ckpt() : from, out, ElementType::kFp32);
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_THAT(s.message(), HasSubstr(message));
    EXPECT_FALSE(fs::exists(out)) << s;
    EXPECT_FALSE(fs::exists(out + ".tmp")) << s;
  }

  std::string manifest_, good_;
};

TEST_F(ManifestTest, WrittenWithAChecksumThatAnyEditBreaks) {
  const nlohmann::json j = nlohmann::json::parse(good_);
  EXPECT_EQ(j.at("format_version"), 2);
  EXPECT_THAT(j.at("checksum").get<std::string>(), ::testing::StartsWith("crc32c:"));
  ASSERT_TRUE(ckpt::ExportSafetensors(Ckpt(), root_ + "/ok.safetensors", ElementType::kFp32).ok());

  Edit([](nlohmann::json& j) { j["step"] = 3; }, /*reseal=*/false);
  ExpectExportRefused(StatusCode::kDataLoss, manifest_ + " fails its checksum");
  Edit([](nlohmann::json& j) { j["params"][0]["shape"] = {11, 37}; }, /*reseal=*/false);
  ExpectExportRefused(StatusCode::kDataLoss, "fails its checksum");
  auto target = Make("memory", 2);
  ExpectRefused(*target, Ckpt(), StatusCode::kDataLoss, "fails its checksum");
  Edit([](nlohmann::json& j) { j.erase("checksum"); }, /*reseal=*/false);
  ExpectExportRefused(StatusCode::kDataLoss, "needs a \"checksum\"");

  // Reformatting is not an edit: the checksum is of the content.
  std::ofstream(manifest_, std::ios::trunc) << nlohmann::json::parse(good_).dump(4);
  EXPECT_TRUE(ckpt::ExportSafetensors(Ckpt(), root_ + "/b.safetensors", ElementType::kFp32).ok());
}

TEST_F(ManifestTest, EditedButResealedManifestsAreRefusedByTheirContent) {
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"shape wrong over the data",
       [](auto& j) {
         j["params"][0]["shape"] = {37, 12};
       },
       "parameter 0 'a.w': shape [37,12] has 444 elements, numel is 407"},
      {"negative shape",
       [](auto& j) {
         j["params"][0]["shape"] = {-37, -11};
       },
       "shape [-37,-11] has a negative dimension"},
      {"offset off by one", [](auto& j) { j["params"][1]["flat_offset"] = 408; },
       "parameter 2 'b.w' (elements [444, 5445)) overlaps parameter 1 'a.b'"},
      {"last offset off by one", [](auto& j) { j["params"][2]["flat_offset"] = 445; },
       "parameter 2 'b.w': elements [445, 445 + 5001) lie outside [0, 5445), a rank's shard"},
      {"duplicate names", [](auto& j) { j["params"][2]["name"] = "a.w"; },
       "parameter 2 'a.w': the name appears twice"},
      {"empty list", [](auto& j) { j["params"] = nlohmann::json::array(); },
       "the parameter list is empty"},
      {"numel that is not the shape's", [](auto& j) { j["params"][1]["numel"] = 38; },
       "shape [37] has 37 elements, numel is 38"},
      {"shard_size that is not numel's share", [](auto& j) { j["params"][1]["shard_size"] = 36; },
       "shard_size is 36, expected 37"},
      {"overflowing shard_size and flat_offset",
       [](auto& j) {
         j["params"][2]["shard_size"] = UINT64_MAX;
         j["params"][2]["flat_offset"] = UINT64_MAX - 1;
       },
       "shard_size is 18446744073709551615, expected 5001"},
      {"flat_offset past the end", [](auto& j) { j["params"][2]["flat_offset"] = UINT64_MAX - 10; },
       "elements [18446744073709551605, 18446744073709551605 + 5001) lie outside"},
      {"overflowing shape",
       [](auto& j) {
         j["params"][2]["shape"] = {INT64_MAX, INT64_MAX};
       },
       "has more than 2^64 elements"},
      {"huge shard_elements", [](auto& j) { j["shard_elements"] = UINT64_MAX; },
       "shard_elements and frozen_elements must be at most 2^60"},
      {"step that is a string", [](auto& j) { j["step"] = "3"; },
       "step must be an integer, got \"3\" (string)"},
      {"negative step", [](auto& j) { j["step"] = -1; }, "step must be >= 0, got -1"},
      {"world_size 0", [](auto& j) { j["world_size"] = 0; }, "world_size must be in [1,"},
      {"tag with a path", [](auto& j) { j["tag"] = "../step-2"; }, "must be a plain directory"},
      {"unknown key", [](auto& j) { j["extra"] = 1; }, "extra is not a manifest key"},
      {"engine_state of the wrong type", [](auto& j) { j["engine_state"]["loss_scale"] = "big"; },
       "engine_state.loss_scale must be a number"},
      {"client_state not an object",
       [](auto& j) {
         j["client_state"] = {1, 2};
       },
       "client_state must be an object"},
  };
  auto target = Make("memory", 2);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Edit(c.edit);
    ExpectExportRefused(StatusCode::kDataLoss, c.message);
    ExpectExportRefused(StatusCode::kDataLoss, manifest_ + " is not a valid zinf checkpoint");
  }
  // The engine reads manifests the same way.
  Edit(cases[2].edit);
  ExpectRefused(*target, Ckpt(), StatusCode::kDataLoss, "overlaps");
  Restore();
  EXPECT_TRUE(target->LoadCheckpoint(Ckpt()).ok());
}

// A manifest consistent in itself but larger than its shards: refused against the shard
// files' sizes before anything of that size is allocated.
TEST_F(ManifestTest, SizesAreCheckedAgainstTheShardFiles) {
  Edit([](nlohmann::json& j) {
    const uint64_t huge = uint64_t{1} << 40;
    j["params"][2]["shape"] = {huge};
    j["params"][2]["numel"] = huge;
    j["params"][2]["shard_size"] = huge;
    j["shard_elements"] = 444 + huge;
  });
  ExpectExportRefused(StatusCode::kDataLoss, "'params' has 21780 bytes, the manifest says");
}

TEST_F(ManifestTest, VersionsOlderAreReadNewerAreRefused) {
  Edit([](nlohmann::json& j) { j["format_version"] = 6; });
  ExpectExportRefused(StatusCode::kFailedPrecondition,
                      "format_version 6 is not supported by this build of zinf");
  Edit([](nlohmann::json& j) { j["format_version"] = "2"; });
  ExpectExportRefused(StatusCode::kDataLoss, "format_version must be an integer");

  // Version 1 (before checksums) still exports, with every other check.
  Edit(
      [](nlohmann::json& j) {
        j["format_version"] = 1;
        j.erase("checksum");
      },
      /*reseal=*/false);
  EXPECT_TRUE(ckpt::ExportSafetensors(Ckpt(), root_ + "/v1.safetensors", ElementType::kFp32).ok());
  Edit(
      [](nlohmann::json& j) {
        j["format_version"] = 1;
        j.erase("checksum");
        j["params"][2]["name"] = "a.w";
      },
      /*reseal=*/false);
  ExpectExportRefused(StatusCode::kDataLoss, "the name appears twice");
}

TEST_F(ManifestTest, LatestMayNameOnlyADirectoryInTheRoot) {
  fs::create_directories(root_ + "/elsewhere");
  fs::copy(Ckpt() + "/step-2", root_ + "/elsewhere/step-2");
  fs::create_directory_symlink(root_ + "/elsewhere/step-2", Ckpt() + "/linked");
  std::ofstream(Ckpt() + "/file") << "x";
  for (const char* tag : {"../elsewhere/step-2", "/tmp", "..", ".", "step-2/../../elsewhere/step-2",
                          "linked", "missing", "file", ""}) {
    SCOPED_TRACE(tag);
    std::ofstream(Ckpt() + "/latest", std::ios::trunc) << tag << "\n";
    ExpectExportRefused(StatusCode::kDataLoss, Ckpt() + "/latest names '" + tag + "'");
    EXPECT_FALSE(ckpt::ResolveCheckpoint(Ckpt()).ok());
  }
  std::ofstream(Ckpt() + "/latest", std::ios::trunc) << "step-2\n";
  EXPECT_EQ(*ckpt::ResolveCheckpoint(Ckpt()), Ckpt() + "/step-2");
}

// std::filesystem throws where the OS cannot say whether a path exists; that used to abort
// the process. A loop of symbolic links shows it even to root, whom permissions do not stop.
TEST_F(ManifestTest, DirectoryThatCannotBeSearchedIsAnError) {
  fs::create_directory_symlink(root_ + "/loop-a", root_ + "/loop-b");
  fs::create_directory_symlink(root_ + "/loop-b", root_ + "/loop-a");
  auto resolved = ckpt::ResolveCheckpoint(root_ + "/loop-a");
  EXPECT_EQ(resolved.status().code(), StatusCode::kIoError) << resolved.status();
  EXPECT_THAT(resolved.status().message(), HasSubstr("Too many levels of symbolic links"));
  ExpectExportRefused(StatusCode::kIoError, root_ + "/loop-a", root_ + "/loop-a");
  auto target = Make("memory", 2);
  ExpectRefused(*target, root_ + "/loop-a", StatusCode::kIoError, "searching checkpoint");
}

TEST_F(ManifestTest, DirectoryWithoutPermissionIsAnError) {
  if (geteuid() == 0) GTEST_SKIP() << "running as root: permissions do not stop a search";
  ASSERT_EQ(chmod(Ckpt().c_str(), 0), 0);
  ExpectExportRefused(StatusCode::kIoError, "Permission denied");
  auto target = Make("memory", 2);
  ExpectRefused(*target, Ckpt(), StatusCode::kIoError, "Permission denied");
}

TEST_F(ManifestTest, DeepNestingIsRefusedNotACrash) {
  std::string text = good_;
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  text.replace(text.find("\"client_state\": {"), 17, "\"client_state\": {\"x\": " + deep + ",");
  std::ofstream(manifest_, std::ios::trunc) << text;
  ExpectExportRefused(StatusCode::kDataLoss, "more than 128 levels deep");
}

// ParseManifest is what a fuzzer calls: whatever the bytes, an error or a manifest that
// ValidateManifest accepts, never an exception.
TEST_F(ManifestTest, ParseManifestSurvivesMutations) {
  auto parsed = ckpt::ParseManifest(good_);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->params.size(), 3u);
  EXPECT_EQ(nlohmann::json::parse(parsed->client_state)["step"], 2);
  auto round_trip = ckpt::SerializeManifest(*parsed);
  ASSERT_TRUE(round_trip.ok()) << round_trip.status();
  EXPECT_EQ(nlohmann::json::parse(*round_trip), nlohmann::json::parse(good_));

  std::mt19937 random(7);
  for (int i = 0; i < 3000; ++i) {
    std::string text = good_;
    for (int k = 0; k < 1 + i % 4; ++k) {
      const size_t at = random() % text.size();
      switch (random() % 3) {
        case 0:
          text[at] = static_cast<char>(random());
          break;
        case 1:
          text.erase(at, 1 + random() % 8);
          break;
        default:
          text.insert(at, 1, "[]{}\",:0-9e"[random() % 11]);
          break;
      }
      if (text.empty()) text = "{";
    }
    StatusOr<ckpt::Manifest> m = ckpt::Manifest{};
    ASSERT_NO_THROW(m = ckpt::ParseManifest(text)) << text;
    if (m.ok()) {
      EXPECT_TRUE(ckpt::ValidateManifest(*m).ok());
    }
  }
}

}  // namespace
}  // namespace zinf
