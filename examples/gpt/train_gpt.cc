// train_gpt: a GPT-2-style byte-level language model (examples/gpt/gpt_model.h) trained with
// zinf's ZeRO engine from a DeepSpeed-style JSON config, using only zinf's public headers.
//
// Build:  cmake --build build --target train_gpt zinf
// Run:    build/bin/zinf run -n 2 -- build/bin/train_gpt --config examples/gpt/configs/cpu.json
//             [--steps 300] [--lr LR] [--data FILE] [--metrics FILE] [--nvme-path DIR]
//             [--threads N]
//             [--save DIR [--save-every K]] [--resume DIR | --init-from F.safetensors]
//             [--device cpu|cuda]
//             [--matmul auto|fp32|bf16] [--comm-timeout-s S]
//
// The config is a DeepSpeed config (what EngineConfig reads) plus a "model" object with
// GptConfig's keys; train_micro_batch_size_per_gpu is the number of sequences of seq_len
// bytes each rank runs per micro-batch. The batch shape is the engine's (Engine::config(),
// resolved from train_batch_size, the micro-batch and the accumulation as DeepSpeed does), so
// a config that gives only train_batch_size trains at the micro-batch it implies. --steps and
// --lr are the trainer's values for "auto" in the config (scheduler.params.total_num_steps,
// optimizer.params.lr and scheduler.params.warmup_max_lr); --nvme-path replaces every NVMe
// path in the config. Without --data the program trains on a corpus it
// generates itself (GenerateCorpus). Rank 0 prints each step (a progress bar on a terminal),
// writes --metrics as JSON lines (`zinf plot metrics FILE --plot OUT.png` draws the loss and
// step time from them), and closes with a summary.
//
// Checkpoints: --save DIR writes one at the end (and every K steps with --save-every); --resume
// DIR continues from DIR's latest. The data a step sees depends only on the step index and
// the seed, which the checkpoint records, so a resumed run takes bitwise the steps the
// uninterrupted one would have. DIR is checked (created, written to) before training, so that
// a run is never lost to a checkpoint that cannot be written at its end.
//
// --init-from F.safetensors starts from the weights in F (`zinf ckpt export` writes such
// files) instead of random ones, with fresh optimizer state at step 0. Every parameter needs
// a tensor of its name and shape in F, and F may hold nothing else (Engine::LoadSafetensors):
// the names and shapes are those listed at the top of examples/gpt/gpt_model.h, Hugging
// Face's GPT-2 names in torch's nn.Linear layout [out, in] (Hugging Face's own GPT-2 files
// store Conv1D weights as [in, out], which is refused as a shape mismatch naming the tensor).
//
// Errors: every failure, from the command line to the last save, ends the program with a
// message naming the cause and exit code 1 (train_gpt: <Status>), never an uncaught exception.
//
// --device cuda computes on the GPU (one per rank, the rank's LOCAL_RANK-th): the engine
// gathers parameters and reduce-scatters gradients there (NCCL), the model runs on cuBLAS
// over the engine's device tensors, and the shards and the optimizer stay where the config
// puts them. It fails with Unavailable, saying why, where zinf was built without CUDA or
// there is no GPU.
//
// --matmul picks the element type of the matmuls' inputs (fp32 accumulation either way; see
// gpt::MatmulPrecision): auto (default) multiplies in bf16 when the config enables bf16 and
// the device has native bf16 matmuls (AVX512_BF16 or AMX; a GPU of compute capability 8.0+),
// fp32 forces the fp32 path, bf16 asks for bf16 whatever the config says.
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "examples/gpt/gpt_model.h"
#include "examples/gpt/json_input.h"
#include "zinf/cpu_info.h"
#include "zinf/engine.h"
#include "zinf/input_file.h"

namespace {

using Clock = std::chrono::steady_clock;
using zinf::Status;
using zinf::StatusOr;

struct Args {
  std::string config;
  std::string nvme_path;  // replaces every nvme_path in the config (and "@NVME_PATH@")
  std::string data;       // a file of bytes; empty: GenerateCorpus
  std::string metrics;    // JSON lines, one per step; empty: none
  int64_t steps = 300;
  double lr = std::nan("");  // the trainer's learning rate for "auto" (NaN: none given)
  int log_every = -1;        // -1: every step, or never on a terminal (the progress bar shows it)
  int threads = 0;           // 0: DefaultThreads()
  uint64_t seed = 1234;
  std::string save;  // checkpoint directory; empty: none
  int64_t save_every = 0;
  std::string resume;             // checkpoint directory to continue from
  std::string init_from;          // safetensors file of initial weights
  std::string device = "cpu";     // where the model computes: cpu or cuda
  std::string matmul = "auto";    // the matmuls' input type: auto, fp32 or bf16
  double comm_timeout_s = 300;    // EngineOptions::timeout: how long a dead peer takes to report
  std::vector<std::string> sets;  // "a.b.c=JSON": config keys replaced after reading the file
};

// printf into a std::string, for error messages.
__attribute__((format(printf, 1, 2))) std::string Printf(const char* format, ...) {
  va_list args, again;
  va_start(args, format);
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string out(std::max(n, 0), '\0');
  std::vsnprintf(out.data(), out.size() + 1, format, again);
  va_end(again);
  return out;
}

struct TrainConfig {
  gpt::GptConfig model;
  zinf::EngineConfig engine;
};

// Splits a DeepSpeed config: "model" is ours, the rest goes to EngineConfig (which refuses
// keys it does not know, and reads train_micro_batch_size_per_gpu for the trainer).
// Applies "a.b.c=VALUE" to `json`: VALUE is JSON (a bare word that is not JSON is a string),
// and the objects on the path are created as needed.
Status ApplySet(const std::string& set, nlohmann::json* json) {
  const size_t eq = set.find('=');
  if (eq == std::string::npos || eq == 0) {
    return zinf::InvalidArgument("--set '" + set + "': expected KEY.PATH=VALUE");
  }
  const std::string value_text = set.substr(eq + 1);
  // Too deep is an error; not JSON at all is a bare word.
  if (Status s = zinf::CheckJsonDepth(value_text, "--set " + set); !s.ok()) return s;
  StatusOr<nlohmann::json> parsed = gpt::ParseJson(value_text, "--set " + set);
  nlohmann::json value = parsed.ok() ? *std::move(parsed) : nlohmann::json(value_text);
  nlohmann::json* at = json;
  std::string path = set.substr(0, eq);
  for (size_t start = 0;;) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot - start);
    if (key.empty()) return zinf::InvalidArgument("--set '" + set + "': empty key in the path");
    if (!at->is_object()) {
      return zinf::InvalidArgument("--set '" + set + "': '" + path.substr(0, start - 1) +
                                   "' is not an object in the config");
    }
    if (dot == std::string::npos) {
      (*at)[key] = value;
      return zinf::OkStatus();
    }
    at = &(*at)[key];
    if (at->is_null()) *at = nlohmann::json::object();
    start = dot + 1;
  }
}

// --nvme-path DIR: every offload object of the config puts its NVMe files in DIR, whatever
// nvme_path it names (a config copied from elsewhere names that machine's disks).
void OverrideNvmePaths(const std::string& nvme_path, nlohmann::json* json) {
  if (nvme_path.empty()) return;
  auto zero = json->find("zero_optimization");
  if (zero == json->end() || !zero->is_object()) return;
  for (const char* section : {"offload_param", "offload_optimizer"}) {
    auto offload = zero->find(section);
    if (offload != zero->end() && offload->is_object()) (*offload)["nvme_path"] = nvme_path;
  }
}

StatusOr<TrainConfig> LoadConfig(const std::string& path, const std::string& nvme_path,
                                 const std::vector<std::string>& sets,
                                 const zinf::TrainerValues& trainer) {
  ZINF_ASSIGN_OR_RETURN(std::string json_text, zinf::ReadInputFile(path, "--config"));
  if (json_text.find("@NVME_PATH@") != std::string::npos && nvme_path.empty()) {
    return zinf::InvalidArgument(path + " puts data on NVMe at @NVME_PATH@: give --nvme-path DIR");
  }
  for (size_t at; (at = json_text.find("@NVME_PATH@")) != std::string::npos;) {
    json_text.replace(at, 11, nvme_path);
  }
  ZINF_ASSIGN_OR_RETURN(nlohmann::json json, gpt::ParseJson(json_text, path));
  if (!json.is_object()) return zinf::InvalidArgument(path + ": not a JSON object");
  for (const std::string& set : sets) {
    if (Status s = ApplySet(set, &json); !s.ok()) return s;
  }
  OverrideNvmePaths(nvme_path, &json);
  TrainConfig c;
  if (json.contains("model")) {
    auto model = gpt::GptConfig::FromJson(json["model"].dump());
    if (!model.ok()) return model.status().WithContext(path);
    c.model = *model;
    json.erase("model");
  }
  auto engine = zinf::EngineConfig::FromJson(json.dump(), trainer);
  if (!engine.ok()) return engine.status().WithContext(path);
  c.engine = *engine;
  return c;
}

std::string HumanBytes(uint64_t n) {
  char out[32];
  if (n < 1024) {
    std::snprintf(out, sizeof(out), "%llu B", static_cast<unsigned long long>(n));
  } else {
    const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
    double v = n / 1024.0;
    int u = 0;
    for (; v >= 1024 && u < 3; ++u) v /= 1024;
    std::snprintf(out, sizeof(out), "%.1f %s", v, units[u]);
  }
  return out;
}

// Refuses, before the model allocates anything, a micro-batch whose buffers cannot fit here:
// train_micro_batch_size_per_gpu is accepted up to 2^30 by the config, and a batch that large
// used to end in std::bad_alloc.
Status CheckMicroBatchMemory(const gpt::GptConfig& m, const zinf::EngineConfig& engine,
                             bool activations_on_host) {
  const int64_t batch = engine.micro_batch_size;
  auto activations = m.ActivationBytes(batch);
  if (!activations.ok()) {
    return activations.status().WithContext(
        Printf("train_micro_batch_size_per_gpu = %lld", static_cast<long long>(batch)));
  }
  // The trainer's tokens and targets and the compute backend's copy of them: 4 int32 each.
  const uint64_t tokens = static_cast<uint64_t>(batch) * m.seq_len * 16;  // < 2^56
  uint64_t per_rank = tokens;
  if (activations_on_host && __builtin_add_overflow(per_rank, *activations, &per_rank)) {
    per_rank = UINT64_MAX;
  }
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  const uint64_t local_ranks = local != nullptr ? std::max(1, std::atoi(local)) : 1;
  uint64_t needed = 0;
  if (__builtin_mul_overflow(per_rank, local_ranks, &needed)) needed = UINT64_MAX;
  const uint64_t total = zinf::GetCpuInfo().total_memory_bytes;  // 0: /proc does not say
  if (total == 0 || needed <= total) return zinf::OkStatus();
  return zinf::ResourceExhausted(Printf(
      "train_micro_batch_size_per_gpu = %lld needs %s of host memory per rank (%s of "
      "activations for seq_len %d, d_model %d, n_layer %d, vocab_size %d%s, and %s of tokens) "
      "x %llu rank(s) on this machine, but it has %s in all; lower "
      "train_micro_batch_size_per_gpu (raise gradient_accumulation_steps to keep the batch)",
      static_cast<long long>(batch), HumanBytes(per_rank).c_str(),
      HumanBytes(activations_on_host ? *activations : 0).c_str(), m.seq_len, m.d_model, m.n_layer,
      m.vocab_size, m.activation_checkpointing ? ", activation checkpointing on" : "",
      HumanBytes(tokens).c_str(), static_cast<unsigned long long>(local_ranks),
      HumanBytes(total).c_str()));
}

// --save DIR is made and written to before training: a checkpoint that cannot be written
// would otherwise only fail after the last step, losing the whole run.
Status CheckSaveDirectory(const std::string& dir) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(dir, ec);
  if (std::filesystem::exists(st) && !std::filesystem::is_directory(st)) {
    return zinf::InvalidArgument("--save " + dir + " exists and is not a directory");
  }
  std::filesystem::create_directories(dir, ec);
  if (ec) return zinf::IoError("--save " + dir + ": cannot create the directory: " + ec.message());
  // What saving does, create a file: access() would say yes to root on a read-only mount.
  const std::string probe = dir + "/.train_gpt-write-test-" + std::to_string(getpid());
  const int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    return zinf::IoError("--save " + dir + ": cannot write there: " + std::strerror(errno));
  }
  close(fd);
  unlink(probe.c_str());
  return zinf::OkStatus();
}

// The trainer's state from a checkpoint (what Save wrote): the step to continue at and the
// data seed. Either may be absent; present, each must be a non-negative integer.
Status ReadClientState(const std::string& text, const std::string& dir, int64_t* step,
                       uint64_t* seed) {
  const std::string where = "--resume " + dir + ": the checkpoint's client_state";
  StatusOr<nlohmann::json> parsed = gpt::ParseJson(text, where);
  if (!parsed.ok()) return zinf::DataLoss(parsed.status().message());
  const nlohmann::json& state = *parsed;
  if (!state.is_object()) {
    return zinf::DataLoss(where + " is not a JSON object but " + gpt::DescribeJson(state));
  }
  if (auto it = state.find("step"); it != state.end()) {
    if (!it->is_number_unsigned() || it->get<uint64_t>() > uint64_t{INT64_MAX}) {
      return zinf::DataLoss(where + ".step must be a non-negative integer, got " +
                            gpt::DescribeJson(*it) + " (" + it->type_name() + ")");
    }
    *step = it->get<int64_t>();
  }
  if (auto it = state.find("seed"); it != state.end()) {
    if (!it->is_number_unsigned()) {
      return zinf::DataLoss(where + ".seed must be a non-negative integer, got " +
                            gpt::DescribeJson(*it) + " (" + it->type_name() + ")");
    }
    *seed = it->get<uint64_t>();
  }
  return zinf::OkStatus();
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The default corpus, made here so that training needs no download: sentences from a small
// grammar ("the brave baker sold a small lamp near the river.") and sums ("27 + 58 = 85"),
// three to one. A byte-level model learns the words and their order within a few hundred
// steps (the loss falls from ln 256 = 5.5 towards the grammar's entropy, about 0.3 nats a
// byte), while the digits of the sums stay hard for much longer.
std::string GenerateCorpus(size_t bytes) {
  static const char* const kAdjectives[] = {"old",   "young", "quiet", "clever",
                                            "tired", "brave", "small", "happy"};
  static const char* const kPeople[] = {"sailor", "farmer", "teacher", "child",
                                        "doctor", "baker",  "painter", "king"};
  static const char* const kVerbs[] = {"carried", "found", "painted", "sold",
                                       "opened",  "lost",  "built",   "watched"};
  static const char* const kThings[] = {"box",    "boat",   "letter", "garden",
                                        "window", "bridge", "basket", "lamp"};
  static const char* const kPlaces[] = {"harbor", "market", "village", "river",
                                        "school", "forest", "castle",  "station"};
  uint64_t state = 0;
  auto pick = [&](auto& words) { return words[SplitMix64(state++) % 8]; };
  std::string corpus;
  corpus.reserve(bytes + 128);
  char line[128];
  while (corpus.size() < bytes) {
    if (SplitMix64(state++) % 4 == 0) {
      const int a = SplitMix64(state++) % 100, b = SplitMix64(state++) % 100;
      std::snprintf(line, sizeof(line), "%d + %d = %d\n", a, b, a + b);
    } else {
      std::snprintf(line, sizeof(line), "the %s %s %s a %s %s near the %s.\n", pick(kAdjectives),
                    pick(kPeople), pick(kVerbs), pick(kAdjectives), pick(kThings), pick(kPlaces));
    }
    corpus += line;
  }
  corpus.resize(bytes);
  return corpus;
}

StatusOr<std::string> LoadCorpus(const std::string& path, const gpt::GptConfig& model) {
  std::string corpus;
  if (path.empty()) {
    corpus = GenerateCorpus(2 << 20);
  } else {
    // The corpus is held in memory whole; a regular file only, so --data /dev/zero is refused.
    ZINF_ASSIGN_OR_RETURN(corpus, zinf::ReadInputFile(path, "--data", uint64_t{16} << 30));
  }
  if (corpus.size() < static_cast<size_t>(model.seq_len) + 2) {
    return zinf::InvalidArgument(
        "--data: " + std::to_string(corpus.size()) + " bytes is too short for windows of " +
        "model.seq_len + 1 = " + std::to_string(model.seq_len + 1) + " bytes");
  }
  for (size_t i = 0; i < corpus.size(); ++i) {
    if (static_cast<unsigned char>(corpus[i]) >= model.vocab_size) {
      return zinf::InvalidArgument(
          "--data: byte " + std::to_string(uint8_t(corpus[i])) + " at offset " + std::to_string(i) +
          " is not below model.vocab_size " + std::to_string(model.vocab_size));
    }
  }
  return corpus;
}

// Fills one rank's micro-batch. Row j of rank r's micro-batch k at step s is the global row
// g = ((s * gas + k) * world + r) * batch + j, and its window starts at a hash of (seed, g):
// the rows of a step do not depend on how they are split over ranks and micro-batches (one
// rank with batch 2b trains on exactly the rows of two ranks with b each), and a run resumed
// at step s continues the same sequence.
void FillMicroBatch(const std::string& corpus, uint64_t seed, int64_t step, int micro_step, int gas,
                    int world, int rank, int batch, int seq_len, std::vector<int32_t>* tokens,
                    std::vector<int32_t>* targets) {
  tokens->resize(static_cast<size_t>(batch) * seq_len);
  targets->resize(tokens->size());
  const uint64_t windows = corpus.size() - seq_len - 1;
  for (int j = 0; j < batch; ++j) {
    const uint64_t g = ((uint64_t(step) * gas + micro_step) * world + rank) * batch + j;
    const uint64_t start = SplitMix64(seed ^ SplitMix64(g)) % windows;
    for (int t = 0; t < seq_len; ++t) {
      (*tokens)[size_t(j) * seq_len + t] = static_cast<unsigned char>(corpus[start + t]);
      (*targets)[size_t(j) * seq_len + t] = static_cast<unsigned char>(corpus[start + t + 1]);
    }
  }
}

// OMP_NUM_THREADS when set, else this process's share of the CPUs it may run on.
int DefaultThreads() {
  if (const char* omp = std::getenv("OMP_NUM_THREADS"); omp != nullptr && std::atoi(omp) > 0) {
    return std::atoi(omp);
  }
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  const int local_ranks = local != nullptr ? std::max(1, std::atoi(local)) : 1;
  return std::max(1, zinf::GetCpuInfo().usable_cpus / local_ranks);
}

// The losses the closing summary quotes: the first, and the last kKept, in a ring, so that a run
// of any length holds the same few numbers.
class LossSummary {
 public:
  static constexpr size_t kKept = 10;
  void Add(double loss) {
    if (steps_ == 0) first_ = loss;
    last_[steps_ % kKept] = loss;
    ++steps_;
  }
  size_t steps() const { return steps_; }
  double first() const { return first_; }
  double last() const { return last_[(steps_ - 1) % kKept]; }
  size_t tail() const { return std::min(kKept, steps_); }
  double tail_mean() const {
    double sum = 0;  // oldest first
    for (size_t i = steps_ - tail(); i < steps_; ++i) sum += last_[i % kKept] / tail();
    return sum;
  }

 private:
  size_t steps_ = 0;
  double first_ = 0;
  std::array<double, kKept> last_{};
};

// What one step did, as rank 0 saw it.
struct StepRecord {
  int64_t step = 0;
  double loss = 0;  // mean over the global batch (every rank's micro-batches)
  double seconds = 0;
  double tokens_per_s = 0;
  gpt::Gpt::Timing timing;
  zinf::StepSummary summary;
  uint64_t rss_bytes = 0;  // the process's resident set after the step (with --metrics)
};

nlohmann::json ToJson(const StepRecord& r) {
  return {{"step", r.step},
          {"time", r.summary.unix_time_s},
          {"loss", r.loss},
          {"lr", r.summary.learning_rate},
          {"tokens_per_s", r.tokens_per_s},
          {"step_s", r.seconds},
          {"compute_s", r.timing.compute_s},
          {"param_wait_s", r.timing.param_wait_s},
          {"grad_reduce_s", r.timing.grad_reduce_s},
          {"optimizer_s", r.summary.seconds_optimizer},
          {"optimizer_compute_s", r.summary.seconds_optimizer_compute},
          {"optimizer_overlapped_s", r.summary.seconds_optimizer_overlapped},
          {"grad_norm", r.summary.grad_norm},
          {"loss_scale", r.summary.loss_scale},
          {"skipped", r.summary.skipped},
          {"nvme_read_bytes", r.summary.bytes_nvme_read},
          {"nvme_written_bytes", r.summary.bytes_nvme_written},
          {"host_bytes", r.summary.host_bytes},
          {"host_budget_bytes", r.summary.host_budget_bytes},
          {"device_budget_bytes", r.summary.device_budget_bytes},
          {"nvme_bytes", r.summary.nvme_bytes},
          {"store_entries", r.summary.store_entries},
          {"rss_bytes", r.rss_bytes}};
}

void PrintStepLine(const StepRecord& r, int64_t steps) {
  std::printf(
      "step %*lld/%lld  loss %.4f  %.0f tok/s  %.3f s (compute %.3f, params %.3f, grads %.3f, "
      "optimizer %.3f)  grad norm %.3f%s  nvme read %s written %s\n",
      static_cast<int>(std::to_string(steps).size()), static_cast<long long>(r.step),
      static_cast<long long>(steps), r.loss, r.tokens_per_s, r.seconds, r.timing.compute_s,
      r.timing.param_wait_s, r.timing.grad_reduce_s, r.summary.seconds_optimizer,
      r.summary.grad_norm, r.summary.skipped ? " (skipped: fp16 overflow)" : "",
      HumanBytes(r.summary.bytes_nvme_read).c_str(),
      HumanBytes(r.summary.bytes_nvme_written).c_str());
  std::fflush(stdout);
}

void PrintProgressBar(const StepRecord& r, int64_t steps, double elapsed_s) {
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * r.step / steps);
  const double eta = elapsed_s / r.step * (steps - r.step);
  std::printf("\r[%s%s] %lld/%lld  loss %.4f  %.0f tok/s  eta %.0f s ",
              std::string(filled, '#').c_str(), std::string(kWidth - filled, '-').c_str(),
              static_cast<long long>(r.step), static_cast<long long>(steps), r.loss, r.tokens_per_s,
              eta);
  std::fflush(stdout);
}

// Peak resident memory of this process (VmHWM), in bytes; 0 where /proc does not say.
// A field of /proc/self/status given in kB ("VmHWM:", "VmRSS:"), in bytes; 0 where absent.
uint64_t ProcStatusBytes(const char* field) {
  std::ifstream status("/proc/self/status");
  const size_t length = std::strlen(field);
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(field, 0) == 0) return std::strtoull(line.c_str() + length, nullptr, 10) * 1024;
  }
  return 0;
}
uint64_t PeakRssBytes() { return ProcStatusBytes("VmHWM:"); }

// Saves under the tag "step-N"; the trainer's state is the step and the data seed.
Status Save(zinf::Engine& engine, const std::string& dir, int64_t step, uint64_t seed) {
  const auto t0 = Clock::now();
  const nlohmann::json client = {{"step", step}, {"seed", seed}};
  Status s = engine.SaveCheckpoint(dir, "step-" + std::to_string(step), client.dump());
  if (s.ok() && engine.rank() == 0) {
    std::printf("saved checkpoint %s/step-%lld in %.2f s\n", dir.c_str(),
                static_cast<long long>(step),
                std::chrono::duration<double>(Clock::now() - t0).count());
    std::fflush(stdout);
  }
  return s;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "train_gpt: %s\n", s.ToString().c_str());
  return 1;
}

int Main(int argc, char** argv) {
  Args args;
  CLI::App app{"Trains a GPT-2-style byte-level model with zinf's ZeRO engine."};
  app.add_option("--config", args.config, "DeepSpeed-style JSON config with a \"model\" object")
      ->required();
  app.add_option("--nvme-path", args.nvme_path,
                 "puts every NVMe file here: replaces the config's nvme_paths (and @NVME_PATH@)");
  app.add_option(
      "--set", args.sets,
      "KEY.PATH=VALUE: replaces a config key after reading the file (repeatable; "
      "VALUE is JSON, e.g. --set gradient_clipping=0 --set zinf.overlap_optimizer=false)");
  app.add_option("--data", args.data, "file of bytes to train on (default: a generated corpus)");
  app.add_option("--steps", args.steps,
                 "optimizer step at which training stops; also the scheduler's total_num_steps "
                 "where the config says \"auto\"")
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", args.lr,
                 "learning rate: fills optimizer.params.lr and scheduler.params.warmup_max_lr "
                 "where the config says \"auto\" (a number there must agree)");
  app.add_option("--metrics", args.metrics, "write one JSON line per step here (rank 0)");
  app.add_option("--log-every", args.log_every,
                 "print a line every N steps (default: every step; none on a terminal, where a "
                 "progress bar shows the latest)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", args.threads,
                 "compute and optimizer threads per rank (default: OMP_NUM_THREADS, else the "
                 "usable CPUs divided by LOCAL_WORLD_SIZE)")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", args.seed, "seed of the order in which windows of the data are drawn");
  app.add_option("--save", args.save, "write a checkpoint here at the end (and with --save-every)");
  app.add_option("--save-every", args.save_every, "also checkpoint every K steps")
      ->check(CLI::PositiveNumber)
      ->needs(app.get_option("--save"));
  CLI::Option* resume =
      app.add_option("--resume", args.resume, "continue from this checkpoint directory's latest");
  app.add_option("--init-from", args.init_from,
                 "start from the weights of this safetensors file (F32, BF16 or F16; names as "
                 "train_gpt registers them, see the top of train_gpt.cc), at step 0")
      ->excludes(resume);
  app.add_option("--device", args.device,
                 "where the model computes: cpu (oneDNN) or cuda (cuBLAS, GPU LOCAL_RANK)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--matmul", args.matmul,
                 "the matmuls' input type, accumulating in fp32: auto (bf16 when the config "
                 "enables bf16 and the device multiplies bf16 natively), fp32 or bf16")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}));
  app.add_option("--comm-timeout-s", args.comm_timeout_s,
                 "seconds a collective or the rendezvous may make no progress before the run "
                 "fails naming the rank: how soon a stopped or dead peer is reported, in "
                 "[0.001, 86400] (default 300)");
  CLI11_PARSE(app, argc, argv);
  // Checked here rather than with CLI::Range, which lets NaN through.
  if (!(args.comm_timeout_s >= 0.001 && args.comm_timeout_s <= 86400)) {
    return Fail(zinf::InvalidArgument(
        Printf("--comm-timeout-s must be in [0.001, 86400] seconds, got %g", args.comm_timeout_s)));
  }
  if (!args.save.empty()) {
    if (Status s = CheckSaveDirectory(args.save); !s.ok()) return Fail(s);
  }

  const bool have_lr = !std::isnan(args.lr);
  if (have_lr && !(std::isfinite(args.lr) && args.lr >= 0)) {
    return Fail(
        zinf::InvalidArgument(Printf("--lr must be a finite number >= 0, got %g", args.lr)));
  }
  // The trainer's values for the config's "auto" keys, as Hugging Face's Trainer passes its own.
  zinf::TrainerValues trainer;
  trainer.total_num_steps = args.steps;
  if (have_lr) trainer.lr = args.lr;
  auto config = LoadConfig(args.config, args.nvme_path, args.sets, trainer);
  if (!config.ok()) return Fail(config.status());
  const gpt::GptConfig& mc = config->model;
  auto corpus = LoadCorpus(args.data, mc);
  if (!corpus.ok()) return Fail(corpus.status());
  const int threads = args.threads > 0 ? args.threads : DefaultThreads();
  gpt::SetComputeThreads(threads);

  const auto timeout = std::chrono::milliseconds(std::llround(args.comm_timeout_s * 1000));
  // The model computes on the engine's device: "cuda" is the GPU of this rank's LOCAL_RANK.
  auto created =
      zinf::Engine::Create(config->engine, {.device = args.device == "cuda" ? "cuda" : "host",
                                            .timeout = timeout,
                                            .optimizer_threads = threads,
                                            // The model takes bf16 as it is (fp16 as fp32).
                                            .fp32_view = config->engine.fp16});
  if (!created.ok()) return Fail(created.status());
  zinf::Engine& engine = **created;
  // From here on the batch shape is the engine's: Create resolved the config's batch keys for
  // this world size (a config may give train_batch_size alone).
  const zinf::EngineConfig& resolved = engine.config();
  if (Status s = CheckMicroBatchMemory(mc, resolved, args.device == "cpu"); !s.ok()) {
    return Fail(s.WithContext(args.config));
  }
  gpt::GptOptions model_options;
  model_options.matmul_precision = args.matmul == "fp32"   ? gpt::MatmulPrecision::kFp32
                                   : args.matmul == "bf16" ? gpt::MatmulPrecision::kBf16
                                                           : gpt::MatmulPrecision::kAuto;
  auto model = gpt::Gpt::Create(engine, mc, model_options);
  if (!model.ok()) return Fail(model.status());
  if (Status s = engine.Initialize(); !s.ok()) return Fail(s);

  int64_t first_step = 0;
  if (!args.init_from.empty()) {
    if (Status s = engine.LoadSafetensors(args.init_from); !s.ok()) return Fail(s);
    if (engine.rank() == 0) std::printf("initialized from %s\n", args.init_from.c_str());
  }
  if (!args.resume.empty()) {
    auto client = engine.LoadCheckpoint(args.resume);
    if (!client.ok()) return Fail(client.status());
    if (Status s = ReadClientState(*client, args.resume, &first_step, &args.seed); !s.ok()) {
      return Fail(s);
    }
    if (engine.rank() == 0) {
      std::printf("resumed from %s at step %lld\n", args.resume.c_str(),
                  static_cast<long long>(first_step));
    }
  }

  const int world = engine.world_size(), rank = engine.rank();
  const int gas = resolved.gradient_accumulation_steps, batch = resolved.micro_batch_size;
  // A double: world * gas * batch * seq_len may pass 2^63 (each is only bounded on its own).
  const double tokens_per_step = double(world) * gas * batch * mc.seq_len;
  const bool leader = rank == 0;
  const bool terminal = leader && isatty(STDOUT_FILENO);
  const int log_every = args.log_every >= 0 ? args.log_every : (terminal ? 0 : 1);
  std::ofstream metrics;
  if (leader) {
    std::printf(
        "train_gpt: %.2fM parameters (d_model %d, %d layers, %d heads, seq_len %d, vocab %d, "
        "activation checkpointing %s) on %s, matmuls in %s\n"
        "  %d rank(s) x %d thread(s); micro-batch %d x gradient accumulation %d = %.0f tokens "
        "per step; ZeRO stage %d, parameters on %s, optimizer (%s) on %s\n"
        "  data: %s (%zu bytes)\n",
        mc.parameter_count() / 1e6, mc.d_model, mc.n_layer, mc.n_head, mc.seq_len, mc.vocab_size,
        mc.activation_checkpointing ? "on" : "off", args.device.c_str(),
        (*model)->matmul_type() == zinf::ElementType::kBf16 ? "bf16 (fp32 accumulation)" : "fp32",
        world, threads, batch, gas, tokens_per_step, config->engine.zero_stage,
        std::string(zinf::OffloadDeviceName(config->engine.offload_param_device)).c_str(),
        std::string(zinf::OptimizerTypeName(config->engine.optimizer.type)).c_str(),
        std::string(zinf::OffloadDeviceName(config->engine.offload_optimizer_device)).c_str(),
        args.data.empty() ? "generated corpus" : args.data.c_str(), corpus->size());
    std::fflush(stdout);
    if (!args.metrics.empty()) {
      metrics.open(args.metrics, std::ios::trunc);
      if (!metrics) return Fail(zinf::InvalidArgument("--metrics: cannot write " + args.metrics));
    }
  }

  std::vector<int32_t> tokens, targets;
  LossSummary losses;
  gpt::Gpt::Timing total_timing;
  double total_optimizer_s = 0;
  zinf::StepSummary last;
  const auto t_start = Clock::now();
  for (int64_t step = first_step; step < args.steps; ++step) {
    const auto t0 = Clock::now();
    double loss = 0;
    if (config->engine.layer_major) {  // the batch's micro-batches through each module together
      std::vector<std::vector<int32_t>> all_tokens(gas), all_targets(gas);
      std::vector<const int32_t*> token_ptrs, target_ptrs;
      for (int k = 0; k < gas; ++k) {
        FillMicroBatch(*corpus, args.seed, step, k, gas, world, rank, batch, mc.seq_len,
                       &all_tokens[k], &all_targets[k]);
        token_ptrs.push_back(all_tokens[k].data());
        target_ptrs.push_back(all_targets[k].data());
      }
      auto micro_losses = (*model)->TrainBatch(token_ptrs, target_ptrs, batch);
      if (!micro_losses.ok()) return Fail(micro_losses.status());
      for (double micro_loss : *micro_losses) loss += micro_loss / gas;
    } else {
      for (int k = 0; k < gas; ++k) {
        FillMicroBatch(*corpus, args.seed, step, k, gas, world, rank, batch, mc.seq_len, &tokens,
                       &targets);
        auto micro_loss = (*model)->TrainMicroBatch(tokens.data(), targets.data(), batch);
        if (!micro_loss.ok()) return Fail(micro_loss.status());
        loss += *micro_loss / gas;
      }
    }
    auto mean_loss = engine.MeanOverRanks(loss);
    if (!mean_loss.ok()) return Fail(mean_loss.status());
    loss = *mean_loss;
    auto summary = engine.Step();
    if (!summary.ok()) return Fail(summary.status());
    StepRecord r{.step = step + 1,
                 .loss = loss,
                 .seconds = std::chrono::duration<double>(Clock::now() - t0).count(),
                 .timing = (*model)->TakeTiming(),
                 .summary = *summary};
    r.tokens_per_s = tokens_per_step / r.seconds;
    losses.Add(loss);
    total_timing.compute_s += r.timing.compute_s;
    total_timing.param_wait_s += r.timing.param_wait_s;
    total_timing.grad_reduce_s += r.timing.grad_reduce_s;
    total_optimizer_s += summary->seconds_optimizer;
    last = *summary;
    if (args.save_every > 0 && r.step % args.save_every == 0 && r.step < args.steps) {
      if (Status s = Save(engine, args.save, r.step, args.seed); !s.ok()) return Fail(s);
    }
    if (!leader) continue;
    if (metrics.is_open()) {
      r.rss_bytes = ProcStatusBytes("VmRSS:");
      metrics << ToJson(r).dump() << std::endl;
    }
    if (terminal)
      PrintProgressBar(r, args.steps,
                       std::chrono::duration<double>(Clock::now() - t_start).count());
    if (log_every > 0 && (r.step % log_every == 0 || r.step == args.steps)) {
      if (terminal) std::printf("\n");
      PrintStepLine(r, args.steps);
    }
  }

  if (!args.save.empty() && first_step < args.steps) {
    if (Status s = Save(engine, args.save, args.steps, args.seed); !s.ok()) return Fail(s);
  }
  if (leader && losses.steps() == 0) {
    std::printf("nothing to do: the run is at step %lld already (--steps %lld)\n",
                static_cast<long long>(first_step), static_cast<long long>(args.steps));
  }
  if (leader && losses.steps() > 0) {
    if (terminal) std::printf("\n");
    const double seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
    const double tokens = tokens_per_step * losses.steps();
    auto share = [&](double s) { return 100.0 * s / seconds; };
    std::printf(
        "done: %zu steps, %.0f tokens in %.1f s (%.0f tokens/s)\n"
        "  loss: first %.4f, last %.4f, mean of the last %zu %.4f\n"
        "  time: compute %.0f%%, parameter gathers %.0f%%, gradient reduction %.0f%%, "
        "optimizer %.0f%%, other %.0f%%\n"
        "  memory (rank 0): engine host arrays %s, NVMe swap %s, peak RSS %s\n",
        losses.steps(), tokens, seconds, tokens / seconds, losses.first(), losses.last(),
        losses.tail(), losses.tail_mean(), share(total_timing.compute_s),
        share(total_timing.param_wait_s), share(total_timing.grad_reduce_s),
        share(total_optimizer_s),
        share(seconds - total_timing.compute_s - total_timing.param_wait_s -
              total_timing.grad_reduce_s - total_optimizer_s),
        HumanBytes(last.host_bytes).c_str(), HumanBytes(last.nvme_bytes).c_str(),
        HumanBytes(PeakRssBytes()).c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Every error above is a Status; this is the last resort, so that a bug or a dependency's
  // exception ends the run with a message instead of an abort.
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    return Fail(zinf::Internal(std::string("unexpected exception: ") + e.what()));
  } catch (...) {
    return Fail(zinf::Internal("unexpected exception of an unknown type"));
  }
}
