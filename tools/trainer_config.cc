// See trainer_config.h.
#include "tools/trainer_config.h"

#include <fmt/core.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/config_reader.h"

namespace zinf::tools {

StatusOr<EngineConfig> EngineConfigOfTrainerConfig(std::string_view text, std::string_view source) {
  ZINF_ASSIGN_OR_RETURN(nlohmann::json json, ParseJson(text, source));
  if (!json.is_object()) {
    return InvalidArgument(fmt::format("{}: not a JSON object but {}", source, DescribeJson(json)));
  }
  json.erase("model");
  StatusOr<EngineConfig> config = EngineConfig::FromJson(json.dump());
  if (!config.ok()) return config.status().WithContext(source);
  return config;
}

}  // namespace zinf::tools
