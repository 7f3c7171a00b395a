// Weights from safetensors files: Engine::LoadSafetensors of an export gives bitwise the
// checkpoint's parameters in every placement; `zinf ckpt import` makes a checkpoint that
// loads by name whatever the file's tensor order, and trains on exactly as the file loaded
// directly; a file whose tensors are missing, misshapen, extra or of a dtype zinf does not
// read is refused naming the tensor, leaving the engine as it was.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "tests/ckpt/ckpt_testing.h"
#include "tests/testing/safetensors.h"
#include "tests/testing/temp_dir.h"
#include "tests/tools/run_zinf.h"

namespace zinf {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;
using testing::AllCkptParams;
using testing::F32Tensor;
using testing::MakeCkptEngine;
using testing::Tensor;
using testing::TrainCkptEngine;
using testing::WriteSafeTensors;
using zinf::testing::RunZinf;
using zinf::testing::ZinfRun;

// The optimizer and fp16 settings of MakeCkptEngine's config, for `zinf ckpt import --config`.
constexpr char kImportConfig[] =
    R"({"model": {"ignored": true}, "fp16": {"enabled": true, "initial_scale_power": 4},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}})";

class ImportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 1; i <= 3; ++i) fs::create_directories(root_ + "/nvme" + std::to_string(i));
  }

  std::unique_ptr<Engine> Make(const std::string& placement = "memory", int nvme = 1) {
    auto e = MakeCkptEngine(placement, root_ + "/nvme" + std::to_string(nvme), 0, 1, 0);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }
  // A trained engine's parameters as a safetensors file, tensors in `order`.
  std::string FileOf(Engine& e, const std::vector<std::string>& order, const std::string& name) {
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const std::string& p : order) {
      std::vector<float> value;
      EXPECT_TRUE(e.GatherParameter(p, &value).ok());
      tensors.emplace_back(p, F32Tensor(value, Shape(p)));
    }
    WriteSafeTensors(root_ + "/" + name, tensors);
    return root_ + "/" + name;
  }
  static std::vector<int64_t> Shape(const std::string& p) {
    return p == "a.w" ? std::vector<int64_t>{37, 11} : std::vector<int64_t>{p == "a.b" ? 37 : 5001};
  }

  testing::TempDir tmp_{"zinf-import"};
  const std::string root_ = tmp_.path();
};

class ImportPlacementTest : public ImportTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(ImportPlacementTest, ExportThenLoadSafetensorsIsBitwise) {
  auto original = Make(GetParam(), 1);
  ASSERT_TRUE(TrainCkptEngine(*original, 0, 3).ok());
  ASSERT_TRUE(original->SaveCheckpoint(root_ + "/ckpt", "step-3").ok());
  const std::vector<float> expected = *AllCkptParams(*original);
  ASSERT_TRUE(
      ckpt::ExportSafetensors(root_ + "/ckpt", root_ + "/f32.safetensors", ElementType::kFp32)
          .ok());
  ASSERT_TRUE(
      ckpt::ExportSafetensors(root_ + "/ckpt", root_ + "/bf16.safetensors", ElementType::kBf16)
          .ok());

  auto loaded = Make(GetParam(), 2);
  ASSERT_NE(*AllCkptParams(*loaded), expected);  // the comparison below can fail
  const Status s = loaded->LoadSafetensors(root_ + "/f32.safetensors");
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(*AllCkptParams(*loaded), expected);

  // bf16: each value is the checkpoint's rounded to bf16 (nearest even) and widened back.
  ASSERT_TRUE(loaded->LoadSafetensors(root_ + "/bf16.safetensors").ok());
  const std::vector<float> rounded = *AllCkptParams(*loaded);
  ASSERT_EQ(rounded.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const uint32_t bits = std::bit_cast<uint32_t>(expected[i]);
    const uint32_t want = ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) << 16;
    ASSERT_EQ(std::bit_cast<uint32_t>(rounded[i]), want) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Import, ImportPlacementTest,
                         ::testing::Values("memory", "params_nvme", "optimizer_nvme", "all_nvme",
                                           "all_nvme_overlap"));

// With the optimizer step running alongside backward, weights cannot be replaced while it is
// under way (from the batch's last micro-batch's first ReduceGradients until Step).
TEST_F(ImportTest, LoadWhileTheOverlappedStepIsUnderWayIsRefused) {
  auto e = Make("all_nvme_overlap");
  ASSERT_TRUE(TrainCkptEngine(*e, 0, 1).ok());
  const std::string file = FileOf(*e, testing::kCkptParams, "w.safetensors");
  ASSERT_TRUE(e->Fetch(1).ok());
  auto g = e->Gradients(1);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(e->ReduceGradients(1).ok());
  const Status s = e->LoadSafetensors(file);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("LoadSafetensors while the optimizer step is under way"));
  ASSERT_TRUE(e->Release(1).ok());
}

TEST_F(ImportTest, ImportedCheckpointLoadsByNameAndTrainsAsTheFileDoes) {
  auto original = Make("memory", 1);
  ASSERT_TRUE(TrainCkptEngine(*original, 0, 3).ok());
  const std::vector<float> expected = *AllCkptParams(*original);
  // Not the order the model registers its parameters in.
  const std::string file = FileOf(*original, {"b.w", "a.w", "a.b"}, "reversed.safetensors");
  std::ofstream(root_ + "/config.json") << kImportConfig;
  const ZinfRun run = RunZinf("ckpt import " + file + " --out " + root_ + "/imported --config " +
                              root_ + "/config.json");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("wrote " + root_ + "/imported/imported"));
  auto manifest = ckpt::ReadManifest(root_ + "/imported/imported");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->step, 0);
  EXPECT_EQ(manifest->params[0].name, "b.w");

  // Imported through swap files instead of host memory: the same checkpoint, no files left.
  const ZinfRun on_nvme =
      RunZinf("ckpt import " + file + " --out " + root_ + "/imported-nvme --config " + root_ +
              "/config.json --nvme-path " + root_ + "/nvme1");
  ASSERT_EQ(on_nvme.exit_code, 0) << on_nvme.output;
  EXPECT_TRUE(fs::is_empty(root_ + "/nvme1")) << "swap files left behind";
  {
    auto e = Make("memory", 2);
    ASSERT_TRUE(e->LoadCheckpoint(root_ + "/imported-nvme").ok());
    EXPECT_EQ(*AllCkptParams(*e), expected);
  }
  const ZinfRun no_dir = RunZinf("ckpt import " + file + " --out " + root_ + "/x --nvme-path " +
                                 root_ + "/no-such-dir");
  EXPECT_EQ(no_dir.exit_code, 1) << no_dir.output;
  EXPECT_THAT(no_dir.output, HasSubstr(root_ + "/no-such-dir"));

  for (const char* placement : {"memory", "all_nvme", "all_nvme_overlap"}) {
    SCOPED_TRACE(placement);
    auto from_checkpoint = Make(placement, 2);
    auto client = from_checkpoint->LoadCheckpoint(root_ + "/imported");
    ASSERT_TRUE(client.ok()) << client.status();
    EXPECT_EQ(*AllCkptParams(*from_checkpoint), expected);
    // The same training from the imported checkpoint as from the file loaded directly:
    // fresh optimizer state and the config's loss scale in both.
    auto from_file = Make(placement, 3);
    ASSERT_TRUE(from_file->LoadSafetensors(file).ok());
    EXPECT_EQ(from_checkpoint->loss_scale(), from_file->loss_scale());
    ASSERT_TRUE(TrainCkptEngine(*from_checkpoint, 0, 3).ok());
    ASSERT_TRUE(TrainCkptEngine(*from_file, 0, 3).ok());
    EXPECT_EQ(*AllCkptParams(*from_checkpoint), *AllCkptParams(*from_file));
    EXPECT_NE(*AllCkptParams(*from_file), expected);
  }
}

TEST_F(ImportTest, MismatchedFilesAreRefusedNamingTheTensor) {
  auto donor = Make("memory", 1);
  ASSERT_TRUE(TrainCkptEngine(*donor, 0, 2).ok());
  auto target = Make("all_nvme", 2);
  const std::vector<float> before = *AllCkptParams(*target);
  auto tensor = [&](const std::string& p) {
    std::vector<float> value;
    EXPECT_TRUE(donor->GatherParameter(p, &value).ok());
    return F32Tensor(value, Shape(p));
  };
  auto expect_refused = [&](const std::vector<std::pair<std::string, Tensor>>& tensors,
                            const std::string& message) {
    SCOPED_TRACE(message);
    WriteSafeTensors(root_ + "/bad.safetensors", tensors);
    const Status s = target->LoadSafetensors(root_ + "/bad.safetensors");
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(message));
    EXPECT_EQ(*AllCkptParams(*target), before) << "changed by a refused file";
  };
  expect_refused({{"a.w", tensor("a.w")}, {"b.w", tensor("b.w")}},
                 "has no tensor 'a.b' (the model's parameter of shape [37])");
  Tensor transposed = tensor("a.w");
  transposed.shape = {11, 37};
  expect_refused({{"a.w", transposed}, {"a.b", tensor("a.b")}, {"b.w", tensor("b.w")}},
                 "tensor 'a.w' has shape [11,37], the model's parameter [37,11]");
  expect_refused({{"a.w", tensor("a.w")},
                  {"a.b", tensor("a.b")},
                  {"b.w", tensor("b.w")},
                  {"c.w", tensor("a.b")}},
                 "has 1 tensor(s) that are not parameters of this model: 'c.w'");
  Tensor ints = tensor("a.b");
  ints.dtype = "I32";
  expect_refused({{"a.w", tensor("a.w")}, {"a.b", ints}, {"b.w", tensor("b.w")}},
                 "tensor 'a.b' has dtype 'I32'; parameters load from F32, BF16 or F16");

  // A truncated file is DataLoss, and also leaves the engine as it was.
  const std::string good = FileOf(*donor, testing::kCkptParams, "good.safetensors");
  fs::resize_file(good, fs::file_size(good) - 100);
  const Status s = target->LoadSafetensors(good);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("tensor 'b.w': data_offsets"));
  EXPECT_EQ(*AllCkptParams(*target), before);
}

// An import whose file missed a tensor makes a checkpoint of fewer parameters: loading it
// names the parameter it lacks, not only the counts.
TEST_F(ImportTest, ACheckpointMissingAParameterIsRefusedNamingIt) {
  auto donor = Make();
  const std::string file = FileOf(*donor, {"a.w", "b.w"}, "partial.safetensors");
  const ZinfRun run = RunZinf("ckpt import " + file + " --out " + root_ + "/partial");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  auto target = Make("memory", 2);
  const std::vector<float> before = *AllCkptParams(*target);
  auto loaded = target->LoadCheckpoint(root_ + "/partial");
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kFailedPrecondition) << loaded.status();
  EXPECT_THAT(loaded.status().message(),
              HasSubstr("holds a different model: 2 parameters, this one has 3: it lacks "
                        "parameter 'a.b' [37]"));
  EXPECT_EQ(*AllCkptParams(*target), before);
}

TEST_F(ImportTest, ImportOfABadFileWritesNoCheckpoint) {
  std::ofstream(root_ + "/junk.safetensors") << "not a safetensors file at all";
  ZinfRun run = RunZinf("ckpt import " + root_ + "/junk.safetensors --out " + root_ + "/out");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("zinf ckpt import: DataLoss: " + root_ + "/junk.safetensors"));
  EXPECT_FALSE(fs::exists(root_ + "/out/latest"));
  run = RunZinf("ckpt import " + root_ + "/missing.safetensors --out " + root_ + "/out");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("opening " + root_ + "/missing.safetensors"));
  std::ofstream(root_ + "/bad.json") << R"({"optimizer": {"type": "Nadam"}})";
  auto donor = Make();
  const std::string file = FileOf(*donor, testing::kCkptParams, "ok.safetensors");
  run = RunZinf("ckpt import " + file + " --out " + root_ + "/out --config " + root_ + "/bad.json");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("optimizer.type"));
  EXPECT_FALSE(fs::exists(root_ + "/out/latest"));
  // An endless --config is refused before it is read; a tag that could never commit too.
  run = RunZinf("ckpt import " + file + " --out " + root_ + "/out --config /dev/zero");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--config /dev/zero is not a regular file"));
  run = RunZinf("ckpt import " + file + " --out " + root_ + "/out --tag latest");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("checkpoint tag 'latest' is reserved"));
  EXPECT_FALSE(fs::exists(root_ + "/out/latest"));
}

// A downloaded weights file must never crash a trainer: 50,000 nested brackets in a 100 KB
// header crashed `zinf ckpt import`, train_gpt --init-from and zinf_engine_load_safetensors in
// the caller's process (nlohmann's recursion). Each now refuses it by name.
TEST_F(ImportTest, ADeeplyNestedHeaderIsRefusedByEveryReader) {
  const std::string header = R"({"a": )" + std::string(50000, '[') + std::string(50000, ']') + "}";
  const uint64_t n = header.size();
  const std::string path = root_ + "/deep.safetensors";
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header;
  }
  ZinfRun run = RunZinf("ckpt import " + path + " --out " + root_ + "/out");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("more than 128 levels deep"));
  auto target = Make();
  const Status s = target->LoadSafetensors(path);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("more than 128 levels deep"));
}

}  // namespace
}  // namespace zinf
