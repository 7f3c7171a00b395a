// A trainer's config file as the tools read it: DeepSpeed's keys for the engine, beside the
// trainer's own "model" section (train_gpt's convention), which the engine does not read.
//
// Thread-safety: reentrant.
#ifndef ZINF_TOOLS_TRAINER_CONFIG_H_
#define ZINF_TOOLS_TRAINER_CONFIG_H_

#include <string_view>

#include "zinf/engine.h"
#include "zinf/status.h"

namespace zinf::tools {

// The EngineConfig of a config file's text, its "model" section set aside (the entry point
// for fuzzing `zinf ckpt import --config`). InvalidArgument naming `source` and the key for
// text that is not a JSON object, too deep, or a bad config. Never throws.
StatusOr<EngineConfig> EngineConfigOfTrainerConfig(std::string_view text, std::string_view source);

}  // namespace zinf::tools

#endif  // ZINF_TOOLS_TRAINER_CONFIG_H_
