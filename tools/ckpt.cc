// `zinf ckpt export DIR --out FILE.safetensors [--dtype fp32|bf16]`: consolidates a checkpoint
// written by any number of ranks into one safetensors file, one parameter in memory at a time.
#include <fmt/core.h>

#include <exception>
#include <memory>
#include <string>

#include "ckpt/checkpoint.h"
#include "tools/commands.h"

namespace zinf::tools {
namespace {

struct ExportArgs {
  std::string dir;
  std::string out;
  std::string dtype = "fp32";
};

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
    if (!s.ok()) {
      fmt::print(stderr, "zinf ckpt export: {}\n", s.ToString());
      ExitCode() = 1;
      return;
    }
    fmt::print("wrote {}\n", args->out);
  });
}

}  // namespace zinf::tools
