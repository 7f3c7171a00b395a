// libFuzzer target: the config `zinf ckpt import --config FILE` reads (a trainer's config,
// its "model" section set aside), through tools::EngineConfigOfTrainerConfig. Any input must
// give a config that passes its own Validate() or a Status.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "tools/trainer_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = zinf::tools::EngineConfigOfTrainerConfig(text, "fuzz");
  if (!config.ok()) {
    if (config.status().code() == zinf::StatusCode::kInternal) std::abort();
    return 0;
  }
  if (!config->Validate().ok()) std::abort();
  return 0;
}
