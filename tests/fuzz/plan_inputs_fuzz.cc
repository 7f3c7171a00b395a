// libFuzzer target: the files `zinf plan` reads, hostile or damaged. The first byte picks the
// reader: even, `--model` (a trainer's config, through plan::ModelFromConfigText); odd,
// `--profile` (plan::MachineProfile::FromJson). The rest is the file's text. Any input must
// give a model, a profile or a Status; a crash, an exception or undefined behaviour is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "tools/plan_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  zinf::Status status;
  if (data[0] % 2 == 0) {
    status = zinf::plan::ModelFromConfigText(text, "fuzz", 4, 128).status();
  } else {
    status = zinf::plan::MachineProfile::FromJson(text, "fuzz").status();
  }
  if (status.code() == zinf::StatusCode::kInternal) std::abort();
  return 0;
}
