// libFuzzer target: a DeepSpeed JSON config as a user (or a typo) writes it, through the whole
// reader the engine uses. Any input must give a config or a Status; a crash, a hang, an
// exception or undefined behaviour is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "zinf/engine.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  zinf::StatusOr<zinf::EngineConfig> config = zinf::EngineConfig::FromJson(text);
  if (config.ok()) (void)config->Validate();
  return 0;
}
