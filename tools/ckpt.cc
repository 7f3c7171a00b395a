// `zinf ckpt export DIR --out FILE.safetensors [--dtype fp32|bf16]`: consolidates a checkpoint
// written by any number of ranks into one safetensors file, one parameter in memory at a time.
//
// `zinf ckpt import FILE.safetensors --out DIR [--config CONFIG.json]`: the other way, a
// checkpoint at step 0 holding the file's weights (F32, BF16 or F16), with fresh optimizer
// state, that a trainer resumes from at any world size (`train_gpt --resume DIR`). The
// parameters are the file's tensors, in its order (the engine matches them by name on load).
// The optimizer and loss scaling are the config's (DeepSpeed JSON; a top-level "model" object,
// as train_gpt's configs carry, is skipped; its placement and batch size do not matter to a
// checkpoint and are not used), else DeepSpeed's defaults (AdamW, no fp16): the checkpoint
// names its optimizer, and a trainer with another refuses it. The import runs one engine,
// with everything in host memory (about 16 bytes per parameter) or, with --nvme-path DIR,
// with parameters and optimizer state in swap files there (host memory: the largest tensor
// and the NVMe step's staging buffers).
#include <fmt/core.h>

#include <exception>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "ckpt/checkpoint.h"
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
  std::string dtype = "fp32";
};

struct ImportArgs {
  std::string file;
  std::string out;
  std::string config;
  std::string tag = "imported";
  std::string nvme_path;  // empty: host memory
};

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
  ZINF_ASSIGN_OR_RETURN(const EngineConfig config, ImportConfig(args.config, args.nvme_path));
  ZINF_ASSIGN_OR_RETURN(const ckpt::SafetensorsReader file,
                        ckpt::SafetensorsReader::Open(args.file));
  if (file.tensors().empty()) return InvalidArgument(args.file + " holds no tensors");
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                        Engine::Create(config, {.device = "host", .rank = 0, .world_size = 1}));
  // One module per tensor; zeros, since every value is replaced.
  for (const ckpt::SafetensorsTensor& t : file.tensors()) {
    ZINF_RETURN_IF_ERROR(
        engine->RegisterModule(t.name, {{t.name, t.shape, ParamInit::kZeros}}).status());
  }
  ZINF_RETURN_IF_ERROR(engine->Initialize());
  ZINF_RETURN_IF_ERROR(engine->LoadSafetensors(args.file));
  return engine->SaveCheckpoint(args.out, args.tag, "{}");
}

}  // namespace

void AddCkptCommands(CLI::App& app) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "Work with zinf checkpoints");
  ckpt->require_subcommand(1);
  auto args = std::make_shared<ExportArgs>();
  CLI::App* cmd = ckpt->add_subcommand(
      "export", "Consolidate a checkpoint's shards (any world size) into one safetensors file");
  cmd->add_option("dir", args->dir, "Checkpoint directory (as given to --save, or a tag in it)")
      ->required();
  cmd->add_option("--out", args->out, "Output .safetensors file")->required();
  cmd->add_option("--dtype", args->dtype, "Tensor type in the file")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->callback([args] {
    Status s;
    // ExportSafetensors returns every error as a Status; this is the boundary's last resort,
    // so that nothing escapes to abort the process.
    try {
      s = ckpt::ExportSafetensors(args->dir, args->out,
                                  args->dtype == "bf16" ? ElementType::kBf16 : ElementType::kFp32);
    } catch (const std::exception& e) {
      s = Internal(fmt::format("exporting {}: unexpected exception: {}", args->dir, e.what()));
    }
    if (!Report("zinf ckpt export", s)) return;
    fmt::print("wrote {}\n", args->out);
  });

  auto import_args = std::make_shared<ImportArgs>();
  CLI::App* import = ckpt->add_subcommand(
      "import", "Make a checkpoint at step 0 from a safetensors file's weights (F32, BF16, F16)");
  import->add_option("file", import_args->file, "Input .safetensors file")->required();
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
