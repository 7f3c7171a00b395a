// See tools/plan_model.h, Note [Plan memory] and Note [Plan time].
#include "tools/plan_model.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/config_reader.h"
#include "core/units.h"
#include "offload/pipelined_optimizer.h"
#include "zero/gradient_buckets.h"

namespace zinf::plan {
namespace {

constexpr uint64_t kPage = 4096;
// The engine's tiered store reads ahead and writes back its shards in batches, as many
// requests in flight as the aio rings hold (Note [Batched write-backs] in
// offload/tiered_store.cc).
double RequestsInFlight(const EngineConfig& c) {
  return static_cast<double>(c.aio.queue_depth) * c.aio.thread_count;
}
uint64_t PageUp(uint64_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

uint64_t ElementBytes(const EngineConfig& c) { return c.bf16 || c.fp16 ? 2 : 4; }

// A parameter as Partition lays it out (src/zero/partition.cc).
struct Laid {
  uint64_t numel = 0, shard = 0;
  bool persistent = false;
};

struct Layout {
  std::vector<std::vector<Laid>> modules;
  uint64_t shard_elements = 0;
  uint64_t total = 0;
};

Layout LayOut(const ModelSpec& model, const EngineConfig& c, int world) {
  Layout l;
  for (const ModuleShape& m : model.modules) {
    std::vector<Laid> params;
    for (uint64_t n : m.numels) {
      Laid p{n, (n + world - 1) / world,
             c.zero_stage < 3 || n < c.stage3_param_persistence_threshold};
      l.shard_elements += p.shard;
      l.total += n;
      params.push_back(p);
    }
    l.modules.push_back(std::move(params));
  }
  return l;
}

// Engine::Impl::OptimizerChunkElements, then PipelinedOptimizer::Create's fit to the budget.
uint64_t ChunkElements(const EngineConfig& c, uint64_t shard_elements) {
  constexpr uint64_t kAlign = PipelinedOptimizerOptions::kChunkAlignElements;
  const uint64_t chunk = std::clamp<uint64_t>((shard_elements + kAlign - 1) / kAlign * kAlign,
                                              PipelinedOptimizerOptions::kMinChunkElements,
                                              PipelinedOptimizerOptions().chunk_elements);
  const uint64_t k = PipelinedOptimizerOptions().num_buffers;
  const uint64_t budget = std::max<uint64_t>(
      c.nvme_staging_budget_bytes, k * chunk * PipelinedOptimizerOptions::kStagingBytesPerElement);
  uint64_t fit = budget / (k * PipelinedOptimizerOptions::kStagingBytesPerElement);
  fit -= fit % kAlign;
  return std::min(chunk, fit);
}

// The bytes the device tier holds for one module while it is fetched, beyond the shard copies
// (which the cache simulation counts): the gathered copy with several ranks, the fp32 widening
// of a 16-bit tier, and backward's fp32 gradients.
uint64_t LiveBeyondShards(const std::vector<Laid>& params, uint64_t element, int world) {
  uint64_t bytes = 0;
  for (const Laid& p : params) {
    if (p.persistent) continue;
    const uint64_t full = p.shard * world;
    if (world > 1) bytes += full * element;
    if (element != 4) bytes += full * 4;
    bytes += full * 4;  // gradient buffer
  }
  return bytes;
}

uint64_t ShardBytes(const std::vector<Laid>& params, uint64_t element) {
  uint64_t bytes = 0;
  for (const Laid& p : params) {
    if (!p.persistent) bytes += p.shard * element;
  }
  return bytes;
}

uint64_t CountNonPersistent(const std::vector<Laid>& params) {
  return std::count_if(params.begin(), params.end(), [](const Laid& p) { return !p.persistent; });
}

// The step's fetches against the device tier's cache of shard copies (ParamTier keeps them
// until the budget needs their room; eviction follows the recorded order, which makes the
// store drop the copy needed last: Belady's choice).
struct CacheSim {
  std::vector<int> order;      // one step's fetches
  std::vector<uint64_t> miss;  // bytes each fetch brings to the device tier
  uint64_t cached_at_end = 0;  // shard bytes cached after the last fetch
  // The most the device tier holds at a fetch, the parameter tier itself not counted: cached
  // shard copies, persistent parameters, the fetched module's gathered, widened and gradient
  // buffers, and with several ranks the next module's gathers started ahead.
  uint64_t peak = 0;
};

CacheSim SimulateCache(const ModelSpec& model, const EngineConfig& c, int world, const Layout& l,
                       uint64_t device_budget) {
  CacheSim sim;
  const uint64_t e = ElementBytes(c);
  for (int k = 0; k < c.gradient_accumulation_steps; ++k) {
    sim.order.insert(sim.order.end(), model.fetch_order.begin(), model.fetch_order.end());
  }
  const size_t n = sim.order.size();
  sim.miss.assign(n, 0);
  // The room: the budget less the persistent parameters' copies and the largest module's
  // gathered, widened and gradient buffers.
  uint64_t persistent_live = 0, largest_live = 0;
  std::vector<uint64_t> shard_bytes(l.modules.size(), 0);
  for (size_t i = 0; i < l.modules.size(); ++i) {
    for (const Laid& p : l.modules[i]) {
      const uint64_t full = p.shard * world;
      if (p.persistent) {
        persistent_live += full * e + (world > 1 ? p.shard * e : 0) + (e != 4 ? full * 4 : 0);
      } else {
        shard_bytes[i] += PageUp(p.shard * e);
      }
    }
    largest_live = std::max(largest_live, LiveBeyondShards(l.modules[i], e, world));
  }
  const int64_t room =
      std::max<int64_t>(0, static_cast<int64_t>(device_budget) -
                               static_cast<int64_t>(persistent_live + largest_live));
  auto live_at = [&](size_t i) {
    uint64_t live = persistent_live + LiveBeyondShards(l.modules[sim.order[i]], e, world);
    if (world > 1 && i + 1 < n) live += ShardBytes(l.modules[sim.order[i + 1]], e) * world;
    return live;
  };
  if (c.offload_param_device == OffloadDevice::kNone) {
    for (size_t i = 0; i < n; ++i) sim.peak = std::max(sim.peak, live_at(i));
    return sim;
  }
  std::vector<size_t> next(n, n);
  std::map<int, size_t> seen;
  for (size_t i = n; i-- > 0;) {
    auto it = seen.find(sim.order[i]);
    next[i] = it == seen.end() ? n : it->second;
    seen[sim.order[i]] = i;
  }
  std::map<int, size_t> cached;  // module -> its next use
  uint64_t used = 0;
  for (size_t i = 0; i < n; ++i) {
    const int mod = sim.order[i];
    if (shard_bytes[mod] == 0) continue;
    if (cached.count(mod) == 0) {
      sim.miss[i] = shard_bytes[mod];
      used += shard_bytes[mod];
    }
    cached[mod] = next[i];
    sim.peak = std::max(sim.peak, used + live_at(i));
    while (static_cast<int64_t>(used) > room && cached.size() > 1) {
      auto victim = cached.end();
      for (auto it = cached.begin(); it != cached.end(); ++it) {
        if (it->first == mod) continue;
        if (victim == cached.end() || it->second > victim->second) victim = it;
      }
      used -= shard_bytes[victim->first];
      cached.erase(victim);
    }
  }
  sim.cached_at_end = used;
  // EndBatch reads the next batch's first modules ahead (ParamTier::ReadAhead): at least one
  // module, then up to stage3_prefetch_bucket_size elements, those not cached already.
  uint64_t ahead = 0;
  for (size_t k = 0; k < model.fetch_order.size(); ++k) {
    const int mod = model.fetch_order[k];
    if (k > 0 && ahead >= c.stage3_prefetch_bucket_size) break;
    for (const Laid& p : l.modules[mod]) {
      if (!p.persistent) ahead += p.numel;
    }
    if (cached.count(mod) == 0 && shard_bytes[mod] > 0 &&
        static_cast<int64_t>(used + shard_bytes[mod]) <=
            std::max<int64_t>(room, shard_bytes[mod])) {
      cached[mod] = n;
      used += shard_bytes[mod];
    }
  }
  sim.cached_at_end = used;
  return sim;
}

double SafeDiv(double a, double b) { return b > 0 ? a / b : 0.0; }

// y at `log_x`, linear in log(x) between rows sorted by it, flat outside them: rates and
// waits measured at a few sizes. log_x_of and y_of read a row.
template <typename Row, typename LogX, typename Y>
double InterpolateInLog(const std::vector<Row>& rows, double log_x, LogX log_x_of, Y y_of) {
  if (log_x <= log_x_of(rows.front())) return y_of(rows.front());
  for (size_t i = 1; i < rows.size(); ++i) {
    const double x1 = log_x_of(rows[i]);
    if (log_x <= x1) {
      const double x0 = log_x_of(rows[i - 1]), y0 = y_of(rows[i - 1]), y1 = y_of(rows[i]);
      return x1 > x0 ? y0 + (y1 - y0) * (log_x - x0) / (x1 - x0) : y1;
    }
  }
  return y_of(rows.back());
}

}  // namespace

uint64_t ModelSpec::parameter_count() const {
  uint64_t n = 0;
  for (const ModuleShape& m : modules)
    for (uint64_t x : m.numels) n += x;
  return n;
}

// ---- Models ----

StatusOr<ModelSpec> GptModel(int vocab_size, int seq_len, int d_model, int n_layer, int n_head,
                             int micro_batch, bool activation_checkpointing) {
  for (auto [name, v] : {std::pair{"vocab_size", vocab_size},
                         {"seq_len", seq_len},
                         {"d_model", d_model},
                         {"n_layer", n_layer},
                         {"n_head", n_head},
                         {"train_micro_batch_size_per_gpu", micro_batch}}) {
    if (v < 1) return InvalidArgument(fmt::format("model.{} must be >= 1, got {}", name, v));
  }
  if (d_model % n_head != 0) {
    return InvalidArgument(
        fmt::format("model.n_head ({}) must divide model.d_model ({})", n_head, d_model));
  }
  const uint64_t V = vocab_size, T = seq_len, d = d_model, L = n_layer, B = micro_batch;
  ModelSpec m;
  m.description =
      fmt::format("GPT d_model {}, {} layers, {} heads, seq_len {}, vocab {}, micro-batch {}", d, L,
                  n_head, T, V, B);
  m.hidden_size = d;
  m.modules.push_back({"embed", {V * d, T * d}});
  for (uint64_t l = 0; l < L; ++l) {
    m.modules.push_back({fmt::format("h.{}", l),
                         {d, d, 3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d, 4 * d, 4 * d * d, d}});
  }
  m.modules.push_back({"ln_f", {d, d}});
  // gpt_model.cc's Compute: embed, blocks, ln_f, embed again (the tied head), then the blocks
  // in reverse (the embedding's backward needs no parameters).
  const int ln_f = static_cast<int>(L) + 1;
  m.fetch_order.push_back(0);
  for (int l = 1; l <= static_cast<int>(L); ++l) m.fetch_order.push_back(l);
  m.fetch_order.push_back(ln_f);
  m.fetch_order.push_back(0);
  for (int l = static_cast<int>(L); l >= 1; --l) m.fetch_order.push_back(l);
  // Matmul FLOPs per forward: 2 x (12 d^2) per token and block, attention 2 x 2 x T x d per
  // token and block (scores and their product with V), the head 2 x V x d per token. Backward
  // twice the forward; checkpointing recomputes the blocks' forward up to the GELU (the MLP's
  // output projection, 2 x 4 d^2 per token, is not needed again).
  const double tokens = static_cast<double>(B * T);
  const double block_fwd = tokens * (24.0 * d * d + 4.0 * T * d);
  const double recomputed = activation_checkpointing ? block_fwd - tokens * 8.0 * d * d : 0.0;
  const double head_fwd = tokens * 2.0 * V * d;
  const double attention_fwd = tokens * 4.0 * T * d;
  m.fetch_flops.assign(m.fetch_order.size(), 0.0);
  for (uint64_t l = 0; l < L; ++l) {
    m.fetch_flops[1 + l] = block_fwd;
    m.fetch_flops[L + 3 + l] = block_fwd * 2 + recomputed;
  }
  m.fetch_flops[L + 2] = head_fwd * 3;  // the head's forward and both backward products
  for (double f : m.fetch_flops) m.matmul_flops_per_micro_batch += f;
  // GptConfig::ActivationBytes, its arrays each rounded to 64 floats.
  auto r = [](uint64_t n) { return (n + 63) / 64 * 64; };
  const uint64_t n = B * T, nd = n * d, probs = B * n_head * T * T;
  const uint64_t sets = activation_checkpointing ? 1 : L;
  const uint64_t floats =
      (L + 1) * r(nd) + sets * (4 * r(nd) + 4 * r(n) + r(3 * nd) + r(probs) + 2 * r(4 * nd)) +
      7 * r(nd) + 2 * r(n) + r(n * V) + r(3 * nd) + r(probs) + r(4 * nd) + r(4 * nd);
  m.activation_bytes = floats * 4;
  // The non-matmul passes: each block's activations (layer norms, attention's softmax, GELU,
  // residuals: about 15 n d floats and the probabilities) are written and read once in
  // forward, again in the recomputation and twice in backward; the logits four times. (The
  // GELU's arithmetic, and std::exp's, are terms of their own.)
  const double block_floats = 15.0 * nd + static_cast<double>(probs);
  m.elementwise_bytes_per_micro_batch =
      4.0 * (2 * L * block_floats * (activation_checkpointing ? 4 : 3) / 2 + 4.0 * n * V);
  const int passes = activation_checkpointing ? 4 : 3;  // forward, recomputation, 2 x backward
  m.attention_flops_per_micro_batch = L * attention_fwd * passes;
  // The MLP's GELU over n x 4d: in forward and the recomputation, and once in backward.
  m.gelu_forward_elements_per_micro_batch = L * (activation_checkpointing ? 2.0 : 1.0) * 4 * nd;
  m.gelu_backward_elements_per_micro_batch = L * 4.0 * nd;
  // The causal softmax: half of each T x T row per head, in forward and the recomputation; the
  // loss: two passes over the logits.
  m.exps_per_micro_batch =
      L * (activation_checkpointing ? 2.0 : 1.0) * B * n_head * T * T / 2 + 2.0 * n * V;
  // gpt_model.cc's oneDNN calls: a block's forward is 7 + 2 B (two layer norms, four linear
  // matmuls, GELU, and attention's two matmuls per sequence), the recomputation one matmul
  // fewer, its backward 11 + 4 B; ln_f and the head 5. (Its own loops cost no call.)
  m.kernel_calls_per_micro_batch =
      L * ((activation_checkpointing ? 2.0 : 1.0) * (6 + 2 * B) + 1 + 11 + 4 * B) + 5;
  return m;
}

StatusOr<ModelSpec> MlpModel(int layers, int width, int batch) {
  if (layers < 1 || width < 1 || batch < 1) {
    return InvalidArgument(fmt::format(
        "the MLP needs layers, width and batch >= 1, got {}, {} and {}", layers, width, batch));
  }
  const uint64_t W = width;
  ModelSpec m;
  m.description = fmt::format("MLP {} layers of {}x{}, batch {}", layers, W, W, batch);
  m.hidden_size = W;
  m.plain_loop_compute = true;
  for (int l = 0; l < layers; ++l) m.modules.push_back({fmt::format("layer{}", l), {W * W, W}});
  // Forward 2 B W^2 per layer; backward 4 B W^2 (the weight's gradient and the input's).
  const double forward = 2.0 * batch * static_cast<double>(W * W);
  for (int l = 0; l < layers; ++l) m.fetch_order.push_back(l), m.fetch_flops.push_back(forward);
  for (int l = layers - 1; l >= 0; --l) {
    m.fetch_order.push_back(l), m.fetch_flops.push_back(2 * forward);
  }
  m.matmul_flops_per_micro_batch = 3 * forward * layers;
  m.activation_bytes = (2 * static_cast<uint64_t>(layers) + 3) * batch * W * 4;
  return m;
}

StatusOr<ModelSpec> UniformModel(uint64_t params, int layers, uint64_t tokens_per_micro_batch) {
  if (params == 0) return InvalidArgument("--params must be > 0");
  if (layers < 1) return InvalidArgument(fmt::format("--layers must be >= 1, got {}", layers));
  if (tokens_per_micro_batch == 0) return InvalidArgument("--tokens must be > 0");
  if (params < static_cast<uint64_t>(layers)) {
    return InvalidArgument(
        fmt::format("--params ({}) must be at least --layers ({})", params, layers));
  }
  ModelSpec m;
  m.description = fmt::format("{} parameters in {} layers, {} tokens per micro-batch", params,
                              layers, tokens_per_micro_batch);
  const uint64_t per = params / layers;
  m.hidden_size = static_cast<uint64_t>(std::sqrt(static_cast<double>(per) / 12.0));
  for (int l = 0; l < layers; ++l) {
    m.modules.push_back({fmt::format("layer{}", l), {per + (l == 0 ? params % layers : 0)}});
  }
  const double forward = 2.0 * static_cast<double>(per) * tokens_per_micro_batch;
  for (int l = 0; l < layers; ++l) m.fetch_order.push_back(l), m.fetch_flops.push_back(forward);
  for (int l = layers - 1; l >= 0; --l) {
    m.fetch_order.push_back(l), m.fetch_flops.push_back(3 * forward);
  }
  m.matmul_flops_per_micro_batch = 8.0 * static_cast<double>(params) * tokens_per_micro_batch;
  // About 16 floats of d per token and layer kept with recomputation, as the GPT's.
  m.activation_bytes = tokens_per_micro_batch * m.hidden_size * 4 * (16 + layers);
  return m;
}

StatusOr<ConfigModel> ModelFromConfigText(std::string_view text, const std::string& source,
                                          int mlp_layers, int mlp_width, int world_size) {
  ZINF_ASSIGN_OR_RETURN(nlohmann::json json, ParseJson(text, source));
  if (!json.is_object()) return InvalidArgument(fmt::format("{}: not a JSON object", source));
  nlohmann::json model = nlohmann::json::object();
  const bool gpt = json.contains("model");
  if (gpt) {
    model = json["model"];
    json.erase("model");
    if (!model.is_object())
      return InvalidArgument(fmt::format("{}: model must be an object", source));
  }
  // "@NVME_PATH@" placeholders of the shipped configs: any path will do for sizing.
  std::string engine_text = json.dump();
  for (size_t at; (at = engine_text.find("@NVME_PATH@")) != std::string::npos;) {
    engine_text.replace(at, 11, "/tmp");
  }
  StatusOr<EngineConfig> config = EngineConfig::FromJson(engine_text);
  if (!config.ok()) return config.status().WithContext(source);
  // The micro-batch the model is sized for is the one the engine would train at: a config may
  // give train_batch_size alone.
  if (Status s = config->ResolveBatchSize(world_size); !s.ok()) return s.WithContext(source);
  ConfigModel out{ModelSpec{}, *config};
  if (gpt) {
    int v[5] = {256, 64, 128, 4, 4};
    bool checkpointing = true;
    const char* keys[5] = {"vocab_size", "seq_len", "d_model", "n_layer", "n_head"};
    for (auto it = model.begin(); it != model.end(); ++it) {
      const std::string& key = it.key();
      if (key == "activation_checkpointing") {
        if (!it->is_boolean()) {
          return InvalidArgument(
              fmt::format("{}: model.{} must be true or false, got {}", source, key, it->dump()));
        }
        checkpointing = it->get<bool>();
        continue;
      }
      const auto k =
          std::find_if(std::begin(keys), std::end(keys), [&](const char* n) { return key == n; });
      if (k == std::end(keys)) {
        return InvalidArgument(fmt::format(
            "{}: model.{} is not a GPT model key (vocab_size, seq_len, d_model, n_layer, n_head, "
            "activation_checkpointing)",
            source, key));
      }
      if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > (1 << 30)) {
        return InvalidArgument(fmt::format("{}: model.{} must be an integer in [1, 2^30], got {}",
                                           source, key, it->dump()));
      }
      v[k - std::begin(keys)] = it->get<int>();
    }
    StatusOr<ModelSpec> m =
        GptModel(v[0], v[1], v[2], v[3], v[4], config->micro_batch_size, checkpointing);
    if (!m.ok()) return m.status().WithContext(source);
    out.model = std::move(*m);
  } else {
    StatusOr<ModelSpec> m = MlpModel(mlp_layers, mlp_width, config->micro_batch_size);
    if (!m.ok()) return m.status().WithContext(source);
    out.model = std::move(*m);
  }
  out.model.description += "; " + config->BatchShape(world_size);
  return out;
}

// ---- Profile ----

StatusOr<MachineProfile> MachineProfile::FromJson(std::string_view text,
                                                  const std::string& source) {
  ZINF_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(text, fmt::format("profile {}", source)));
  if (!j.is_object()) return InvalidArgument(fmt::format("profile {}: not a JSON object", source));
  if (!j.contains("zinf_profile") || j["zinf_profile"] != 1) {
    return InvalidArgument(fmt::format(
        "profile {}: no \"zinf_profile\": 1 (write one with `zinf bench profile --out FILE`)",
        source));
  }
  MachineProfile p;
  // A figure at `path` (dot-separated): a finite number >= 0; null or absent is 0 when
  // `optional`.
  auto number = [&](const nlohmann::json& at, const std::string& path, bool optional,
                    double* out) -> Status {
    const nlohmann::json* v = &at;
    size_t start = 0;
    while (start <= path.size()) {
      size_t dot = path.find('.', start);
      if (dot == std::string::npos) dot = path.size();
      const std::string key = path.substr(start, dot - start);
      if (!v->is_object() || !v->contains(key) || (*v)[key].is_null()) {
        if (optional) {
          *out = 0;
          return OkStatus();
        }
        return InvalidArgument(fmt::format("profile {}: {} is missing", source, path));
      }
      v = &(*v)[key];
      start = dot + 1;
    }
    if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() < 0) {
      return InvalidArgument(
          fmt::format("profile {}: {} must be a number >= 0, got {}", source, path, v->dump()));
    }
    *out = v->get<double>();
    return OkStatus();
  };
  double x = 0;
  ZINF_RETURN_IF_ERROR(number(j, "machine.cores", false, &x));
  p.cores = std::max(1, static_cast<int>(x));
  ZINF_RETURN_IF_ERROR(number(j, "machine.memory_bytes", false, &x));
  p.memory_bytes = static_cast<uint64_t>(x);
  ZINF_RETURN_IF_ERROR(number(j, "machine.gpu_memory_bytes", true, &x));
  p.gpu_memory_bytes = static_cast<uint64_t>(x);
  ZINF_RETURN_IF_ERROR(number(j, "nvme.free_bytes", true, &x));
  p.nvme_free_bytes = static_cast<uint64_t>(x);
  ZINF_RETURN_IF_ERROR(number(j, "nvme.read_MBps", true, &p.nvme_read_Bps));
  ZINF_RETURN_IF_ERROR(number(j, "nvme.write_MBps", true, &p.nvme_write_Bps));
  ZINF_RETURN_IF_ERROR(number(j, "nvme.mixed_MBps", true, &p.nvme_mixed_Bps));
  p.nvme_read_Bps *= 1e6;
  p.nvme_write_Bps *= 1e6;
  p.nvme_mixed_Bps *= 1e6;
  ZINF_RETURN_IF_ERROR(number(j, "nvme.read_latency_us", true, &p.nvme_read_latency_s));
  ZINF_RETURN_IF_ERROR(number(j, "nvme.write_latency_us", true, &p.nvme_write_latency_s));
  p.nvme_read_latency_s *= 1e-6;
  p.nvme_write_latency_s *= 1e-6;
  if (j.contains("nvme") && j["nvme"].is_object() && j["nvme"].contains("paths")) {
    for (const auto& path : j["nvme"]["paths"]) {
      if (!path.is_string()) {
        return InvalidArgument(fmt::format("profile {}: nvme.paths must be strings", source));
      }
      p.nvme_paths.push_back(path.get<std::string>());
    }
  }
  ZINF_RETURN_IF_ERROR(number(j, "memory_GBps", false, &p.memory_Bps));
  p.memory_Bps *= 1e9;
  ZINF_RETURN_IF_ERROR(number(j, "link.h2d_GBps", true, &p.h2d_Bps));
  ZINF_RETURN_IF_ERROR(number(j, "link.d2h_GBps", true, &p.d2h_Bps));
  p.h2d_Bps *= 1e9;
  p.d2h_Bps *= 1e9;
  if (!j.contains("cpu_optimizer") || !j["cpu_optimizer"].is_array() ||
      j["cpu_optimizer"].empty()) {
    return InvalidArgument(
        fmt::format("profile {}: cpu_optimizer must be a non-empty array", source));
  }
  for (const auto& row : j["cpu_optimizer"]) {
    OptimizerRow r;
    ZINF_RETURN_IF_ERROR(number(row, "threads", false, &x));
    r.threads = static_cast<int>(x);
    ZINF_RETURN_IF_ERROR(number(row, "params_per_s", false, &r.params_per_s));
    p.optimizer.push_back(r);
  }
  if (!j.contains("matmul") || !j["matmul"].is_array() || j["matmul"].empty()) {
    return InvalidArgument(fmt::format("profile {}: matmul must be a non-empty array", source));
  }
  for (const auto& row : j["matmul"]) {
    MatmulRow r;
    ZINF_RETURN_IF_ERROR(number(row, "threads", false, &x));
    r.threads = static_cast<int>(x);
    ZINF_RETURN_IF_ERROR(number(row, "d", true, &r.d));
    ZINF_RETURN_IF_ERROR(number(row, "fp32_GFLOPs", true, &r.fp32_flops));
    ZINF_RETURN_IF_ERROR(number(row, "bf16_GFLOPs", true, &r.bf16_flops));
    r.fp32_flops *= 1e9;
    r.bf16_flops *= 1e9;
    p.matmul.push_back(r);
  }
  if (j.contains("kernel_call")) {
    if (!j["kernel_call"].is_array()) {
      return InvalidArgument(fmt::format("profile {}: kernel_call must be an array", source));
    }
    for (const auto& row : j["kernel_call"]) {
      CallRow r;
      ZINF_RETURN_IF_ERROR(number(row, "threads", false, &x));
      r.threads = static_cast<int>(x);
      ZINF_RETURN_IF_ERROR(number(row, "us", false, &r.seconds));
      ZINF_RETURN_IF_ERROR(number(row, "attention_GFLOPs", true, &r.attention_flops));
      ZINF_RETURN_IF_ERROR(number(row, "gelu_forward_Gelem_per_s", true, &r.gelu_forward_per_s));
      ZINF_RETURN_IF_ERROR(number(row, "gelu_backward_Gelem_per_s", true, &r.gelu_backward_per_s));
      r.attention_flops *= 1e9;
      r.gelu_forward_per_s *= 1e9;
      r.gelu_backward_per_s *= 1e9;
      r.seconds *= 1e-6;
      p.kernel_call.push_back(r);
    }
    std::sort(p.kernel_call.begin(), p.kernel_call.end(),
              [](const auto& a, const auto& b) { return a.threads < b.threads; });
  }
  ZINF_RETURN_IF_ERROR(number(j, "exp_per_s", true, &p.exp_per_s));
  ZINF_RETURN_IF_ERROR(number(j, "loop_fp32_GFLOPs", false, &p.loop_fp32_flops));
  p.loop_fp32_flops *= 1e9;
  ZINF_RETURN_IF_ERROR(number(j, "collective.latency_us", true, &p.collective_latency_s));
  p.collective_latency_s *= 1e-6;
  ZINF_RETURN_IF_ERROR(number(j, "collective.allgather_GBps", true, &p.allgather_Bps));
  ZINF_RETURN_IF_ERROR(number(j, "collective.reduce_scatter_GBps", true, &p.reduce_scatter_Bps));
  p.allgather_Bps *= 1e9;
  p.reduce_scatter_Bps *= 1e9;
  ZINF_RETURN_IF_ERROR(number(j, "collective.cpu_us_per_collective", true, &p.collective_cpu_s));
  ZINF_RETURN_IF_ERROR(number(j, "collective.cpu_ns_per_byte", true, &p.collective_cpu_s_per_byte));
  p.collective_cpu_s *= 1e-6;
  p.collective_cpu_s_per_byte *= 1e-9;
  if (j.contains("collective") && j["collective"].is_object() &&
      j["collective"].contains("loaded")) {
    const nlohmann::json& rows = j["collective"]["loaded"];
    if (!rows.is_array()) {
      return InvalidArgument(fmt::format("profile {}: collective.loaded must be an array", source));
    }
    for (const auto& row : rows) {
      LoadedWaitRow r;
      ZINF_RETURN_IF_ERROR(number(row, "compute_us", false, &r.compute_s));
      ZINF_RETURN_IF_ERROR(number(row, "wait_us", false, &r.wait_s));
      ZINF_RETURN_IF_ERROR(number(row, "step_us", false, &r.step_s));
      r.compute_s *= 1e-6;
      r.wait_s *= 1e-6;
      r.step_s *= 1e-6;
      p.loaded_wait.push_back(r);
    }
    std::sort(p.loaded_wait.begin(), p.loaded_wait.end(),
              [](const auto& a, const auto& b) { return a.compute_s < b.compute_s; });
  }
  double shards = 0;
  ZINF_RETURN_IF_ERROR(number(j, "collective.loaded_writes.shards", true, &shards));
  if (shards > 0) {
    double memory_step = 0, nvme_step = 0;
    ZINF_RETURN_IF_ERROR(number(j, "collective.loaded_writes.memory_step_us", false, &memory_step));
    ZINF_RETURN_IF_ERROR(number(j, "collective.loaded_writes.nvme_step_us", false, &nvme_step));
    p.loaded_shard_write_s = std::max(0.0, nvme_step - memory_step) / shards * 1e-6;
  }
  std::sort(p.optimizer.begin(), p.optimizer.end(),
            [](const auto& a, const auto& b) { return a.threads < b.threads; });
  std::sort(p.matmul.begin(), p.matmul.end(), [](const auto& a, const auto& b) {
    return a.threads != b.threads ? a.threads < b.threads : a.d < b.d;
  });
  return p;
}

double MachineProfile::LoadedWait(double compute_s, double LoadedWaitRow::*figure) const {
  if (loaded_wait.empty()) return 0;
  if (compute_s <= 0) return loaded_wait.front().*figure;
  return InterpolateInLog(
      loaded_wait, std::log(compute_s),
      [](const LoadedWaitRow& r) { return std::log(r.compute_s); },
      [figure](const LoadedWaitRow& r) { return r.*figure; });
}

double MachineProfile::OptimizerRate(int threads) const {
  double rate = optimizer.front().params_per_s;
  for (const auto& r : optimizer) {
    if (r.threads <= threads) rate = r.params_per_s;
  }
  return rate;
}

const MachineProfile::CallRow& MachineProfile::KernelCall(int threads) const {
  static const CallRow kNone;
  const CallRow* use = kernel_call.empty() ? &kNone : &kernel_call.front();
  for (const auto& r : kernel_call) {
    if (r.threads <= threads) use = &r;
  }
  return *use;
}

double MachineProfile::MatmulRate(int threads, bool bf16, double d) const {
  int use = matmul.front().threads;
  for (const auto& r : matmul) {
    if (r.threads <= threads) use = r.threads;
  }
  std::vector<std::pair<double, double>> by_d;  // (log d, rate) at `use` threads
  for (const auto& r : matmul) {
    if (r.threads != use) continue;
    const double rate = bf16 && r.bf16_flops > 0 ? r.bf16_flops : r.fp32_flops;
    by_d.emplace_back(r.d > 0 ? std::log(r.d) : 0.0, rate);
  }
  if (by_d.size() == 1 || d <= 0) return by_d.back().second;
  return InterpolateInLog(
      by_d, std::log(d), [](const auto& r) { return r.first; },
      [](const auto& r) { return r.second; });
}

// ---- Memory ----

MemoryEstimate EstimateMemory(const ModelSpec& model, const EngineConfig& c, int world) {
  MemoryEstimate m;
  const Layout l = LayOut(model, c, world);
  const uint64_t e = ElementBytes(c);
  const bool params_nvme = c.offload_param_device == OffloadDevice::kNvme;
  const bool optim_nvme = c.offload_optimizer_device == OffloadDevice::kNvme;
  const bool host_master = !(params_nvme && optim_nvme);
  const int states = c.optimizer.state_count();
  const uint64_t S = l.shard_elements;
  // Engine::Initialize: gradient accumulators, master, in-memory state, page-rounded by the
  // host tier's 4 KiB blocks.
  const uint64_t array = PageUp(std::max<uint64_t>(S, 1) * 4);
  const bool grads_nvme = optim_nvme && c.gradients_on_nvme;
  m.host_arrays = array * ((grads_nvme ? 0 : 1) + (host_master ? 1 : 0) +
                           (optim_nvme ? 0 : states) + (c.delayed_param_update ? 1 : 0));
  uint64_t tier = 0, largest_tier = 0, persistent_budget = 0, working_set = 0;
  for (const auto& params : l.modules) {
    uint64_t bytes = 0;
    for (const Laid& p : params) {
      // Engine::Impl::OpenTiers: the shard's copy, the gathered parameter (several ranks),
      // its fp32 widening (16-bit on the host device) and the gradient.
      const uint64_t full = p.shard * world;
      const uint64_t gathered = world > 1 ? full * e : 0;
      const uint64_t widened = e != 4 ? full * 4 : 0;
      (p.persistent ? persistent_budget : bytes) += p.shard * e + gathered + widened + full * 4;
      tier += PageUp(p.shard * e);
      largest_tier = std::max(largest_tier, p.shard * e);
    }
    working_set = std::max(working_set, bytes);
  }
  if (!params_nvme) m.param_tier = tier;
  if (optim_nvme) {
    const uint64_t chunk = ChunkElements(c, S);
    m.nvme_staging = PipelinedOptimizerOptions().num_buffers * chunk *
                     PipelinedOptimizerOptions::kStagingBytesPerElement;
    const uint64_t chunks = (S + chunk - 1) / chunk;
    // Host-resident chunks (fp32 params, the states and room for gradients), blocks of the
    // store's host tier.
    for (uint64_t i = 0; i < chunks; ++i) {
      const bool on_nvme =
          std::floor((i + 1) * c.optimizer_nvme_ratio) > std::floor(i * c.optimizer_nvme_ratio);
      if (!on_nvme) {
        m.host_state_pool += PipelinedOptimizer::ChunkBytes(std::min(chunk, S - i * chunk), states);
      }
    }
    // OpenTiers reserves swap space for every chunk, whatever the ratio; twice for the
    // overlapped step (its new state goes beside the old until the step stands; the engine
    // takes less where the disk has not the room); the gradient accumulators' 4 bytes an
    // element when they live on NVMe.
    m.nvme += chunks * (chunk * 12 + c.aio.block_size) * (c.overlap_optimizer ? 2 : 1);
    if (c.gradients_on_nvme) m.nvme += chunks * (chunk * 4 + c.aio.block_size);
  }
  if (params_nvme) {
    const uint64_t piece = std::clamp<uint64_t>(PageUp(largest_tier), 1 << 20, 64 << 20);
    for (const auto& params : l.modules) {
      for (const Laid& p : params) {
        const uint64_t bytes = p.shard * e;
        m.nvme += bytes + (bytes + piece - 1) / piece * c.aio.block_size;
      }
    }
  }
  if (m.nvme > 0) {
    // SwapStore: one file per path, each rounded up to the stripe (aio.block_size).
    const uint64_t paths = std::max<size_t>(1, c.NvmePaths().size());
    m.nvme = AlignUp((m.nvme + paths - 1) / paths, c.aio.block_size) * paths;
  }
  // Peak: the budgets OpenTiers gives the store.
  // The two reduce-scatter buckets live in the device tier (Note [Gradient buckets]).
  uint64_t largest_shard = 0;
  for (const auto& params : l.modules) {
    for (const Laid& p : params) largest_shard = std::max(largest_shard, p.shard);
  }
  const uint64_t bucket_slice = GradientBuckets::SliceCapacity(
      std::min<uint64_t>(c.reduce_bucket_size, S * world), world, largest_shard);
  const uint64_t buckets = world > 1 ? 2 * bucket_slice * (world + 1) * 4 : 0;
  if (world > 1) {  // GradientBuckets::Reserve: the send buffer and the reduced slice
    const uint64_t one = PageUp(bucket_slice * world * 4) + PageUp(bucket_slice * 4);
    m.buckets = (S * world <= c.reduce_bucket_size ? 1 : 2) * one;
  }
  m.device_budget = (c.offload_param_device == OffloadDevice::kNone ? tier : 0) +
                    persistent_budget + 2 * working_set + 2 * c.stage3_prefetch_bucket_size * e +
                    buckets + (64 << 20);
  if (!model.fetch_order.empty()) {
    // The buckets stay in the device tier once allocated: the cache has the rest.
    const CacheSim sim = SimulateCache(model, c, world, l, m.device_budget - buckets);
    m.device_cache = sim.cached_at_end;
    m.peak_device =
        std::min(m.device_budget,
                 sim.peak + (c.offload_param_device == OffloadDevice::kNone ? tier : 0) + buckets);
  }
  m.host_budget = m.host_arrays + (c.offload_param_device == OffloadDevice::kCpu ? tier : 0) +
                  std::max<uint64_t>(256 << 20, 4 * largest_tier);
  m.activations = model.activation_bytes;
  // In host memory at the peak: the host arrays, the parameter tier where it lives there, the
  // NVMe optimizer's pools, with parameters on NVMe the host copies the step writes back
  // (within the host tier's room) and the store's staging buffers for NVMe.
  const uint64_t write_backs =
      params_nvme ? std::min<uint64_t>(tier, std::max<uint64_t>(256 << 20, 4 * largest_tier)) : 0;
  const uint64_t piece = std::clamp<uint64_t>(PageUp(largest_tier), 1 << 20, 64 << 20);
  const uint64_t store_staging = params_nvme || optim_nvme ? 4 * piece : 0;
  m.peak_host = m.host_arrays + (c.offload_param_device == OffloadDevice::kCpu ? tier : 0) +
                m.nvme_staging + m.host_state_pool + write_backs + store_staging;
  return m;
}

// ---- Time ----

int ThreadsPerRank(const MachineProfile& profile, const PlanOptions& options) {
  return options.threads > 0 ? options.threads
                             : std::max(1, profile.cores / std::max(options.world_size, 1));
}

bool ComputeTakesEveryCore(const MachineProfile& profile, const PlanOptions& options) {
  return options.world_size * ThreadsPerRank(profile, options) >= profile.cores;
}

StatusOr<Estimate> EstimatePlacement(const ModelSpec& model, const EngineConfig& c,
                                     const MachineProfile& profile, const PlanOptions& options) {
  if (options.world_size < 1) {
    return InvalidArgument(fmt::format("--world-size must be >= 1, got {}", options.world_size));
  }
  if (model.fetch_flops.size() != model.fetch_order.size()) {
    return Internal("plan: the model's fetch_flops and fetch_order differ in length");
  }
  const int world = options.world_size;
  Estimate est;
  est.memory = EstimateMemory(model, c, world);
  MemoryEstimate& m = est.memory;
  const Layout l = LayOut(model, c, world);
  const uint64_t e = ElementBytes(c);
  const uint64_t S = l.shard_elements;
  const bool params_nvme = c.offload_param_device == OffloadDevice::kNvme;
  const bool optim_nvme = c.offload_optimizer_device == OffloadDevice::kNvme;
  const bool host_master = !(params_nvme && optim_nvme);
  const bool uses_nvme = params_nvme || optim_nvme;
  const int threads = ThreadsPerRank(profile, options);

  // Fits (Note [Plan memory]): the engine's device is the host device today, so without a GPU
  // figure every byte is host memory.
  const uint64_t memory = options.memory_bytes != 0 ? options.memory_bytes : profile.memory_bytes;
  const uint64_t gpu =
      options.gpu_memory_bytes != 0 ? options.gpu_memory_bytes : profile.gpu_memory_bytes;
  const uint64_t nvme_free =
      options.nvme_free_bytes != 0 ? options.nvme_free_bytes : profile.nvme_free_bytes;
  const uint64_t ranks = static_cast<uint64_t>(world);  // all on this machine
  std::vector<std::string> why;
  if (gpu == 0) {
    const uint64_t need = (m.peak_device + m.peak_host + m.activations) * ranks;
    if (need > memory) {
      why.push_back(fmt::format("memory: needs {} of {}", FormatBytes(need), FormatBytes(memory)));
    }
  } else {
    if ((m.peak_device + m.activations) > gpu) {
      why.push_back(fmt::format("GPU: needs {} of {}", FormatBytes(m.peak_device + m.activations),
                                FormatBytes(gpu)));
    }
    if (m.peak_host * ranks > memory) {
      why.push_back(fmt::format("memory: needs {} of {}", FormatBytes(m.peak_host * ranks),
                                FormatBytes(memory)));
    }
  }
  if (uses_nvme) {
    if (m.nvme * ranks > nvme_free) {
      why.push_back(fmt::format("NVMe: needs {} of {} free", FormatBytes(m.nvme * ranks),
                                FormatBytes(nvme_free)));
    }
    if (!options.sizes_only && (profile.nvme_read_Bps <= 0 || profile.nvme_write_Bps <= 0)) {
      why.push_back("the profile has no NVMe bandwidth (profile with --path DIR)");
    }
  }
  est.fits = why.empty();
  for (size_t i = 0; i < why.size(); ++i) est.why += (i ? "; " : "") + why[i];
  if (options.sizes_only) return est;

  // Compute rate: the GPT's matmuls multiply in bf16 where the config enables it and the
  // machine has native bf16 (the profile's bf16 figure); the MLP's plain loop is one thread.
  const double rate = model.plain_loop_compute
                          ? profile.loop_fp32_flops
                          : profile.MatmulRate(threads, c.bf16, model.hidden_size);
  if (rate <= 0) {
    return InvalidArgument(fmt::format("the profile has no {} compute rate",
                                       model.plain_loop_compute ? "loop_fp32_GFLOPs" : "matmul"));
  }
  TimeEstimate& t = est.time;
  const int gas = c.gradient_accumulation_steps;
  // Attention's matmuls at their own rate where the profile has one; std::exp on one thread.
  const MachineProfile::CallRow& kernels = profile.KernelCall(threads);
  const double attention_extra =
      kernels.attention_flops > 0 && !model.plain_loop_compute
          ? model.attention_flops_per_micro_batch * (1 / kernels.attention_flops - 1 / rate)
          : 0.0;
  const double non_matmul =
      SafeDiv(model.elementwise_bytes_per_micro_batch, profile.memory_Bps) +
      model.kernel_calls_per_micro_batch * kernels.seconds +
      SafeDiv(model.exps_per_micro_batch, profile.exp_per_s) + std::max(0.0, attention_extra) +
      SafeDiv(model.gelu_forward_elements_per_micro_batch, kernels.gelu_forward_per_s) +
      SafeDiv(model.gelu_backward_elements_per_micro_batch, kernels.gelu_backward_per_s);

  const CacheSim sim = SimulateCache(model, c, world, l, m.device_budget);
  const std::vector<int>& order = sim.order;
  const std::vector<uint64_t>& miss = sim.miss;
  const size_t n = order.size();
  std::vector<double> flops;
  for (int k = 0; k < c.gradient_accumulation_steps; ++k) {
    flops.insert(flops.end(), model.fetch_flops.begin(), model.fetch_flops.end());
  }
  std::vector<uint64_t> gathered_bytes(l.modules.size()), gathers(l.modules.size());
  uint64_t persistent_gathered = 0, persistent_count = 0;
  // The collectives that gather the persistent parameters again after a step (Note [Coalesced
  // gathers]): in stage 3 each module's first fetch, with its other parameters, so only a
  // module of persistent parameters alone adds one; in stages 1 and 2 the step's
  // ParamTier::GatherPersistent, in groups of at most stage3_prefetch_bucket_size elements.
  uint64_t persistent_collectives = 0, group_elements = 0;
  for (size_t i = 0; i < l.modules.size(); ++i) {
    bool alone = true;
    for (const Laid& p : l.modules[i]) {
      if (!p.persistent) {
        alone = false;
        continue;
      }
      persistent_gathered += p.shard * world * e;
      ++persistent_count;
      const uint64_t full = p.shard * world;
      if (c.zero_stage < 3 &&
          (persistent_collectives == 0 || group_elements + full > c.stage3_prefetch_bucket_size)) {
        ++persistent_collectives;
        group_elements = 0;
      }
      group_elements += full;
    }
    if (c.zero_stage == 3 && alone && !l.modules[i].empty()) {
      ++persistent_collectives;
    }
    gathered_bytes[i] = ShardBytes(l.modules[i], e) * world;
    gathers[i] = CountNonPersistent(l.modules[i]);
  }
  // The read-ahead window (ParamTier::ReadAhead): fetch i's shards are asked for at fetch
  // issue[i], the last fetch from which i is within stage3_prefetch_bucket_size elements.
  std::vector<uint64_t> elements(l.modules.size(), 0);
  for (size_t i = 0; i < l.modules.size(); ++i) {
    for (const Laid& p : l.modules[i]) {
      if (!p.persistent) elements[i] += p.numel;
    }
  }
  // The link a miss crosses: NVMe reads (then the host-to-device copy, which on the host device
  // is a memcpy), or the host-to-device copy alone.
  const double copy_Bps = profile.h2d_Bps > 0 ? profile.h2d_Bps : profile.memory_Bps / 2;
  // The ranks on this machine share its disks, at the same time: they run in step.
  const double nvme_read_Bps = profile.nvme_read_Bps / world;
  const double nvme_write_Bps = profile.nvme_write_Bps / world;
  const double miss_Bps = params_nvme ? nvme_read_Bps : copy_Bps;
  // Every core computes: the ranks' communication threads share them, and the CPU the
  // collectives take is time the compute does not get (Note [Collectives' CPU]).
  const bool cores_shared = world > 1 && ComputeTakesEveryCore(profile, options);
  auto collective_cpu = [&](double collectives, double bytes) {
    return cores_shared
               ? collectives * profile.collective_cpu_s + bytes * profile.collective_cpu_s_per_byte
               : 0.0;
  };
  const double total = static_cast<double>(l.total);
  const double buckets =
      std::ceil(total / static_cast<double>(std::max<uint64_t>(1, c.reduce_bucket_size)));
  // The gradients' reduce-scatters run during backward: their CPU spread over the compute.
  const double reduce_cpu = gas * collective_cpu(buckets, total * 4);
  double stolen = 0;  // compute seconds the collectives take
  // Event simulation: compute is one serial lane, reads another, all-gathers a third.
  double clock = 0, disk_free = 0, comm_free = 0;
  std::vector<double> start(n, 0);
  double wait_read = 0, wait_gather = 0;
  // The persistent parameters are gathered again at the first fetch after each step.
  if (world > 1 && persistent_count > 0) {
    const double g = persistent_collectives * profile.collective_latency_s +
                     SafeDiv(2.0 * persistent_gathered, profile.memory_Bps) +
                     SafeDiv(static_cast<double>(persistent_gathered), profile.allgather_Bps);
    clock += g;
    wait_gather += g;
    stolen += collective_cpu(persistent_collectives, persistent_gathered);
  }
  for (size_t i = 0; i < n; ++i) {
    const int mod = order[i];
    // Issued at the fetch that first has i inside its window (the step's first fetch: at the
    // previous step, which is how EndBatch reads ahead; counted here as at time 0).
    size_t from = i == 0 ? 0 : i - 1;
    uint64_t ahead = 0;
    while (from > 0) {
      ahead += elements[order[from]];  // the modules between fetch from - 1 and fetch i
      if (ahead >= c.stage3_prefetch_bucket_size) break;
      --from;
    }
    const double issue = i == 0 ? 0.0 : start[from];
    double have = issue;
    if (miss[i] > 0 && miss_Bps > 0) {
      const double begin = std::max(issue, disk_free);
      // Each shard is its own request: NVMe's per-request latency, a batch's worth at once.
      disk_free =
          begin + miss[i] / miss_Bps +
          (params_nvme ? std::ceil(gathers[mod] / RequestsInFlight(c)) * profile.nvme_read_latency_s
                       : 0.0);
      have = disk_free;
    }
    double gathered = have;
    double fetch_cpu = reduce_cpu * SafeDiv(flops[i], gas * model.matmul_flops_per_micro_batch);
    if (world > 1 && gathers[mod] > 0) {
      // The next module's all-gathers start at the fetch before (ParamTier::PrefetchGathers).
      const double begin = std::max({have, comm_free, i == 0 ? 0.0 : start[i - 1]});
      // One collective for the module's parameters; with several, their shards packed and
      // the gathered pieces unpacked through memory (Note [Coalesced gathers]).
      const double coalesce =
          gathers[mod] > 1 ? SafeDiv(2.0 * gathered_bytes[mod], profile.memory_Bps) : 0.0;
      const double transfer =
          coalesce + SafeDiv(static_cast<double>(gathered_bytes[mod]), profile.allgather_Bps);
      if (cores_shared) fetch_cpu += coalesce + collective_cpu(1, gathered_bytes[mod]);
      comm_free = begin + profile.collective_latency_s + transfer;
      // With the ranks computing, the wait measured after as much compute as there was since
      // the collective began (Note [Loaded rendezvous]).
      if (!profile.loaded_wait.empty()) {
        const double met =
            clock + profile.LoadedWait(clock - begin, &MachineProfile::LoadedWaitRow::wait_s);
        // With no core to spare, the transfer (loopback copies, packing) takes the compute's
        // cores once the ranks meet instead of running beside the compute.
        comm_free = std::max(comm_free, met + (cores_shared ? transfer : 0.0));
      }
      gathered = comm_free;
    }
    const double s = std::max(clock, gathered);
    if (s > clock) {
      // Blame the later of the two lanes.
      if (gathered > have) {
        wait_gather += s - std::max(clock, have);
        wait_read += std::max(0.0, have - clock);
      } else {
        wait_read += s - clock;
      }
    }
    start[i] = s;
    clock = s + flops[i] / rate +
            non_matmul * SafeDiv(flops[i], model.matmul_flops_per_micro_batch) + fetch_cpu;
    stolen += fetch_cpu;
    t.bytes_gathered += world > 1 ? gathered_bytes[mod] : 0;
    if (params_nvme) t.nvme_read += miss[i];
  }
  t.compute = gas * (model.matmul_flops_per_micro_batch / rate + non_matmul) + stolen;
  if (world == 1) {
    // One rank's gathered parameter is its shard: StepSummary counts its bytes as gathered.
    for (size_t i = 0; i < n; ++i) t.bytes_gathered += gathered_bytes[order[i]];
  }
  t.gather = wait_gather + (params_nvme ? 0.0 : wait_read);
  double nvme_wait = params_nvme ? wait_read : 0.0;

  // Gradients: zeroed buffers, the reduce-scatter in buckets (several ranks), and the
  // accumulation into fp32 (one rank's first micro-batch accumulates in place).
  double memory_bytes = gas * total * 4;  // zeroing every gradient buffer
  memory_bytes += (world == 1 ? (gas - 1) : gas) * static_cast<double>(S) * 12;
  t.reduce = SafeDiv(memory_bytes, profile.memory_Bps);
  if (world > 1) {
    t.reduce += gas * (buckets * profile.collective_latency_s +
                       SafeDiv(total * 4, profile.reduce_scatter_Bps));
    // The ranks meet at the step's norm all-reduce, the one waiting for the other's last
    // fetches (Note [Loaded rendezvous]).
    t.reduce += profile.LoadedWait(t.compute / static_cast<double>(n),
                                   &MachineProfile::LoadedWaitRow::step_s);
  }

  // The optimizer step.
  const double update = S / profile.OptimizerRate(threads);
  double pass = 0, tier_write = 0;
  if (optim_nvme) {
    const uint64_t chunk = ChunkElements(c, S);
    const uint64_t chunks = (S + chunk - 1) / chunk;
    double on_nvme = 0;  // elements
    for (uint64_t i = 0; i < chunks; ++i) {
      if (std::floor((i + 1) * c.optimizer_nvme_ratio) > std::floor(i * c.optimizer_nvme_ratio))
        on_nvme += static_cast<double>(std::min(chunk, S - i * chunk));
    }
    double read = on_nvme * 12, written = on_nvme * 12;
    // With the gradients on NVMe the step reads them (4 bytes an element); each micro-batch's
    // reductions also wrote them, and read them back from the second micro-batch on, through
    // the accumulators' staging (all counted in StepSummary). Those writes and read-backs run
    // during backward, but the disk spends the time.
    double backward_read = 0, backward_written = 0;
    if (c.gradients_on_nvme) {
      read += on_nvme * 4;
      backward_written = on_nvme * 4 * gas;
      backward_read = on_nvme * 4 * (gas - 1);
    }
    t.nvme_read += static_cast<uint64_t>(read + backward_read);
    t.nvme_written += static_cast<uint64_t>(written + backward_written);
    // The pass keeps reads ahead of the update and a write behind it (Note [Pipelined step]):
    // both in flight at once, at the disk's mixed rate where the profile has it, never faster
    // than each direction alone; one after the other without it.
    const double reads = SafeDiv(read + backward_read, nvme_read_Bps);
    const double writes = SafeDiv(written + backward_written, nvme_write_Bps);
    pass = profile.nvme_mixed_Bps > 0
               ? std::max({reads, writes,
                           SafeDiv(read + backward_read + written + backward_written,
                                   profile.nvme_mixed_Bps / world)})
               : reads + writes;
  }
  if (host_master) tier_write += SafeDiv(S * (4.0 + e), profile.memory_Bps);
  double tier_nvme = 0;
  if (params_nvme) {
    t.nvme_written += S * e;
    // Every shard written back in one batch, as many in flight as the aio rings hold (Note
    // [Batched write-backs] in offload/tiered_store.cc), and the persistent ones read again
    // after the step. With several ranks each request also waits for the cores the other
    // ranks' writes take (Note [Loaded shard writes]).
    uint64_t shards = 0;
    for (const auto& params : l.modules) shards += params.size();
    double requests = std::ceil(shards / RequestsInFlight(c)) * profile.nvme_write_latency_s;
    if (world > 1) requests = std::max(requests, shards * profile.loaded_shard_write_s);
    tier_nvme = SafeDiv(S * static_cast<double>(e), nvme_write_Bps) + requests +
                std::ceil(persistent_count / RequestsInFlight(c)) * profile.nvme_read_latency_s;
  }
  t.optimizer = update + tier_write;
  // The overlapped step (zinf.overlap_optimizer) runs the pass chunk by chunk while the last
  // micro-batch's backward goes on: that backward's compute hides as much of it.
  double hidden = 0;
  if (optim_nvme && c.overlap_optimizer && !options.clipped) {
    const size_t per = model.fetch_order.size();
    for (size_t i = n - per; i < n; ++i) {
      const int mod = order[i];
      bool backward = false;  // a module's second fetch in the micro-batch
      for (size_t k = n - per; k < i; ++k) backward = backward || order[k] == mod;
      if (backward) hidden += flops[i] / rate;
    }
  }
  const double optimizer_nvme = std::max(update, pass);
  const double exposed = std::max(optimizer_nvme - hidden, 0.0);
  t.optimizer = std::min(update, exposed) + tier_write;
  t.nvme = nvme_wait + std::max(0.0, exposed - update) + tier_nvme;
  t.step = t.compute + t.gather + t.reduce + t.optimizer + t.nvme;
  return est;
}

// ---- Placements and configs ----

std::vector<EngineConfig> Placements(const EngineConfig& base, const std::string& nvme_path) {
  std::vector<EngineConfig> out;
  const OffloadDevice devices[] = {OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme};
  for (int precision = 0; precision < 3; ++precision) {
    for (OffloadDevice param : devices) {
      for (int optim = 0; optim < 5; ++optim) {
        EngineConfig c = base;
        c.zero_stage = 3;
        c.warnings.clear();
        c.bf16 = precision == 1;
        c.fp16 = precision == 2;
        c.offload_param_device = param;
        c.offload_optimizer_device = optim == 0   ? OffloadDevice::kNone
                                     : optim == 1 ? OffloadDevice::kCpu
                                                  : OffloadDevice::kNvme;
        c.optimizer_nvme_ratio = optim == 3 ? 0.5 : 1.0;
        // The gradients' tier: host memory, or with the optimizer on NVMe, NVMe too.
        c.gradients_on_nvme = optim == 4;
        // DPU is for an optimizer in host memory; on NVMe the step overlaps backward instead.
        if (optim >= 2) c.delayed_param_update = false;
        c.offload_param_nvme_path.clear();
        c.offload_optimizer_nvme_path.clear();
        if (param == OffloadDevice::kNvme) c.offload_param_nvme_path = {nvme_path};
        if (optim >= 2) c.offload_optimizer_nvme_path = {nvme_path};
        out.push_back(std::move(c));
      }
    }
  }
  return out;
}

std::string PlacementName(const EngineConfig& c) {
  std::string optim(OffloadDeviceName(c.offload_optimizer_device));
  if (c.offload_optimizer_device == OffloadDevice::kNvme && c.optimizer_nvme_ratio < 1.0) {
    optim += fmt::format(" {:g}", c.optimizer_nvme_ratio);
  }
  const bool grads_nvme = c.gradients_on_nvme && c.offload_optimizer_device == OffloadDevice::kNvme;
  return fmt::format("param {}, optim {}{}, {}", OffloadDeviceName(c.offload_param_device), optim,
                     grads_nvme ? ", grads nvme" : "",
                     c.bf16   ? "bf16"
                     : c.fp16 ? "fp16"
                              : "fp32");
}

StatusOr<std::string> DeepSpeedJson(const EngineConfig& c, std::string_view base_json) {
  ZINF_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(base_json, "the base config"));
  if (!j.is_object()) return InvalidArgument("the base config is not a JSON object");
  j.erase("model");
  nlohmann::json& zero = j["zero_optimization"];
  if (!zero.is_object()) zero = nlohmann::json::object();
  zero["stage"] = c.zero_stage;
  auto offload = [&](const char* key, OffloadDevice device, const std::vector<std::string>& paths) {
    nlohmann::json& o = zero[key];
    if (!o.is_object()) o = nlohmann::json::object();
    o["device"] = std::string(OffloadDeviceName(device));
    if (device == OffloadDevice::kNvme) {
      o["nvme_path"] = paths.size() == 1 ? nlohmann::json(paths[0]) : nlohmann::json(paths);
    } else {
      o.erase("nvme_path");
    }
  };
  offload("offload_param", c.offload_param_device, c.offload_param_nvme_path);
  offload("offload_optimizer", c.offload_optimizer_device, c.offload_optimizer_nvme_path);
  j["bf16"] = {{"enabled", c.bf16}};
  if (c.fp16) {
    if (!j.contains("fp16") || !j["fp16"].is_object()) j["fp16"] = nlohmann::json::object();
    j["fp16"]["enabled"] = true;
  } else {
    j.erase("fp16");
  }
  if (!j.contains("zinf") || !j["zinf"].is_object()) j["zinf"] = nlohmann::json::object();
  if (c.offload_optimizer_device == OffloadDevice::kNvme) {
    j["zinf"]["optimizer_nvme_ratio"] = c.optimizer_nvme_ratio;
    j["zinf"]["gradients_on_nvme"] = c.gradients_on_nvme;
    j["zinf"].erase("delayed_param_update");
  } else {
    j["zinf"].erase("optimizer_nvme_ratio");
    j["zinf"].erase("gradients_on_nvme");
  }
  if (j["zinf"].empty()) j.erase("zinf");
  return j.dump(2) + "\n";
}

}  // namespace zinf::plan
