// libFuzzer target: a checkpoint's manifest.json, edited, truncated or hostile, through the
// parser that the engine's resume and `zinf ckpt export` use. Any input must give a Manifest
// that passes ValidateManifest, or a Status; a crash, an exception, a huge allocation or
// undefined behaviour is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "ckpt/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  zinf::StatusOr<zinf::ckpt::Manifest> manifest = zinf::ckpt::ParseManifest(text, "fuzz");
  if (manifest.ok()) {
    // What the parser accepts, the writer must take back unchanged.
    if (!zinf::ckpt::ValidateManifest(*manifest).ok()) std::abort();
    zinf::StatusOr<std::string> again = zinf::ckpt::SerializeManifest(*manifest);
    if (!again.ok() || !zinf::ckpt::ParseManifest(*again, "fuzz again").ok()) std::abort();
  }
  return 0;
}
