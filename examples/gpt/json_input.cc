// See json_input.h.
#include "examples/gpt/json_input.h"

#include <exception>
#include <string>

#include "zinf/input_file.h"

namespace gpt {

zinf::StatusOr<nlohmann::json> ParseJson(std::string_view text, std::string_view source) {
  if (zinf::Status s = zinf::CheckJsonDepth(text, source); !s.ok()) return s;
  try {
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return zinf::InvalidArgument(std::string(source) + ": not valid JSON");
    return j;
  } catch (const std::exception& e) {  // bad_alloc on a huge document
    return zinf::ResourceExhausted(std::string("parsing ") + std::string(source) + ": " + e.what());
  }
}

std::string DescribeJson(const nlohmann::json& value) {
  if (value.is_array() || value.is_object()) {
    return std::string(value.type_name()) + " of " + std::to_string(value.size());
  }
  std::string text = value.is_string()
                         ? nlohmann::json(value.get_ref<const std::string&>().substr(0, 64))
                               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                         : value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

}  // namespace gpt
