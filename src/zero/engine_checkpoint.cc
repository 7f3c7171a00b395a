// The engine's checkpoints (format and protocol: src/ckpt/checkpoint.h): what a rank saves,
// and a load that verifies everything before it replaces anything.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "ckpt/checkpoint.h"
#include "ckpt/safetensors.h"
#include "core/config_reader.h"
#include "zero/engine_impl.h"

namespace zinf {
namespace {

std::string ShapeText(const std::vector<int64_t>& shape) { return nlohmann::json(shape).dump(); }

struct SavedScalars {
  int64_t steps = 0, iteration = 0, last_overflow_iteration = -1;
  double loss_scale = 1;
  int hysteresis_left = 1, state_count = 0;
  std::string optimizer;
};

// ScalarState() back, each field checked before anything is replaced.
StatusOr<SavedScalars> ParseScalarState(const std::string& text, const std::string& dir) {
  StatusOr<nlohmann::json> parsed = ParseJson(text, "engine_state");
  auto bad = [&](const char* key, const char* expected) {
    return DataLoss(fmt::format("{}: manifest engine_state.{} must be {}", dir, key, expected));
  };
  if (!parsed.ok()) return DataLoss(fmt::format("{}: manifest {}", dir, parsed.status().message()));
  const nlohmann::json& j = *parsed;
  if (!j.is_object()) {
    return DataLoss(fmt::format("{}: manifest engine_state must be a JSON object", dir));
  }
  SavedScalars s;
  auto integer = [&](const char* key, int64_t low, int64_t high, auto* out) -> Status {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < low ||
        it->get<int64_t>() > high) {
      return bad(key, "an integer in range");
    }
    *out = static_cast<std::remove_pointer_t<decltype(out)>>(it->get<int64_t>());
    return OkStatus();
  };
  constexpr int64_t kMax = INT64_MAX / 2;
  ZINF_RETURN_IF_ERROR(integer("steps", 0, kMax, &s.steps));
  ZINF_RETURN_IF_ERROR(integer("iteration", 0, kMax, &s.iteration));
  ZINF_RETURN_IF_ERROR(integer("last_overflow_iteration", -1, kMax, &s.last_overflow_iteration));
  ZINF_RETURN_IF_ERROR(integer("hysteresis_left", 0, INT32_MAX, &s.hysteresis_left));
  ZINF_RETURN_IF_ERROR(integer("state_count", 0, 2, &s.state_count));
  auto scale = j.find("loss_scale");
  if (scale == j.end() || !scale->is_number() || !(scale->get<double>() > 0) ||
      !std::isfinite(scale->get<double>())) {
    return bad("loss_scale", "a positive finite number");
  }
  s.loss_scale = scale->get<double>();
  auto opt = j.find("optimizer");
  if (opt == j.end() || !opt->is_string()) return bad("optimizer", "a string");
  s.optimizer = opt->get<std::string>();
  return s;
}

// The sections of a rank's file that hold the flat shard: the fp32 master (then the frozen
// parameters' values, Note [Frozen parameters]), then the optimizer's state arrays.
constexpr const char* kSections[] = {"params", "state0", "state1"};

// Where a checkpoint's parameters are among this model's: manifest.params[index[i]] is
// params[i], and the saved layout is this model's order where `same_order`.
struct SavedLayout {
  std::vector<size_t> index;
  bool same_order = true;
};

// The module buffers' bytes, rank 0's, in the manifest's order, verified.
StatusOr<std::string> ReadSavedBuffers(const ckpt::Manifest& manifest, const std::string& dir) {
  std::string saved_buffers;
  if (manifest.buffers.empty()) return saved_buffers;
  ZINF_ASSIGN_OR_RETURN(
      ckpt::ShardReader first,
      ckpt::ShardReader::Open(dir + "/" + ckpt::ShardFileName(0), manifest.tag, 0));
  uint64_t total = 0;
  for (const ckpt::ManifestBuffer& s : manifest.buffers) total += s.bytes;
  ZINF_ASSIGN_OR_RETURN(const uint64_t bytes, first.SectionBytes("buffers"));
  if (bytes != total) {
    return DataLoss(fmt::format("{}/{}: section 'buffers' has {} bytes, expected {}", dir,
                                ckpt::ShardFileName(0), bytes, total));
  }
  ZINF_RETURN_IF_ERROR(first.Verify("buffers", [&](const char* data, uint64_t n) {
    saved_buffers.append(data, n);
    return OkStatus();
  }));
  return saved_buffers;
}

// The saved ranks' files this rank's shard is read from: its own where the world size and the
// parameters' order are the saved ones, else every saved rank's (Note [Resharding on load]).
class SavedShards {
 public:
  // Opens the files and verifies every section a load reads (`sections` of the flat shard's
  // arrays, and the optimizer's).
  // This rank is `rank` of `world`, with `params`; all of it and `manifest` outlive the
  // SavedShards.
  static StatusOr<SavedShards> Open(const std::vector<Param>& params, int rank, int world,
                                    const ckpt::Manifest& manifest, const std::string& dir,
                                    SavedLayout layout, int sections) {
    SavedShards shards(params, rank, world, manifest, std::move(layout));
    const int saved_world = manifest.world_size;
    const bool reshard = shards.reshard_;
    for (int r = reshard ? 0 : rank; r < (reshard ? saved_world : rank + 1); ++r) {
      ZINF_ASSIGN_OR_RETURN(
          ckpt::ShardReader reader,
          ckpt::ShardReader::Open(dir + "/" + ckpt::ShardFileName(r), manifest.tag, r));
      shards.readers_.push_back(std::move(reader));
    }
    for (size_t k = 0; k < shards.readers_.size(); ++k) {
      const int r = reshard ? static_cast<int>(k) : rank;
      for (int i = 0; i < sections; ++i) {
        ZINF_ASSIGN_OR_RETURN(const uint64_t bytes, shards.readers_[k].SectionBytes(kSections[i]));
        const uint64_t expected =
            (i == 0 ? manifest.params_elements() : manifest.shard_elements) * 4;
        if (bytes != expected) {
          return DataLoss(fmt::format("{}/{}: section '{}' has {} bytes, expected {}", dir,
                                      ckpt::ShardFileName(r), kSections[i], bytes, expected));
        }
      }
    }
    ZINF_RETURN_IF_ERROR(shards.readers_[0].Verify("optimizer", [&](const char* data, uint64_t n) {
      shards.optimizer_.append(data, n);
      return OkStatus();
    }));
    for (const ckpt::ShardReader& reader : shards.readers_) {
      for (int i = 0; i < sections; ++i) ZINF_RETURN_IF_ERROR(reader.Verify(kSections[i]));
    }
    return shards;
  }

  // The optimizer's hyper-parameters and step counts ("optimizer").
  const std::string& optimizer() const { return optimizer_; }

  // Elements [begin, begin + count) of this rank's flat shard of section `name` into `out`.
  Status Read(const char* name, uint64_t begin, uint64_t count, float* out) const {
    if (!reshard_) return readers_[0].Read(name, begin * 4, out, count * 4);
    std::fill(out, out + count, 0.0f);  // padding
    const std::vector<Param>& params = *params_;
    auto it = std::upper_bound(params.begin(), params.end(), begin,
                               [](uint64_t b, const Param& p) { return b < p.flat_offset; });
    for (--it; it != params.end() && it->flat_offset < begin + count; ++it) {
      const Param& p = *it;
      const ckpt::ManifestParam& saved = manifest_->params[layout_.index[&p - params.data()]];
      const auto [first, last] = Overlap(begin, count, p);
      if (first >= last) continue;
      // This rank's elements of the whole parameter, [x, end), and where they go.
      const uint64_t mine = static_cast<uint64_t>(rank_) * p.shard_size;
      uint64_t x = mine + (first - p.flat_offset);
      const uint64_t end = std::min<uint64_t>(mine + (last - p.flat_offset), p.numel);
      float* to = out + (first - begin);
      while (x < end) {
        const uint64_t r = x / saved.shard_size;
        const uint64_t run = std::min(end, (r + 1) * saved.shard_size) - x;
        ZINF_RETURN_IF_ERROR(readers_[r].Read(
            name, (saved.flat_offset + x - r * saved.shard_size) * 4, to, run * 4));
        x += run;
        to += run;
      }
    }
    return OkStatus();
  }

 private:
  SavedShards(const std::vector<Param>& params, int rank, int world, const ckpt::Manifest& manifest,
              SavedLayout layout)
      : params_(&params),
        manifest_(&manifest),
        rank_(rank),
        layout_(std::move(layout)),
        reshard_(manifest.world_size != world || !layout_.same_order) {}

  const std::vector<Param>* params_;
  const ckpt::Manifest* manifest_;
  int rank_;
  SavedLayout layout_;
  bool reshard_;
  std::vector<ckpt::ShardReader> readers_;
  std::string optimizer_;
};

}  // namespace

// Saving and loading the engine's state (the engine's thread).
struct Engine::Impl::Checkpoints {
  // The engine's scalars a checkpoint's manifest carries (engine_state).
  static nlohmann::json ScalarState(const Impl& m);
  static ckpt::Manifest MakeManifest(const Impl& m, const std::string& tag,
                                     const std::string& client_state);
  // This rank's file: "params" (the fp32 master shard, then the frozen parameters' values),
  // "state0"/"state1" (the optimizer state arrays) and "optimizer" (hyper-parameters and step
  // counts).
  static Status WriteShardFile(const Impl& m, const std::string& tag_dir, const std::string& tag);

  // Checks the checkpoint against this engine and verifies every section of this rank's file;
  // only then replaces the state. Returns the client state.
  static StatusOr<std::string> LoadShardFile(Impl& m, const std::string& path);
  // A checkpoint of another parameter count: what differs, named, not only how many (an
  // import that missed one tensor of a model otherwise reads as a different model).
  static Status OtherParamCount(const Impl& m, const ckpt::Manifest& manifest,
                                const std::string& dir);
  // Matches the checkpoint's parameters with this model's, by name, shape and layout.
  static StatusOr<SavedLayout> MatchSavedLayout(const Impl& m, const ckpt::Manifest& manifest,
                                                const std::string& dir);
  // The module buffers must be the same set as this model's, each of the same dtype and shape.
  static Status CheckBuffers(const Impl& m, const ckpt::Manifest& manifest, const std::string& dir);

  // Engine::LoadSafetensors on this rank: matches every parameter with the file's tensor of
  // its name and shape before it replaces any, then writes this rank's shards.
  static Status LoadSafetensorsFile(Impl& m, const std::string& path);

  // Writes the parameter tier from fp32 shard values after a load: from the master where it
  // is in host memory (which the load has replaced), else (and for the frozen parameters)
  // from `read` (elements of the flat shard, the load's source).
  static Status WriteParamTier(Impl& m, const ShardFill& read);
};

nlohmann::json Engine::Impl::Checkpoints::ScalarState(const Impl& m) {
  return {{"steps", m.optimizer_step->steps()},
          {"loss_scale", m.scaler.scale},
          {"hysteresis_left", m.scaler.hysteresis_left},
          {"iteration", m.scaler.iteration},
          {"last_overflow_iteration", m.scaler.last_overflow_iteration},
          {"optimizer", OptimizerTypeName(m.config.optimizer.type)},
          {"state_count", m.optimizer_step->state_count()}};
}

ckpt::Manifest Engine::Impl::Checkpoints::MakeManifest(const Impl& m, const std::string& tag,
                                                       const std::string& client_state) {
  ckpt::Manifest manifest;
  manifest.tag = tag;
  manifest.world_size = m.world();
  manifest.step = m.optimizer_step->steps();
  manifest.shard_elements = m.shard_elements;
  manifest.frozen_elements = FlatEnd(m.params) - m.shard_elements;
  for (const Param& p : m.params) {
    manifest.params.push_back(
        {p.spec.name, p.spec.shape, p.numel, p.shard_size, p.flat_offset, !p.trainable()});
  }
  manifest.engine_state = ScalarState(m).dump();
  manifest.client_state = client_state;
  manifest.metadata = m.checkpoint_metadata;
  for (const Impl::ModuleBuffer& b : m.buffers) {
    manifest.buffers.push_back({b.name, b.dtype, b.shape, b.bytes.size()});
  }
  return manifest;
}

Status Engine::Impl::Checkpoints::WriteShardFile(const Impl& m, const std::string& tag_dir,
                                                 const std::string& tag) {
  ZINF_ASSIGN_OR_RETURN(
      ckpt::ShardWriter w,
      ckpt::ShardWriter::Create(tag_dir + "/" + ckpt::ShardFileName(m.rank()), tag, m.rank()));
  const uint64_t bytes = m.shard_elements * 4;
  const int sections = 1 + m.optimizer_step->state_count();
  for (int i = 0; i < sections; ++i) {
    ZINF_RETURN_IF_ERROR(w.Add(kSections[i], i == 0 ? FlatEnd(m.params) * 4 : bytes));
  }
  ZINF_RETURN_IF_ERROR(m.optimizer_step->VisitArrays(
      [&](const ShardArrays& stretch) -> Status {
        for (int i = 0; i < sections; ++i) {
          ZINF_RETURN_IF_ERROR(w.Write(kSections[i], stretch.arrays[i], stretch.count * 4));
        }
        return OkStatus();
      },
      /*write_back=*/false));
  std::vector<float> frozen;  // after the master, in flat order
  for (const Param& p : m.params) {
    if (p.trainable()) continue;
    frozen.resize(p.shard_size);
    ZINF_RETURN_IF_ERROR(m.param_tier->ReadFp32(p, frozen.data()));
    ZINF_RETURN_IF_ERROR(w.Write("params", frozen.data(), p.shard_size * 4));
  }
  const std::string blob = m.optimizer_step->SaveHyperState();
  ZINF_RETURN_IF_ERROR(w.Append("optimizer", blob.data(), blob.size()));
  if (m.rank() == 0 && !m.buffers.empty()) {  // replicated: rank 0's values speak for all
    uint64_t total = 0;
    for (const Impl::ModuleBuffer& b : m.buffers) total += b.bytes.size();
    ZINF_RETURN_IF_ERROR(w.Add("buffers", total));
    for (const Impl::ModuleBuffer& b : m.buffers) {
      ZINF_RETURN_IF_ERROR(w.Write("buffers", b.bytes.data(), b.bytes.size()));
    }
  }
  return w.Commit();
}

Status Engine::Impl::Checkpoints::WriteParamTier(Impl& m, const ShardFill& read) {
  const bool from_master = m.optimizer_step->host_master();
  if (from_master) ZINF_RETURN_IF_ERROR(m.optimizer_step->WriteParamTierFromMaster());
  std::vector<float> values;
  for (Param& p : m.params) {
    if (from_master && p.trainable()) continue;
    values.resize(p.shard_size);
    ZINF_RETURN_IF_ERROR(read(p.flat_offset, p.shard_size, values.data()));
    ZINF_RETURN_IF_ERROR(m.param_tier->WriteFp32(p, values.data()));
  }
  return m.param_tier->FinishWrites();
}

Status Engine::Impl::Checkpoints::OtherParamCount(const Impl& m, const ckpt::Manifest& manifest,
                                                  const std::string& dir) {
  std::set<std::string_view> saved_names;
  for (const ckpt::ManifestParam& saved : manifest.params) saved_names.insert(saved.name);
  std::vector<const Param*> missing;
  for (const Param& p : m.params) {
    if (saved_names.count(p.spec.name) == 0) missing.push_back(&p);
  }
  std::string which;
  if (!missing.empty()) {
    which = fmt::format(": it lacks parameter '{}' {}", missing.front()->spec.name,
                        ShapeText(missing.front()->spec.shape));
    if (missing.size() > 1) which += fmt::format(" and {} more", missing.size() - 1);
  }
  if (which.empty()) {
    for (const ckpt::ManifestParam& saved : manifest.params) {
      if (m.param_by_name.count(saved.name) == 0) {
        which = fmt::format(": it holds parameter '{}' {}, which this model lacks", saved.name,
                            ShapeText(saved.shape));
        break;
      }
    }
  }
  return FailedPrecondition(
      fmt::format("{} holds a different model: {} parameters, this one has {}{}", dir,
                  manifest.params.size(), m.params.size(), which));
}

// Note [Resharding on load]: a checkpoint saved by another number of ranks is laid out as
// that world size partitions the model; each rank reads the elements of its own shard from
// whichever saved ranks hold them, so the state it gets is bitwise the consolidated state.
// The manifest may also list the parameters in another order than this model registers
// them (`zinf ckpt import` keeps a safetensors file's order): they are matched by name,
// and the saved layout is the manifest's order partitioned for the saved world size.
StatusOr<SavedLayout> Engine::Impl::Checkpoints::MatchSavedLayout(const Impl& m,
                                                                  const ckpt::Manifest& manifest,
                                                                  const std::string& dir) {
  if (manifest.params.size() != m.params.size()) return OtherParamCount(m, manifest, dir);
  const int saved_world = manifest.world_size;
  SavedLayout layout;
  layout.index.resize(m.params.size());
  std::vector<Param> saved_layout;  // in the manifest's order
  for (size_t j = 0; j < manifest.params.size(); ++j) {
    const ckpt::ManifestParam& saved = manifest.params[j];
    auto it = m.param_by_name.find(saved.name);
    if (it == m.param_by_name.end()) {
      return FailedPrecondition(
          fmt::format("{} holds a different model: parameter '{}' {}, which this model lacks", dir,
                      saved.name, ShapeText(saved.shape)));
    }
    const Param& p = m.params[it->second];
    if (saved.shape != p.spec.shape) {
      return FailedPrecondition(
          fmt::format("{} holds a different model: parameter '{}' is {} there, {} in this model",
                      dir, saved.name, ShapeText(saved.shape), ShapeText(p.spec.shape)));
    }
    if (saved.frozen == p.trainable()) {  // Note [Frozen parameters]: no state to resume
      return FailedPrecondition(
          fmt::format("{}: parameter '{}' was {} when saved and is {} here; resume with the same "
                      "parameters frozen (requires_grad as saved)",
                      dir, saved.name, saved.frozen ? "frozen" : "trained",
                      saved.frozen ? "trained" : "frozen"));
    }
    layout.index[it->second] = j;
    layout.same_order = layout.same_order && static_cast<size_t>(it->second) == j;
    saved_layout.push_back(p);
  }
  const uint64_t saved_shard_elements = Partition(saved_layout, saved_world, m.config.zero_stage,
                                                  m.config.stage3_param_persistence_threshold);
  const uint64_t saved_elements = FlatEnd(saved_layout);
  if (manifest.shard_elements != saved_shard_elements ||
      manifest.params_elements() != saved_elements) {
    return FailedPrecondition(fmt::format(
        "{} holds a different model: {} elements per rank of {} ({} trained), this model has {} "
        "({}) at that world size",
        dir, manifest.params_elements(), saved_world, manifest.shard_elements, saved_elements,
        saved_shard_elements));
  }
  for (size_t j = 0; j < manifest.params.size(); ++j) {
    const ckpt::ManifestParam& saved = manifest.params[j];
    const Param& p = saved_layout[j];
    if (saved.flat_offset != p.flat_offset || saved.shard_size != p.shard_size) {
      return FailedPrecondition(fmt::format(
          "{} lays parameter '{}' out differently: {} elements per rank at shard offset {} "
          "there, {} at {} for {} rank(s) here",
          dir, p.spec.name, saved.shard_size, saved.flat_offset, p.shard_size, p.flat_offset,
          saved_world));
    }
  }
  return layout;
}

Status Engine::Impl::Checkpoints::CheckBuffers(const Impl& m, const ckpt::Manifest& manifest,
                                               const std::string& dir) {
  for (const Impl::ModuleBuffer& b : m.buffers) {
    auto it = std::find_if(manifest.buffers.begin(), manifest.buffers.end(),
                           [&](const ckpt::ManifestBuffer& s) { return s.name == b.name; });
    if (it == manifest.buffers.end()) {
      return FailedPrecondition(fmt::format(
          "{} holds no buffer '{}' (a checkpoint of another model, or one saved without its "
          "buffers)",
          dir, b.name));
    }
    if (it->dtype != b.dtype || it->shape != b.shape) {
      return FailedPrecondition(fmt::format("{}: buffer '{}' is {} {} there, {} {} here", dir,
                                            b.name, it->dtype, ShapeText(it->shape), b.dtype,
                                            ShapeText(b.shape)));
    }
  }
  for (const ckpt::ManifestBuffer& s : manifest.buffers) {
    if (std::none_of(m.buffers.begin(), m.buffers.end(),
                     [&](const Impl::ModuleBuffer& b) { return b.name == s.name; })) {
      return FailedPrecondition(
          fmt::format("{} holds buffer '{}', which this model does not have", dir, s.name));
    }
  }
  return OkStatus();
}

StatusOr<std::string> Engine::Impl::Checkpoints::LoadShardFile(Impl& m, const std::string& path) {
  ZINF_ASSIGN_OR_RETURN(const std::string dir, ckpt::ResolveCheckpoint(path));
  ZINF_ASSIGN_OR_RETURN(const ckpt::Manifest manifest, ckpt::ReadManifest(dir));
  ZINF_ASSIGN_OR_RETURN(SavedLayout layout, MatchSavedLayout(m, manifest, dir));
  ZINF_ASSIGN_OR_RETURN(const SavedScalars scalars, ParseScalarState(manifest.engine_state, dir));
  const int state_count = m.optimizer_step->state_count();
  if (scalars.optimizer != OptimizerTypeName(m.config.optimizer.type) ||
      scalars.state_count != state_count) {
    return FailedPrecondition(fmt::format("{} was saved with optimizer '{}', this run uses '{}'",
                                          dir, scalars.optimizer,
                                          OptimizerTypeName(m.config.optimizer.type)));
  }
  ZINF_RETURN_IF_ERROR(CheckBuffers(m, manifest, dir));
  ZINF_ASSIGN_OR_RETURN(const std::string saved_buffers, ReadSavedBuffers(manifest, dir));
  const int sections = 1 + state_count;
  ZINF_ASSIGN_OR_RETURN(
      const SavedShards shards,
      SavedShards::Open(m.params, m.rank(), m.world(), manifest, dir, std::move(layout), sections));

  // Verified: replace the state, once no gather reads it.
  m.param_tier->DropAll();
  ZINF_RETURN_IF_ERROR(m.optimizer_step->LoadHyperState(shards.optimizer(), scalars.steps));
  ZINF_RETURN_IF_ERROR(m.optimizer_step->VisitArrays(
      [&](const ShardArrays& stretch) -> Status {
        for (int i = 0; i < sections; ++i) {
          ZINF_RETURN_IF_ERROR(
              shards.Read(kSections[i], stretch.offset, stretch.count, stretch.arrays[i]));
        }
        return OkStatus();
      },
      /*write_back=*/true));
  ZINF_RETURN_IF_ERROR(WriteParamTier(m, [&](uint64_t begin, uint64_t count, float* out) {
    return shards.Read("params", begin, count, out);
  }));
  m.scaler.scale = scalars.loss_scale;
  m.scaler.hysteresis_left = scalars.hysteresis_left;
  m.scaler.iteration = scalars.iteration;
  m.scaler.last_overflow_iteration = scalars.last_overflow_iteration;
  ZINF_RETURN_IF_ERROR(m.FinishReductions());  // reductions of a batch the load abandons
  for (size_t i = 0; i < m.params.size(); ++i) m.FreeGradient(static_cast<int>(i));
  m.optimizer_step->EndBatch();
  for (Module& module : m.modules) module.reductions = 0;
  uint64_t at = 0;
  for (const ckpt::ManifestBuffer& s : manifest.buffers) {
    for (Impl::ModuleBuffer& b : m.buffers) {
      if (b.name == s.name) b.bytes.assign(saved_buffers, at, s.bytes);
    }
    at += s.bytes;
  }
  m.checkpoint_metadata = manifest.metadata;
  return manifest.client_state;
}

Status Engine::Impl::Checkpoints::LoadSafetensorsFile(Impl& m, const std::string& path) {
  ZINF_ASSIGN_OR_RETURN(const ckpt::SafetensorsReader file, ckpt::SafetensorsReader::Open(path));
  const std::vector<Param>& params = m.params;
  // Every parameter's tensor, by name, and nothing else in the file: a file of another model
  // (or another naming) is refused before any weight is replaced.
  std::vector<const ckpt::SafetensorsTensor*> source(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& spec = params[i].spec;
    source[i] = file.Find(spec.name);
    if (source[i] == nullptr) {
      return InvalidArgument(fmt::format(
          "{} has no tensor '{}' (the model's parameter of shape {}); it has {} tensor(s){}{}",
          path, spec.name, ShapeText(spec.shape), file.tensors().size(),
          file.tensors().empty() ? "" : ", the first '",
          file.tensors().empty() ? "" : file.tensors()[0].name + "'"));
    }
    if (!source[i]->is_float) {
      return InvalidArgument(fmt::format(
          "{}: tensor '{}' has dtype '{}'; parameters load from F32, BF16 or F16 tensors", path,
          spec.name, source[i]->type));
    }
    if (source[i]->shape != spec.shape) {
      return InvalidArgument(fmt::format("{}: tensor '{}' has shape {}, the model's parameter {}",
                                         path, spec.name, ShapeText(source[i]->shape),
                                         ShapeText(spec.shape)));
    }
  }
  if (file.tensors().size() != params.size()) {
    std::string extra;
    int shown = 0;
    for (const ckpt::SafetensorsTensor& t : file.tensors()) {
      if (m.param_by_name.count(t.name) != 0) continue;
      if (shown++ < 5) extra += (extra.empty() ? "'" : ", '") + t.name + "'";
    }
    return InvalidArgument(
        fmt::format("{} has {} tensor(s) that are not parameters of this model: {}{}", path, shown,
                    extra, shown > 5 ? ", ..." : ""));
  }

  // Elements [begin, begin + count) of this rank's flat shard, from the file.
  auto read = [&](uint64_t begin, uint64_t count, float* out) -> Status {
    return FillShard(params, m.rank(), begin, count, out,
                     [&](const Param& p, uint64_t first, uint64_t n, float* values) {
                       return file.ReadFp32(*source[&p - params.data()], first, n, values);
                     });
  };

  // As LoadShardFile replaces the parameters, leaving the optimizer state and step counts.
  m.param_tier->DropAll();
  ZINF_RETURN_IF_ERROR(m.optimizer_step->LoadMaster(read));
  return WriteParamTier(m, read);
}
Status Engine::LoadSafetensors(const std::string& path) {
  Impl& m = *impl_;
  if (!m.initialized) return FailedPrecondition("LoadSafetensors before Initialize");
  ZINF_RETURN_IF_ERROR(m.optimizer_step->Quiesce("LoadSafetensors"));
  return m.AgreeAll(Impl::Checkpoints::LoadSafetensorsFile(m, path),
                    "loading weights from " + path);
}

Status Engine::SaveCheckpoint(const std::string& dir, const std::string& tag,
                              const std::string& client_state) {
  Impl& m = *impl_;
  if (!m.initialized) return FailedPrecondition("SaveCheckpoint before Initialize");
  ZINF_RETURN_IF_ERROR(m.optimizer_step->Quiesce("SaveCheckpoint"));
  ZINF_RETURN_IF_ERROR(ckpt::CheckTag(tag));
  ZINF_ASSIGN_OR_RETURN(const nlohmann::json client, ParseJson(client_state, "client_state"));
  if (!client.is_object()) {
    return InvalidArgument(
        fmt::format("client_state must be a JSON object, got {}", DescribeJson(client)));
  }
  for (const Module& module : m.modules) {
    if (module.reductions != 0) {
      return FailedPrecondition(fmt::format(
          "SaveCheckpoint with gradients pending (module '{}' has {} micro-batch(es)); save "
          "between steps",
          module.name, module.reductions));
    }
  }
  namespace fs = std::filesystem;
  const std::string tag_dir = dir + "/" + tag;
  auto latest = ckpt::ResolveCheckpoint(dir);
  if (latest.ok() && fs::path(*latest).filename() == tag) {
    return FailedPrecondition(fmt::format(
        "checkpoint '{}' is the latest in {} already; save under another tag", tag, dir));
  }
  // Rank 0 clears what an interrupted save of this tag left, before anyone writes.
  Status prepared;
  std::error_code ec;
  if (m.rank() == 0) fs::remove_all(tag_dir, ec);
  fs::create_directories(tag_dir, ec);
  if (ec) prepared = IoError(fmt::format("creating {}: {}", tag_dir, ec.message()));
  Status saved = m.AgreeAll(std::move(prepared), "preparing checkpoint " + tag_dir);
  if (saved.ok()) {
    if (m.rank() != 0) fs::create_directories(tag_dir, ec);  // rank 0 may have just removed it
    saved = m.AgreeAll(Impl::Checkpoints::WriteShardFile(m, tag_dir, tag),
                       "writing checkpoint " + tag_dir);
  }
  if (saved.ok()) {
    Status committed;
    if (m.rank() == 0) {
      committed =
          ckpt::WriteManifest(tag_dir, Impl::Checkpoints::MakeManifest(m, tag, client.dump()));
      if (committed.ok()) committed = ckpt::CommitLatest(dir, tag);
    }
    saved = m.AgreeAll(std::move(committed), "committing checkpoint " + tag_dir);
  }
  // Nothing half-written stays behind, not even the empty directory (a peer lost as the save
  // began or during it, a full disk): the previous checkpoint is still `latest`, and this tag,
  // without its manifest, never will be.
  if (!saved.ok()) ckpt::RemoveUncommittedShard(tag_dir, m.rank());
  return saved;
}

Status Engine::SetBuffer(const std::string& name, const std::string& dtype,
                         const std::vector<int64_t>& shape, const void* data, uint64_t bytes) {
  Impl& m = *impl_;
  if (name.empty()) return InvalidArgument("SetBuffer: the buffer name is empty");
  if (m.param_by_name.count(name) != 0) {
    return InvalidArgument(fmt::format("SetBuffer: '{}' is a parameter's name", name));
  }
  const uint64_t element = ckpt::BufferDtypeBytes(dtype);
  if (element == 0) {
    return InvalidArgument(fmt::format(
        "SetBuffer '{}': dtype \"{}\" is not one of F32, F64, F16, BF16, I64, I32, I16, I8, "
        "U8, BOOL",
        name, dtype));
  }
  uint64_t expected = element;
  for (int64_t dim : shape) {
    if (dim < 0 || __builtin_mul_overflow(expected, static_cast<uint64_t>(dim), &expected)) {
      return InvalidArgument(
          fmt::format("SetBuffer '{}': shape {} is negative or too large", name, ShapeText(shape)));
    }
  }
  if (bytes != expected || (bytes > 0 && data == nullptr)) {
    return InvalidArgument(fmt::format("SetBuffer '{}': {} {} is {} bytes, got {}{}", name, dtype,
                                       ShapeText(shape), expected, bytes,
                                       data == nullptr ? " at a null pointer" : ""));
  }
  auto it = std::find_if(m.buffers.begin(), m.buffers.end(),
                         [&](const Impl::ModuleBuffer& b) { return b.name == name; });
  if (it == m.buffers.end()) {
    m.buffers.push_back({name, dtype, shape, {}});
    it = m.buffers.end() - 1;
  } else if (it->dtype != dtype || it->shape != shape) {
    return InvalidArgument(fmt::format("SetBuffer '{}': it is {} {}, got {} {}", name, it->dtype,
                                       ShapeText(it->shape), dtype, ShapeText(shape)));
  }
  it->bytes.assign(static_cast<const char*>(data), bytes);
  return OkStatus();
}

Status Engine::SetCheckpointMetadata(const std::string& json_object) {
  ZINF_ASSIGN_OR_RETURN(const nlohmann::json j, ParseJson(json_object, "checkpoint metadata"));
  if (!j.is_object()) {
    return InvalidArgument(
        fmt::format("checkpoint metadata must be a JSON object, got {}", DescribeJson(j)));
  }
  impl_->checkpoint_metadata = j.dump();
  return OkStatus();
}

const std::string& Engine::checkpoint_metadata() const { return impl_->checkpoint_metadata; }

Status Engine::GetBuffer(const std::string& name, void* out, uint64_t bytes) const {
  const Impl& m = *impl_;
  auto it = std::find_if(m.buffers.begin(), m.buffers.end(),
                         [&](const Impl::ModuleBuffer& b) { return b.name == name; });
  if (it == m.buffers.end()) {
    return InvalidArgument(fmt::format("GetBuffer: no buffer '{}' was set", name));
  }
  if (bytes != it->bytes.size() || (bytes > 0 && out == nullptr)) {
    return InvalidArgument(fmt::format("GetBuffer '{}': it is {} bytes, the output {}", name,
                                       it->bytes.size(), bytes));
  }
  std::memcpy(out, it->bytes.data(), bytes);
  return OkStatus();
}

StatusOr<std::string> Engine::LoadCheckpoint(const std::string& dir) {
  Impl& m = *impl_;
  if (!m.initialized) return FailedPrecondition("LoadCheckpoint before Initialize");
  ZINF_RETURN_IF_ERROR(m.optimizer_step->Quiesce("LoadCheckpoint"));
  StatusOr<std::string> client = Impl::Checkpoints::LoadShardFile(m, dir);
  ZINF_RETURN_IF_ERROR(m.AgreeAll(client.status(), "loading checkpoint " + dir));
  return client;
}

}  // namespace zinf
