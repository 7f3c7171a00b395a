// How the GPT example reads JSON: the one place it parses any (its config file, the "model"
// section, --set values, a checkpoint's client_state). Text is refused before parsing when it
// nests deeper than zinf::kMaxJsonDepth, and files are read through zinf::ReadInputFile, so
// no input crashes or exhausts the trainer (Note [Bounded input] in src/core/input_file.cc;
// examples use public headers only, so this is their own copy of zinf's internal ParseJson).
#ifndef ZINF_EXAMPLES_GPT_JSON_INPUT_H_
#define ZINF_EXAMPLES_GPT_JSON_INPUT_H_

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "zinf/status.h"

namespace gpt {

// The parsed value, or InvalidArgument naming `source`: too deep, or not JSON. Never throws.
zinf::StatusOr<nlohmann::json> ParseJson(std::string_view text, std::string_view source);

// A value for an error message without dumping a container (which may be huge): a scalar's
// JSON cut at 60 characters, or "array of N" / "object of N". Never throws.
std::string DescribeJson(const nlohmann::json& value);

}  // namespace gpt

#endif  // ZINF_EXAMPLES_GPT_JSON_INPUT_H_
