// `zinf ckpt export DIR --out FILE.safetensors [--dtype fp32|bf16|fp16]`: consolidates a
// checkpoint written by any number of ranks into one safetensors file, one parameter in
// memory at a time.
//
// `zinf ckpt export DIR --hf OUT [--hf-config config.json] [--dtype ...] [--max-shard-size 5GB]`:
// the same as a Hugging Face model directory that from_pretrained(OUT) loads (config.json,
// model.safetensors or shards with their index; src/ckpt/hf.h): names, layouts and config
// as src/ckpt/hf_layout.h maps them.
//
// `zinf ckpt import PATH --out DIR [--config CONFIG.json]`: the other way, a checkpoint at step
// 0 holding the weights of PATH, a safetensors file or a Hugging Face checkpoint directory
// (config.json with model.safetensors or a sharded model.safetensors.index.json), with fresh
// optimizer state, that a trainer resumes from at any world size (`train_gpt --resume DIR`,
// zinf.zero's load_checkpoint). The floating-point tensors (F32, BF16, F16) are the
// parameters, in the files' order (the engine matches them by name on load); the others
// (I64 counters, masks) are module buffers; a directory's config.json goes into the
// checkpoint's metadata, so that `export --hf` writes it back. The optimizer and loss scaling
// are the config's (DeepSpeed JSON; a top-level "model" object,
// as train_gpt's configs carry, is skipped; its placement and batch size do not matter to a
// checkpoint and are not used), else DeepSpeed's defaults (AdamW, no fp16): the checkpoint
// names its optimizer, and a trainer with another refuses it. The import runs one engine,
// with everything in host memory (about 16 bytes per parameter) or, with --nvme-path DIR,
// with parameters and optimizer state in swap files there (host memory: the largest tensor
// and the NVMe step's staging buffers).
#include <fmt/core.h>

#include <exception>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "ckpt/checkpoint.h"
#include "ckpt/hf.h"
#include "ckpt/safetensors.h"
#include "tools/commands.h"
#include "tools/trainer_config.h"
#include "zinf/engine.h"
#include "zinf/input_file.h"

namespace zinf::tools {
namespace {

struct ExportArgs {
  std::string dir;
  std::string out;
  std::string hf_dir;
  std::string hf_config;
  std::string dtype;  // empty: fp32, or for --hf the config's
  std::string max_shard_size = "5GB";
};

ElementType DtypeOf(const std::string& name) {
  return name == "bf16"   ? ElementType::kBf16
         : name == "fp16" ? ElementType::kFp16
                          : ElementType::kFp32;
}

Status Export(const ExportArgs& args) {
  if (args.hf_dir.empty()) {
    if (!args.hf_config.empty()) return InvalidArgument("--hf-config goes with --hf");
    return ckpt::ExportSafetensors(args.dir, args.out, DtypeOf(args.dtype));
  }
  ckpt::HfExportOptions options;
  options.config_file = args.hf_config;
  options.dtype_set = !args.dtype.empty();
  options.dtype = DtypeOf(args.dtype);
  ZINF_ASSIGN_OR_RETURN(options.max_shard_bytes, ckpt::ParseShardSize(args.max_shard_size));
  return ckpt::ExportHf(args.dir, args.hf_dir, options);
}

struct ImportArgs {
  std::string file;
  std::string out;
  std::string config;
  std::string tag = "imported";
  std::string nvme_path;  // empty: host memory
  bool replace = false;   // --replace: DIR may hold a checkpoint, which the import deletes
};

// Saving into a directory keeps only its newest checkpoint (ckpt::CommitLatest), so importing
// into one that holds a checkpoint would delete it: refused unless --replace says so.
Status CheckOutHoldsNoCheckpoint(const ImportArgs& args) {
  if (args.replace) return OkStatus();
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string found;
  if (fs::exists(fs::path(args.out) / "latest", ec)) found = args.out + "/latest";
  for (fs::directory_iterator it(args.out, ec), end; found.empty() && !ec && it != end;
       it.increment(ec)) {
    std::error_code entry_ec;
    if (it->path().filename() != args.tag &&
        fs::is_regular_file(it->path() / "manifest.json", entry_ec)) {
      found = it->path().string();
    }
  }
  if (found.empty()) return OkStatus();
  return FailedPrecondition(fmt::format(
      "--out {} holds a checkpoint ({}), which importing there would delete: give another "
      "--out, or --replace to delete it",
      args.out, found));
}

StatusOr<EngineConfig> ImportConfig(const std::string& path, const std::string& nvme_path) {
  EngineConfig config;
  if (!path.empty()) {
    ZINF_ASSIGN_OR_RETURN(const std::string text, ReadInputFile(path, "--config"));
    ZINF_ASSIGN_OR_RETURN(config, EngineConfigOfTrainerConfig(text, "--config " + path));
  }
  // One process, in host memory or on the given NVMe path: where a trainer keeps its state
  // is its own business, and the checkpoint's layout does not depend on it.
  const bool nvme = !nvme_path.empty();
  config.offload_param_device = nvme ? OffloadDevice::kNvme : OffloadDevice::kNone;
  config.offload_optimizer_device = nvme ? OffloadDevice::kNvme : OffloadDevice::kCpu;
  config.offload_param_nvme_path.clear();
  config.offload_optimizer_nvme_path.clear();
  if (nvme) {
    config.offload_param_nvme_path = {nvme_path};
    config.offload_optimizer_nvme_path = {nvme_path};
  }
  config.train_batch_size = 0;
  config.micro_batch_size_set = false;
  config.gradient_accumulation_steps_set = false;
  return config;
}

Status Import(const ImportArgs& args) {
  ZINF_RETURN_IF_ERROR(ckpt::CheckTag(args.tag));
  ZINF_RETURN_IF_ERROR(CheckOutHoldsNoCheckpoint(args));
  ZINF_ASSIGN_OR_RETURN(const EngineConfig config, ImportConfig(args.config, args.nvme_path));
  ZINF_ASSIGN_OR_RETURN(const ckpt::WeightFiles weights, ckpt::WeightFiles::Open(args.file));
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                        Engine::Create(config, {.device = "host", .rank = 0, .world_size = 1}));
  // Floating-point tensors are the parameters, one module each (zeros: every value is
  // replaced); the others (num_batches_tracked, masks) are module buffers, kept as they are.
  for (const auto& [file, t] : weights.tensors()) {
    if (!t->is_float) continue;
    ZINF_RETURN_IF_ERROR(
        engine->RegisterModule(t->name, {{t->name, t->shape, ParamInit::kZeros}}).status());
  }
  ZINF_RETURN_IF_ERROR(engine->Initialize());
  std::vector<float> values;
  std::vector<char> bytes;
  for (const auto& [file, t] : weights.tensors()) {
    if (t->is_float) {
      values.resize(t->numel);
      ZINF_RETURN_IF_ERROR(file->ReadFp32(*t, values.data()));
      ZINF_RETURN_IF_ERROR(engine->SetParameter(t->name, values.data(), t->numel));
    } else {
      bytes.resize(t->end - t->begin);
      ZINF_RETURN_IF_ERROR(file->ReadBytes(*t, bytes.data()));
      ZINF_RETURN_IF_ERROR(
          engine->SetBuffer(t->name, t->type, t->shape, bytes.data(), bytes.size()));
    }
  }
  if (!weights.config_json().empty()) {
    // So that `zinf ckpt export --hf` writes the model back with its own config.
    ZINF_RETURN_IF_ERROR(
        engine->SetCheckpointMetadata("{\"hf_config\": " + weights.config_json() + "}"));
  }
  return engine->SaveCheckpoint(args.out, args.tag, "{}");
}

}  // namespace

void AddCkptCommands(CLI::App& app) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "Work with zinf checkpoints");
  ckpt->require_subcommand(1);
  auto args = std::make_shared<ExportArgs>();
  CLI::App* cmd = ckpt->add_subcommand(
      "export",
      "Consolidate a checkpoint's shards (any world size) into one safetensors file (--out) or "
      "a Hugging Face model directory (--hf)");
  cmd->add_option("dir", args->dir, "Checkpoint directory (as given to --save, or a tag in it)")
      ->required();
  CLI::Option* out = cmd->add_option("--out", args->out, "Output .safetensors file");
  CLI::Option* hf =
      cmd->add_option("--hf", args->hf_dir,
                      "Output Hugging Face model directory (absent or empty): config.json and "
                      "model.safetensors, as save_pretrained writes them");
  out->excludes(hf);
  cmd->add_option("--hf-config", args->hf_config,
                  "With --hf: the model's config.json (default: the one the checkpoint carries)");
  cmd->add_option("--dtype", args->dtype,
                  "Parameter type in the files (default: fp32; with --hf the config's torch_dtype)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  cmd->add_option("--max-shard-size", args->max_shard_size,
                  "With --hf: shard the weights above this size (5GB, 500MB, 2GiB, bytes), as "
                  "save_pretrained's max_shard_size")
      ->capture_default_str();
  cmd->callback([args] {
    if (args->out.empty() == args->hf_dir.empty()) {
      Report("zinf ckpt export", InvalidArgument("give one of --out FILE or --hf DIR"));
      return;
    }
    Status s;
    // The exports return every error as a Status; this is the boundary's last resort, so
    // that nothing escapes to abort the process.
    try {
      s = Export(*args);
    } catch (const std::exception& e) {
      s = Internal(fmt::format("exporting {}: unexpected exception: {}", args->dir, e.what()));
    }
    if (!Report("zinf ckpt export", s)) return;
    fmt::print("wrote {}\n", args->out.empty() ? args->hf_dir : args->out);
  });

  auto import_args = std::make_shared<ImportArgs>();
  CLI::App* import = ckpt->add_subcommand(
      "import",
      "Make a checkpoint at step 0 from a safetensors file or a Hugging Face checkpoint "
      "directory");
  import
      ->add_option("file", import_args->file,
                   "Input .safetensors file, or a Hugging Face model directory (config.json "
                   "and model.safetensors or model.safetensors.index.json)")
      ->required();
  import->add_option("--out", import_args->out, "Checkpoint directory to write (as --save takes)")
      ->required();
  import->add_option("--config", import_args->config,
                     "The trainer's DeepSpeed config: its optimizer and fp16 settings go into the "
                     "checkpoint (default: AdamW, no fp16)");
  import->add_option("--nvme-path", import_args->nvme_path,
                     "Keep parameters and optimizer state in swap files in this directory while "
                     "importing, instead of host memory (for models larger than it)");
  import->add_option("--tag", import_args->tag, "The checkpoint's tag in DIR")
      ->capture_default_str();
  import->add_flag("--replace", import_args->replace,
                   "DIR may hold a checkpoint already: delete it (refused without this flag)");
  import->callback([import_args] {
    Status s;
  try {
    s = Import(*import_args);
  } catch (const std::exception& e) {
    s = Internal(
        fmt::format("importing {}: unexpected exception: {}", import_args->file, e.what()));
  }
  if (!Report("zinf ckpt import", s)) return;
  fmt::print("wrote {}/{}\n", import_args->out, import_args->tag);
});
}  // namespace zinf::tools

}  // namespace zinf::tools
