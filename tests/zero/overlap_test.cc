// Note [Overlapped step]: the NVMe optimizer step run alongside backward gives bitwise the
// parameters and optimizer state of the step run after it, for every NVMe placement, on one
// and two ranks, with gradient accumulation, in steps that clip, skip (fp16 overflow) and
// are refused (a non-finite bf16 gradient); and what would race with it is refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/engine_setup.h"
#include "tests/testing/fork_ranks.h"
#include "tests/testing/rank_outcome.h"
#include "tests/testing/temp_dir.h"
#include "zinf/engine.h"
#include "zinf/tiered_store.h"

namespace zinf {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

constexpr int kModules = 6;
constexpr int64_t kWeight = 400000;  // 2.4M elements: three optimizer chunks on one rank
constexpr int64_t kBias = 40;        // persistent (below the threshold)
constexpr int kSteps = 5;

struct TrainRun {
  int world = 1;
  int accumulation = 1;
  bool overlap = true;
  bool params_nvme = false;
  double nvme_ratio = 1.0;
  bool fp16 = false;
  bool bf16 = false;
  int bad_step = -1;  // a non-finite gradient on the last rank at this step
  bool gradients_nvme = false;
  uint64_t overlap_swap_bytes = 0;  // zinf.overlap_optimizer_swap_bytes
  bool beside_forward = false;      // zinf.step_beside_forward
  uint64_t prefetch_bucket = 0;     // stage3_prefetch_bucket_size (0: the default)
  // Time the trainer takes between a step and the next forward (loading the next batch).
  std::chrono::milliseconds between_batches{0};
  // Close the engine right after the last step (its part beside the forward in flight) and
  // record what the process wrote to disk while closing, instead of gathering the parameters.
  bool close_after_step = false;
  std::string dir;
};

std::string Config(const TrainRun& r) {
  const std::string nvme = "{\"device\": \"nvme\", \"nvme_path\": \"" + r.dir + "\"}";
  const std::string prefetch =
      r.prefetch_bucket == 0
          ? ""
          : " \"stage3_prefetch_bucket_size\": " + std::to_string(r.prefetch_bucket) + ",";
  return "{\"zero_optimization\": {\"stage\": 3, \"stage3_param_persistence_threshold\": 1000,"
         " \"reduce_bucket_size\": 800000," +
         prefetch + " \"offload_optimizer\": " + nvme +
         ", \"offload_param\": " + (r.params_nvme ? nvme : std::string("{\"device\": \"cpu\"}")) +
         "}, \"gradient_accumulation_steps\": " + std::to_string(r.accumulation) +
         ", \"gradient_clipping\": 1.0, \"fp16\": {\"enabled\": " + (r.fp16 ? "true" : "false") +
         ", \"hysteresis\": 1, \"initial_scale_power\": 8}, \"bf16\": {\"enabled\": " +
         (r.bf16 ? "true" : "false") +
         "}, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": "
         "0.01}}, \"zinf\": {\"gradients_on_nvme\": " +
         (r.gradients_nvme ? "true" : "false") +
         ", \"overlap_optimizer\": " + (r.overlap ? "true" : "false") +
         ", \"overlap_optimizer_swap_bytes\": " + std::to_string(r.overlap_swap_bytes) +
         ", \"step_beside_forward\": " + (r.beside_forward ? "true" : "false") +
         ", \"optimizer_nvme_ratio\": " + std::to_string(r.nvme_ratio) + "}}";
}

// Bytes this process has sent to the disk (/proc/self/io write_bytes: O_DIRECT writes too).
uint64_t DiskBytesWritten() {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (io >> key >> value) {
    if (key == "write_bytes:") return value;
  }
  return 0;
}

// Gradient amplitude per step: steps 1 and 3 are large enough to be clipped (norm > 1). The
// engine speculates in steps 0 and 3 (the first, and the one after an unclipped step): a bad
// gradient at step 0 or 3 has speculation to undo.
double Amplitude(int step) { return step % 2 == 1 ? 1e-2 : 1e-5; }

// One rank: kSteps steps of a gradient that depends on the fetched weights (a stale or
// half-updated fetch changes it); rank 0 writes every parameter, then a line per step
// "skipped clip_coefficient overlapped_seconds" to `dir`/out.bin and steps.txt.
int TrainRank(int rank, int port, const TrainRun& r) {
  auto created =
      testing::CreateRankEngine(Config(r), testing::HostRankOptions(rank, r.world, port, 30000ms));
  if (!created.ok()) return 11;
  Engine& e = **created;
  std::vector<int> modules;
  std::vector<std::string> names;
  for (int m = 0; m < kModules; ++m) {
    const std::string w = "layer" + std::to_string(m) + ".weight";
    const std::string b = "layer" + std::to_string(m) + ".bias";
    modules.push_back(*e.RegisterModule(
        "layer" + std::to_string(m),
        {{w, {kWeight}, ParamInit::kNormal, 0.5f}, {b, {kBias}, ParamInit::kOnes}}));
    names.push_back(w);
    names.push_back(b);
  }
  if (Status s = e.Initialize(); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 12;
  }
  std::ofstream steps(rank == 0 ? r.dir + "/steps.txt" : "/dev/null");
  for (int step = 0; step < kSteps; ++step) {
    for (int micro = 0; micro < r.accumulation; ++micro) {
      std::vector<std::vector<float>> seen(kModules);
      for (int m = 0; m < kModules; ++m) {  // forward
        auto f = e.Fetch(modules[m]);
        if (!f.ok()) return 13;
        seen[m].assign(f->params[0], f->params[0] + kWeight);
        if (!e.Release(modules[m]).ok()) return 14;
      }
      for (int m = kModules - 1; m >= 0; --m) {  // backward, last layer first
        if (!e.Fetch(modules[m]).ok()) return 15;
        auto g = e.Gradients(modules[m]);
        if (!g.ok()) return 16;
        const double a = Amplitude(step) * e.loss_scale();
        for (int64_t i = 0; i < kWeight; ++i) {
          (*g)[0][i] +=
              static_cast<float>(a * (seen[m][i] - std::sin(0.001 * i + m + 0.1 * (rank + micro))));
        }
        for (int64_t i = 0; i < kBias; ++i) (*g)[1][i] += static_cast<float>(a * (i - 20));
        if (step == r.bad_step && rank == r.world - 1 && m == kModules - 1) {
          (*g)[0][7] = INFINITY;
        }
        if (!e.ReduceGradients(modules[m]).ok() || !e.Release(modules[m]).ok()) return 17;
        // Backward's compute: the time the overlapped step has to work in.
        if (m == 1 && micro == r.accumulation - 1) std::this_thread::sleep_for(150ms);
      }
    }
    auto summary = e.Step();
    if (!summary.ok()) {
      // A non-finite bf16 gradient: the step is refused and nothing changed.
      steps << "refused " << summary.status().ToString() << "\n";
      break;
    }
    // How far the step beside the next forward gets while the trainer waits before it.
    auto at_step = e.store_stats();
    std::this_thread::sleep_for(r.between_batches);
    auto at_forward = e.store_stats();
    if (!at_step.ok() || !at_forward.ok()) return 20;
    steps << summary->skipped << " " << summary->clip_coefficient << " "
          << summary->seconds_optimizer_overlapped << " " << summary->host_bytes << " "
          << summary->bytes_nvme_written << " " << summary->bytes_nvme_read << " "
          << at_forward->host_to_nvme.bytes - at_step->host_to_nvme.bytes << "\n";
  }
  if (r.close_after_step) {
    const uint64_t before = DiskBytesWritten();
    created->reset();
    steps << "closed " << DiskBytesWritten() - before << "\n";
    return 0;
  }
  std::vector<float> v;
  std::ofstream out(r.dir + "/out.bin", std::ios::binary);
  for (const std::string& name : names) {
    if (Status s = e.GatherParameter(name, &v); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 18;
    }
    if (rank == 0) out.write(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  }
  return rank != 0 || out.good() ? 0 : 19;
}

using Outcome = testing::RankOutcome;

Outcome Train(TrainRun r, const std::string& label) {
  return testing::TrainRanks(r.world, "zinf-overlap-" + label,
                             [&](int rank, int port, const std::string& dir) {
                               r.dir = dir;
                               return TrainRank(rank, port, r);
                             });
}

// One line of steps.txt, as TrainRank writes it.
struct StepLine {
  int skipped = 0;
  double clip = 0, overlapped_seconds = 0;
  unsigned long long host_bytes = 0, written = 0, read = 0, written_while_waiting = 0;
};

StepLine ParseStep(const std::string& line) {
  StepLine l;
  std::istringstream in(line);
  in >> l.skipped >> l.clip >> l.overlapped_seconds >> l.host_bytes >> l.written >> l.read >>
      l.written_while_waiting;
  EXPECT_FALSE(in.fail()) << "a step line: " << line;
  return l;
}

struct Case {
  const char* label;
  TrainRun run;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.label; }

class OverlapTest : public ::testing::TestWithParam<Case> {};

TEST_P(OverlapTest, BitwiseEqualToTheStepAfterBackward) {
  TrainRun on = GetParam().run, off = on;
  off.overlap = false;
  const Outcome a = Train(on, std::string(GetParam().label) + "-on");
  const Outcome b = Train(off, std::string(GetParam().label) + "-off");
  const size_t bytes = kModules * (kWeight + kBias) * 4;
  ASSERT_GE(a.params.size(), bytes);
  ASSERT_EQ(a.params.size(), b.params.size());
  EXPECT_TRUE(a.params == b.params) << "the overlapped step changed the result";
  ASSERT_EQ(a.steps.size(), b.steps.size());
  bool clipped = false, unclipped = false, overlapped = false, skipped = false;
  for (size_t s = 0; s < a.steps.size(); ++s) {
    if (a.steps[s].rfind("refused", 0) == 0) {
      EXPECT_THAT(b.steps[s], HasSubstr("refused"));
      continue;
    }
    const StepLine sa = ParseStep(a.steps[s]), sb = ParseStep(b.steps[s]);
    EXPECT_EQ(sa.skipped, sb.skipped) << "step " << s;
    EXPECT_EQ(sa.clip, sb.clip) << "step " << s;
    EXPECT_EQ(sb.overlapped_seconds, 0.0) << "nothing overlaps when it is off";
    (sa.clip < 1 ? clipped : unclipped) = true;
    skipped |= sa.skipped != 0;
    overlapped |= sa.overlapped_seconds > 0;
  }
  // The cases are what they claim: steps that clip and steps that do not, and work done
  // while backward went on (the speculation was exercised, kept and dropped).
  EXPECT_TRUE(clipped && unclipped);
  EXPECT_TRUE(overlapped);
  EXPECT_EQ(skipped, GetParam().run.fp16 && GetParam().run.bad_step >= 0);
}

INSTANTIATE_TEST_SUITE_P(
    Placements, OverlapTest,
    ::testing::Values(
        Case{"host_master", {.world = 1}}, Case{"params_nvme", {.world = 1, .params_nvme = true}},
        Case{"split_ratio", {.world = 1, .nvme_ratio = 0.5}},
        Case{"params_nvme_bf16", {.world = 1, .params_nvme = true, .bf16 = true}},
        Case{"two_ranks_gas2", {.world = 2, .accumulation = 2}},
        Case{"two_ranks_params_nvme_fp16_overflow",
             {.world = 2, .params_nvme = true, .fp16 = true, .bad_step = 0}},
        Case{"fp16_overflow", {.world = 1, .fp16 = true, .bad_step = 0}},
        // Swap room for one chunk's new state: one chunk speculated, two stepped after.
        Case{"swap_room_for_one_chunk",
             {.world = 1, .params_nvme = true, .overlap_swap_bytes = 14 << 20}},
        Case{"gradients_nvme_gas2", {.world = 1, .accumulation = 2, .gradients_nvme = true}},
        Case{"two_ranks_gradients_and_params_nvme",
             {.world = 2, .params_nvme = true, .gradients_nvme = true}},
        Case{"bf16_refused", {.world = 1, .params_nvme = true, .bf16 = true, .bad_step = 3}},
        // fp32: the parameter tier is the master, and the dropped speculation puts parameters
        // that span chunks back and visits them again.
        Case{"params_nvme_refused", {.world = 1, .params_nvme = true, .bad_step = 3}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.label); });

// Note [Parameters kept by the caller]: with parameters and optimizer on NVMe in fp32 the
// parameter tier is the master, so a step that is not speculated (step 2 follows a clipped
// one) writes each parameter once, to the tier, and each chunk only its two state arrays: 12
// bytes an element, where two copies took 16.
TEST(OneNvmeCopyTest, AStepWritesEachParameterOnceAndTheChunksTheirStateAlone) {
  const Outcome o = Train({.world = 1, .params_nvme = true}, "one-copy");
  ASSERT_EQ(o.steps.size(), static_cast<size_t>(kSteps));
  const StepLine clipped = ParseStep(o.steps[1]), after = ParseStep(o.steps[2]);
  ASSERT_LT(clipped.clip, 1.0) << "step 1 clips, so step 2 is not speculated";
  ASSERT_EQ(after.clip, 1.0);
  const double elements = kModules * (kWeight + kBias);
  EXPECT_GT(after.written, 11.5 * elements);
  EXPECT_LT(after.written, 12.5 * elements) << "bytes written an element";
}

// Note [Step in the next forward's order]: the step's last part run beside the next batch's
// forward, chunk by chunk in its order, gives bitwise the step run before that forward, for
// each placement where it applies (parameters and optimizer state on NVMe), on one and two
// ranks, with and without the overlapped step, in steps that clip, skip and are refused. The
// gradient depends on the fetched weights, so a fetch that saw a parameter before its update
// would change the result. And the forward takes the parameters from memory as the step
// writes them: it reads less from NVMe than when they are read back.
class BesideForwardTest : public ::testing::TestWithParam<Case> {};

TEST_P(BesideForwardTest, BitwiseEqualToTheStepBeforeForward) {
  TrainRun beside = GetParam().run, before = beside;
  beside.beside_forward = true;
  before.beside_forward = false;
  const Outcome a = Train(beside, std::string(GetParam().label) + "-beside");
  const Outcome b = Train(before, std::string(GetParam().label) + "-before");
  ASSERT_GE(a.params.size(), kModules * (kWeight + kBias) * 4);
  ASSERT_EQ(a.params.size(), b.params.size());
  EXPECT_TRUE(a.params == b.params) << "the step beside the forward changed the result";
  ASSERT_EQ(a.steps.size(), b.steps.size());
  bool clipped = false, unclipped = false, skipped = false;
  double beside_seconds = 0;
  unsigned long long read_a = 0, read_b = 0;
  for (size_t s = 0; s < a.steps.size(); ++s) {
    if (a.steps[s].rfind("refused", 0) == 0) {
      EXPECT_THAT(b.steps[s], HasSubstr("refused"));
      continue;
    }
    const StepLine sa = ParseStep(a.steps[s]), sb = ParseStep(b.steps[s]);
    EXPECT_EQ(sa.skipped, sb.skipped) << "step " << s;
    EXPECT_EQ(sa.clip, sb.clip) << "step " << s;
    (sa.clip < 1 ? clipped : unclipped) = true;
    skipped |= sa.skipped != 0;
    beside_seconds += sa.overlapped_seconds - sb.overlapped_seconds;
    read_a += sa.read;
    read_b += sb.read;
  }
  EXPECT_TRUE(clipped && unclipped);
  EXPECT_EQ(skipped, GetParam().run.fp16 && GetParam().run.bad_step >= 0);
  EXPECT_LT(read_a, read_b) << "the forward read back from NVMe what the step had just written";
  // Without the overlapped step all of it ran beside the forward; the summaries say so.
  if (!GetParam().run.overlap) {
    EXPECT_GT(beside_seconds, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Placements, BesideForwardTest,
    ::testing::Values(
        Case{"params_nvme", {.world = 1, .overlap = false, .params_nvme = true}},
        Case{"params_nvme_overlapped", {.world = 1, .params_nvme = true}},
        Case{"params_nvme_bf16", {.world = 1, .overlap = false, .params_nvme = true, .bf16 = true}},
        Case{"split_ratio", {.world = 1, .overlap = false, .params_nvme = true, .nvme_ratio = 0.5}},
        Case{"gradients_nvme_gas2",
             {.world = 1, .accumulation = 2, .params_nvme = true, .gradients_nvme = true}},
        Case{"two_ranks_fp16_overflow",
             {.world = 2, .overlap = false, .params_nvme = true, .fp16 = true, .bad_step = 0}},
        Case{"two_ranks_gas2_overlapped", {.world = 2, .accumulation = 2, .params_nvme = true}},
        Case{"bf16_refused",
             {.world = 1, .overlap = false, .params_nvme = true, .bf16 = true, .bad_step = 3}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.label); });

// Note [Step in the next forward's order]: the step keeps in memory the parameters it writes
// for the forward, but runs at most the next module (stage3_prefetch_bucket_size) ahead of
// it: however long the trainer takes before that forward, the step goes no further meanwhile,
// and the memory it keeps is one module's, not the model's.
// One rank, parameters and optimizer on NVMe, the step wholly beside the forward and its lead
// one module.
TrainRun OneModuleLead() {
  return {.world = 1,
          .overlap = false,
          .params_nvme = true,
          .beside_forward = true,
          .prefetch_bucket = kWeight + kBias};
}

TEST(BesideForwardTest, RunsOnlyTheNextModuleAheadOfTheForward) {
  TrainRun beside = OneModuleLead();
  beside.between_batches = 400ms;
  TrainRun before = beside;
  before.beside_forward = false;
  const Outcome a = Train(beside, "lead-beside");
  const Outcome b = Train(before, "lead-before");
  EXPECT_TRUE(a.params == b.params);
  ASSERT_EQ(a.steps.size(), static_cast<size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s) {
    const StepLine sa = ParseStep(a.steps[s]);
    // The step's writes: its optimizer chunks' state and the parameters. It goes on to the
    // end of the optimizer chunk (two modules here) that holds the next module, and stops.
    EXPECT_GT(sa.written_while_waiting, 0u) << "step " << s;
    EXPECT_LE(sa.written_while_waiting, ParseStep(b.steps[s]).written / 2) << "step " << s;
  }
}

// An engine closed while the step beside the next forward is in flight stops that step at its
// next chunk rather than finishing it: its result would go with the engine.
TEST(BesideForwardTest, AnEngineClosedMidStepStopsTheStep) {
  TrainRun run = OneModuleLead();
  run.close_after_step = true;
  const Outcome closed = Train(run, "close-mid-step");
  ASSERT_EQ(closed.steps.size(), static_cast<size_t>(kSteps) + 1);
  const std::string& last = closed.steps.back();
  ASSERT_EQ(last.rfind("closed ", 0), 0u) << last;
  const unsigned long long written = std::stoull(last.substr(7));
  // A whole step writes its chunks' state and the parameters; stopped, at most the first
  // optimizer chunk's (of three) and what was in flight.
  const unsigned long long step = ParseStep(closed.steps[kSteps - 1]).written;
  EXPECT_LT(written, step / 2) << "the closing engine finished the step";
}

// Note [Gradients on NVMe]: the accumulators on NVMe train the model the host accumulators
// do, over several optimizer chunks, ranks and micro-batches, with clipped and skipped steps.
// The global norm is summed chunk by chunk there, so the clip coefficient may differ in its
// last bits: equal to float rounding, not bitwise.
TEST(GradientsOnNvmeTest, TrainLikeHostAccumulators) {
  for (TrainRun run : {TrainRun{.world = 1, .accumulation = 2, .params_nvme = true},
                       TrainRun{.world = 2, .fp16 = true, .bad_step = 0}}) {
    run.overlap = false;
    TrainRun nvme = run;
    nvme.gradients_nvme = true;
    const std::string label = "grads-w" + std::to_string(run.world);
    const Outcome host = Train(run, label + "-host");
    const Outcome disk = Train(nvme, label + "-nvme");
    ASSERT_EQ(host.params.size(), disk.params.size());
    ASSERT_GE(host.params.size(), kModules * (kWeight + kBias) * 4);
    const float* a = reinterpret_cast<const float*>(host.params.data());
    const float* b = reinterpret_cast<const float*>(disk.params.data());
    double worst = 0;
    size_t differ = 0;
    for (size_t i = 0; i < host.params.size() / 4; ++i) {
      worst = std::max(worst, std::abs(double(a[i]) - b[i]));
      differ += a[i] != b[i];
    }
    EXPECT_LT(worst, 1e-6) << label;
    EXPECT_EQ(host.steps.size(), disk.steps.size());
    for (size_t s = 0; s < host.steps.size() && s < disk.steps.size(); ++s) {
      EXPECT_EQ(host.steps[s].substr(0, 1), disk.steps[s].substr(0, 1)) << "skipped alike";
    }
    // Host memory no longer holds the accumulators (4 bytes an element of the rank's shard).
    const uint64_t shard = kModules * (kWeight + kBias) / run.world;
    const StepLine h = ParseStep(host.steps.back()), d = ParseStep(disk.steps.back());
    const unsigned long long host_bytes = h.host_bytes, disk_bytes = d.host_bytes;
    const unsigned long long host_written = h.written, disk_written = d.written;
    EXPECT_GE(host_bytes, disk_bytes + shard * 4) << label;
    // ... and the step's NVMe traffic counts the accumulators' writes, once a micro-batch.
    EXPECT_GE(disk_written, host_written + run.accumulation * shard * 4) << label;
    std::printf("%s: %zu of %zu parameters differ, by %.3g at most; host bytes %llu -> %llu\n",
                label.c_str(), differ, host.params.size() / 4, worst, host_bytes, disk_bytes);
    std::fflush(stdout);
  }
}

// What reads or changes what the overlapped step writes is refused while it runs, naming
// itself; with the overlap off the same calls work.
TEST(OverlapGuardTest, FetchAfterTheLastReductionAndParameterAccessAreRefused) {
  for (bool overlap : {true, false}) {
    const testing::TempDir tmp(overlap ? "zinf-overlap-guard-on" : "zinf-overlap-guard-off");
    TrainRun r{.overlap = overlap, .dir = tmp.path()};
    auto config = EngineConfig::FromJson(Config(r));
    ASSERT_TRUE(config.ok()) << config.status();
    auto engine = Engine::Create(
        *config, {.device = "host", .rank = 0, .world_size = 1, .optimizer_threads = 1});
    ASSERT_TRUE(engine.ok()) << engine.status();
    Engine& e = **engine;
    const int a = *e.RegisterModule("a", {{"a.weight", {kWeight}}});
    const int b = *e.RegisterModule("b", {{"b.weight", {kWeight}}});
    ASSERT_TRUE(e.Initialize().ok());
    for (int m : {a, b}) ASSERT_TRUE(e.Fetch(m).ok() && e.Release(m).ok());
    ASSERT_TRUE(e.Fetch(b).ok() && e.Gradients(b).ok());
    ASSERT_TRUE(e.ReduceGradients(b).ok() && e.Release(b).ok());
    StatusOr<FetchedModule> again = e.Fetch(b);
    std::vector<float> v;
    Status gathered = e.GatherParameter("a.weight", &v);
    Status saved = e.SaveCheckpoint(r.dir + "/ckpt", "t");
    if (overlap) {
      EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
      EXPECT_THAT(again.status().message(), HasSubstr("under way"));
      EXPECT_THAT(again.status().message(), HasSubstr("module 'b'"));
      EXPECT_EQ(gathered.code(), StatusCode::kFailedPrecondition);
      EXPECT_EQ(saved.code(), StatusCode::kFailedPrecondition);
      EXPECT_THAT(saved.message(), HasSubstr("SaveCheckpoint"));
    } else {
      EXPECT_TRUE(again.ok()) << again.status();
      EXPECT_TRUE(e.Release(b).ok());
      EXPECT_TRUE(gathered.ok()) << gathered;
      EXPECT_THAT(saved.message(), HasSubstr("gradients pending")) << "refused for its own reason";
    }
    ASSERT_TRUE(e.Fetch(a).ok() && e.Gradients(a).ok());
    ASSERT_TRUE(e.ReduceGradients(a).ok() && e.Release(a).ok());
    auto summary = e.Step();
    ASSERT_TRUE(summary.ok()) << summary.status();
    EXPECT_TRUE(e.GatherParameter("a.weight", &v).ok()) << "allowed again after the step";
  }
}

// Note [Delayed parameter update]: batch t+1 computes with the parameters batch t did; from
// batch t+2 on it sees step t's update, which is bitwise the update without the delay (the
// same gradients at the same parameters), so the delayed run's parameters at batch 2 are the
// plain run's at batch 1, and from then on the runs differ.
std::vector<std::vector<float>> FetchedPerStep(bool delayed, std::vector<float>* gathered,
                                               int warmup = 0) {
  const std::string config =
      std::string(
          "{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": "
          "\"cpu\"}, \"offload_param\": {\"device\": \"cpu\"}}, "
          "\"gradient_clipping\": 1.0, \"optimizer\": {\"type\": \"AdamW\", "
          "\"params\": {\"lr\": 0.01}}, \"zinf\": {\"delayed_param_update_warmup_steps\": ") +
      std::to_string(warmup) + ", \"delayed_param_update\": " + (delayed ? "true" : "false") + "}}";
  auto parsed = EngineConfig::FromJson(config);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  auto engine = Engine::Create(
      *parsed, {.device = "host", .rank = 0, .world_size = 1, .optimizer_threads = 1});
  EXPECT_TRUE(engine.ok()) << engine.status();
  Engine& e = **engine;
  constexpr int64_t n = 5000;
  const int a = *e.RegisterModule("a", {{"a.weight", {n}, ParamInit::kNormal, 0.5f}});
  const int b = *e.RegisterModule("b", {{"b.weight", {n}, ParamInit::kNormal, 0.5f}});
  EXPECT_TRUE(e.Initialize().ok());
  std::vector<std::vector<float>> fetched;
  for (int step = 0; step < 4; ++step) {
    std::vector<float> seen;
    for (int m : {a, b}) {
      auto f = e.Fetch(m);
      EXPECT_TRUE(f.ok());
      seen.insert(seen.end(), f->params[0], f->params[0] + n);
      EXPECT_TRUE(e.Release(m).ok());
    }
    for (int m : {b, a}) {
      EXPECT_TRUE(e.Fetch(m).ok());
      auto g = e.Gradients(m);
      EXPECT_TRUE(g.ok());
      const float* w = seen.data() + (m == a ? 0 : n);
      for (int64_t i = 0; i < n; ++i) (*g)[0][i] = 1e-3f * (w[i] - std::sin(0.01f * i));
      EXPECT_TRUE(e.ReduceGradients(m).ok() && e.Release(m).ok());
    }
    auto summary = e.Step();
    EXPECT_TRUE(summary.ok()) << summary.status();
    fetched.push_back(std::move(seen));
  }
  EXPECT_TRUE(e.GatherParameter("a.weight", gathered).ok());
  return fetched;
}

TEST(DelayedUpdateTest, BatchesComputeWithParametersOneStepStale) {
  std::vector<float> gathered_plain, gathered_delayed;
  const auto plain = FetchedPerStep(false, &gathered_plain);
  const auto delayed = FetchedPerStep(true, &gathered_delayed);
  EXPECT_EQ(delayed[0], plain[0]);
  EXPECT_EQ(delayed[1], plain[0]) << "batch 1 computes with the initial parameters";
  EXPECT_NE(plain[1], plain[0]);
  EXPECT_EQ(delayed[2], plain[1]) << "step 0's update, bitwise as without the delay";
  EXPECT_NE(delayed[3], plain[2]) << "later updates use gradients at stale parameters";
  EXPECT_NE(delayed[3], delayed[2]);
  // GatherParameter waits for the last update in flight and reads its result, which the
  // next batch's forward would see.
  EXPECT_NE(std::vector<float>(gathered_delayed.begin(), gathered_delayed.end()),
            std::vector<float>(delayed[3].begin(), delayed[3].begin() + 5000));
  // With two warm-up steps the delay starts at step 2: batches 0-2 as without it, batch 3
  // still with step 2's parameters.
  std::vector<float> ignored;
  const auto warm = FetchedPerStep(true, &ignored, /*warmup=*/2);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(warm[s], plain[s]) << "batch " << s;
  EXPECT_EQ(warm[3], plain[2]);
}

TEST(DelayedUpdateTest, RefusedWithTheOptimizerOnNvme) {
  auto config = EngineConfig::FromJson(
      R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme",
          "nvme_path": "/tmp"}}, "zinf": {"delayed_param_update": true}})");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("zinf.delayed_param_update"));
  // And the gradients go to NVMe only beside an optimizer state that is there.
  config = EngineConfig::FromJson(
      R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
          "zinf": {"gradients_on_nvme": true}})");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("zinf.gradients_on_nvme needs"));
}

}  // namespace
}  // namespace zinf
