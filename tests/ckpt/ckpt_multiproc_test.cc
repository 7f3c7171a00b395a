// Checkpoints across processes: two ranks save and resume bitwise, the export of their shards
// holds the gathered model, other world sizes reshard on load, and a save killed at a random
// moment always leaves a loadable checkpoint (the previous one or the new one, whole).
// Ranks are forked before this process starts any thread (tests/testing/fork_ranks.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "ckpt/checkpoint.h"
#include "tests/ckpt/ckpt_testing.h"
#include "tests/testing/float_file.h"
#include "tests/testing/fork_ranks.h"
#include "tests/testing/temp_dir.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;
using testing::AllCkptParams;
using testing::MakeCkptEngine;
using testing::ReadFloats;
using testing::TrainCkptEngine;
using testing::WriteFloats;

class CkptMultiprocTest : public ::testing::Test {
 protected:
  testing::TempDir tmp_{"zinf-ckpt-mp"};
  const std::string root_ = tmp_.path();
};

// Each rank: `body(engine)`; returns a process exit code.
std::vector<int> Ranks(int world, const std::string& placement, const std::string& nvme,
                       const std::function<int(Engine&)>& body) {
  fs::create_directories(nvme);
  const int port = testing::FreePort();
  return testing::ForkRanks(world, [&](int rank) {
    auto engine = MakeCkptEngine(placement, nvme, rank, world, port);
    if (!engine.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, engine.status().ToString().c_str());
      return 10;
    }
    return body(**engine);
  });
}

TEST_F(CkptMultiprocTest, TwoRanksResumeBitwiseAndExportTheGatheredModel) {
  const std::string ckpt = root_ + "/ckpt";
  auto save = [&](Engine& e) {
    auto mean = e.MeanOverRanks(e.rank() + 1.0);  // what the trainer uses for the batch loss
    if (!mean.ok() || *mean != 1.5) return 5;
    if (!TrainCkptEngine(e, 0, 3).ok()) return 1;
    Status s = e.SaveCheckpoint(ckpt, "step-3", R"({"next_step": 3})");
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 2;
    }
    auto saved = AllCkptParams(e);
    if (!saved.ok() || !TrainCkptEngine(e, 3, 6).ok()) return 3;
    auto final_params = AllCkptParams(e);
    if (!final_params.ok()) return 4;
    if (e.rank() == 0 && (!WriteFloats(root_ + "/saved.bin", *saved).ok() ||
                          !WriteFloats(root_ + "/expected.bin", *final_params).ok())) {
      return 5;
    }
    return 0;
  };
  ASSERT_EQ(Ranks(2, "all_nvme", root_ + "/nvme1", save), (std::vector<int>{0, 0}));

  auto resume = [&](Engine& e) {
    auto client = e.LoadCheckpoint(ckpt);
    if (!client.ok()) {
      std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
      return 1;
    }
    if (!TrainCkptEngine(e, 3, 6).ok()) return 2;
    auto final_params = AllCkptParams(e);
    if (!final_params.ok()) return 3;
    return e.rank() == 0 && !WriteFloats(root_ + "/resumed.bin", *final_params).ok() ? 4 : 0;
  };
  // Resumed in another placement: the checkpoint does not depend on where the state lived.
  ASSERT_EQ(Ranks(2, "memory", root_ + "/nvme2", resume), (std::vector<int>{0, 0}));
  EXPECT_EQ(ReadFloats(root_ + "/resumed.bin"), ReadFloats(root_ + "/expected.bin"));

  // The export of the two ranks' shards is the gathered model at the save.
  ASSERT_TRUE(ckpt::ExportSafetensors(ckpt, root_ + "/m.safetensors", ElementType::kFp32).ok());
  std::ifstream in(root_ + "/m.safetensors", std::ios::binary);
  uint64_t header = 0;
  in.read(reinterpret_cast<char*>(&header), 8);
  in.seekg(8 + header);
  const std::string data(std::istreambuf_iterator<char>(in), {});
  const std::vector<float> saved = ReadFloats(root_ + "/saved.bin");
  ASSERT_EQ(data.size(), saved.size() * 4);
  EXPECT_EQ(std::memcmp(data.data(), saved.data(), data.size()), 0);

  // Another world size reshards on load (DeepSpeed issues 3810, 2898): three ranks load the
  // two ranks' checkpoint (parameters on NVMe and optimizer state in memory this time) and see
  // the saved model; their own save of it, loaded again by two ranks, continues bitwise as the
  // original two did, so the optimizer state made the round trip too.
  auto three = [&](Engine& e) {
    auto client = e.LoadCheckpoint(ckpt);
    if (!client.ok() || *client != R"({"next_step":3})") {
      std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
      return 1;
    }
    auto loaded = AllCkptParams(e);
    if (!loaded.ok()) return 2;
    if (e.rank() == 0 && !WriteFloats(root_ + "/three.bin", *loaded).ok()) return 3;
    Status s = e.SaveCheckpoint(root_ + "/ckpt3", "step-3", *client);
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 3;
    }
    return 0;
  };
  EXPECT_EQ(Ranks(3, "params_nvme", root_ + "/nvme3", three), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(ReadFloats(root_ + "/three.bin"), saved);
  auto back_to_two = [&](Engine& e) {
    if (!e.LoadCheckpoint(root_ + "/ckpt3").ok() || !TrainCkptEngine(e, 3, 6).ok()) return 1;
    auto final_params = AllCkptParams(e);
    if (!final_params.ok()) return 2;
    return e.rank() == 0 && !WriteFloats(root_ + "/via-three.bin", *final_params).ok() ? 3 : 0;
  };
  ASSERT_EQ(Ranks(2, "optimizer_nvme", root_ + "/nvme4", back_to_two), (std::vector<int>{0, 0}));
  EXPECT_EQ(ReadFloats(root_ + "/via-three.bin"), ReadFloats(root_ + "/expected.bin"));
  // One rank: the whole shard from both files.
  auto one = [&](Engine& e) {
    if (!e.LoadCheckpoint(ckpt).ok()) return 1;
    auto loaded = AllCkptParams(e);
    if (!loaded.ok()) return 2;
    return WriteFloats(root_ + "/one.bin", *loaded).ok() ? 0 : 3;
  };
  ASSERT_EQ(Ranks(1, "all_nvme", root_ + "/nvme5", one), (std::vector<int>{0}));
  EXPECT_EQ(ReadFloats(root_ + "/one.bin"), saved);
}

// Weights from a safetensors file land on every rank (each keeps its shards), and a
// checkpoint whose manifest lists the parameters in another order than the model registers
// them (what `zinf ckpt import` writes from a file in that order) loads on another world size
// by name.
TEST_F(CkptMultiprocTest, SafetensorsLoadOnEveryRankAndOtherOrdersLoadByName) {
  const std::string ckpt = root_ + "/ckpt", file = root_ + "/m.safetensors";
  auto save = [&](Engine& e) {
    if (!TrainCkptEngine(e, 0, 3).ok() || !e.SaveCheckpoint(ckpt, "step-3").ok()) return 1;
    return WriteFloats(root_ + "/saved.bin", *AllCkptParams(e)).ok() ? 0 : 2;
  };
  ASSERT_EQ(Ranks(1, "memory", root_ + "/nvme1", save), (std::vector<int>{0}));
  ASSERT_TRUE(ckpt::ExportSafetensors(ckpt, file, ElementType::kFp32).ok());
  const std::vector<float> saved = ReadFloats(root_ + "/saved.bin");

  auto three = [&](Engine& e) {
    if (Status s = e.LoadSafetensors(file); !s.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", e.rank(), s.ToString().c_str());
      return 1;
    }
    auto loaded = AllCkptParams(e);
    if (!loaded.ok()) return 2;
    if (e.rank() == 0 && !WriteFloats(root_ + "/three.bin", *loaded).ok()) return 3;
    return 0;
  };
  ASSERT_EQ(Ranks(3, "all_nvme", root_ + "/nvme3", three), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(ReadFloats(root_ + "/three.bin"), saved);

  // One rank of a model registered b first saves the file's weights...
  fs::create_directories(root_ + "/nvme4");
  const int port = testing::FreePort();
  ASSERT_EQ(testing::ForkRanks(1,
                               [&](int) {
                                 auto e = MakeCkptEngine("memory", root_ + "/nvme4", 0, 1, port,
                                                         /*reversed=*/true);
                                 if (!e.ok() || !(*e)->LoadSafetensors(file).ok()) return 1;
                                 return (*e)->SaveCheckpoint(root_ + "/reordered", "imported").ok()
                                            ? 0
                                            : 2;
                               }),
            (std::vector<int>{0}));
  // ... and two ranks of the model in its usual order load them, by name.
  auto two = [&](Engine& e) {
    if (Status s = e.LoadCheckpoint(root_ + "/reordered").status(); !s.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", e.rank(), s.ToString().c_str());
      return 1;
    }
    auto loaded = AllCkptParams(e);
    if (!loaded.ok()) return 2;
    return e.rank() == 0 && !WriteFloats(root_ + "/two.bin", *loaded).ok() ? 3 : 0;
  };
  ASSERT_EQ(Ranks(2, "params_nvme", root_ + "/nvme5", two), (std::vector<int>{0, 0}));
  EXPECT_EQ(ReadFloats(root_ + "/two.bin"), saved);
}

// Kills a one-rank trainer at a random moment of its save, many times, and checks that the
// checkpoint directory always loads, at the old step or the new one.
TEST_F(CkptMultiprocTest, SaveKilledAtAnyMomentLeavesALoadableCheckpoint) {
  const std::string ckpt = root_ + "/ckpt";
  ASSERT_EQ(Ranks(1, "memory", root_ + "/nvme0",
                  [&](Engine& e) { return e.SaveCheckpoint(ckpt, "step-0").ok() ? 0 : 1; }),
            std::vector<int>{0});
  std::mt19937 random(12345);
  int saw_new = 0, saw_old = 0;
  for (int round = 1; round <= 24; ++round) {
    int ready[2];
    ASSERT_EQ(pipe(ready), 0);
    const pid_t child = fork();
    if (child == 0) {
      auto engine = MakeCkptEngine("memory", root_ + "/nvme0", 0, 1, 0);
      if (!engine.ok() || !(*engine)->LoadCheckpoint(ckpt).ok()) _exit(1);
      if (!TrainCkptEngine(**engine, 0, 1).ok()) _exit(2);
      (void)!write(ready[1], "x", 1);
      const Status s = (*engine)->SaveCheckpoint(ckpt, "step-" + std::to_string(round));
      _exit(s.ok() ? 0 : 3);
    }
    char c;
    ASSERT_EQ(read(ready[0], &c, 1), 1);
    close(ready[0]);
    close(ready[1]);
    // Every fourth save runs to the end and the one after is killed at once, so that both
    // outcomes occur however fast the disk is; the rest die at a random moment.
    if (round % 4 != 0) {
      if (round % 4 != 1) std::this_thread::sleep_for(std::chrono::microseconds(random() % 4000));
      kill(child, SIGKILL);
    }
    int status = 0;
    waitpid(child, &status, 0);

    auto dir = ckpt::ResolveCheckpoint(ckpt);
    ASSERT_TRUE(dir.ok()) << "round " << round << ": " << dir.status();
    const bool is_new = fs::path(*dir).filename() == "step-" + std::to_string(round);
    (is_new ? saw_new : saw_old)++;
    const std::vector<int> loaded = Ranks(1, "memory", root_ + "/nvme0", [&](Engine& e) {
      auto client = e.LoadCheckpoint(ckpt);
      if (!client.ok()) std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
      return client.ok() ? 0 : 1;
    });
    ASSERT_EQ(loaded, std::vector<int>{0}) << "round " << round << " (" << *dir << ")";
  }
  // Both outcomes happened.
  EXPECT_GT(saw_new, 0);
  EXPECT_GT(saw_old, 0);
}

// A peer lost as a save begins (its host's link down, its process gone): the save fails on the
// ranks left, and the directory holds only committed checkpoints, no tag without its manifest.
TEST_F(CkptMultiprocTest, PeerLostAsASaveBeginsLeavesNoUncommittedTag) {
  const std::string ckpt = root_ + "/ckpt";
  const std::vector<int> codes = Ranks(2, "memory", root_ + "/nvme", [&](Engine& e) {
    if (!TrainCkptEngine(e, 0, 1).ok() || !e.SaveCheckpoint(ckpt, "step-1").ok()) return 1;
    if (e.rank() == 1) return 0;  // gone before the next save
    const Status s = e.SaveCheckpoint(ckpt, "step-2");
    if (s.ok()) return 2;
    std::fprintf(stderr, "rank 0, as expected: %s\n", s.ToString().c_str());
    return 0;
  });
  ASSERT_EQ(codes, (std::vector<int>{0, 0}));
  std::vector<std::string> entries;
  for (const auto& entry : fs::directory_iterator(ckpt)) {
    entries.push_back(entry.path().filename().string());
  }
  std::sort(entries.begin(), entries.end());
  EXPECT_EQ(entries, (std::vector<std::string>{"latest", "step-1"}));
  EXPECT_TRUE(fs::exists(ckpt + "/step-1/manifest.json"));
}

}  // namespace
}  // namespace zinf
