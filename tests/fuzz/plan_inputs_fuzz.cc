// libFuzzer target: the files `zinf plan` reads, hostile or damaged. The first byte picks the
// reader, by its value modulo 3: 0, `--model` (a trainer's config, through
// plan::ModelFromConfigText); 1, `--profile` (plan::MachineProfile::FromJson); 2, `--hardware`
// (plan::NodeHardware::FromJson). The rest is the file's text. Any input must give a model, a
// profile, a node or a Status; a crash, an exception or undefined behaviour is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "tools/plan_hardware.h"
#include "tools/plan_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  zinf::Status status;
  switch (data[0] % 3) {
    case 0:
      status = zinf::plan::ModelFromConfigText(text, "fuzz", 4, 128).status();
      break;
    case 1:
      status = zinf::plan::MachineProfile::FromJson(text, "fuzz").status();
      break;
    default:
      status = zinf::plan::NodeHardware::FromJson(text, "fuzz").status();
      break;
  }
  if (status.code() == zinf::StatusCode::kInternal) std::abort();
  return 0;
}
