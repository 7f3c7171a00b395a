// libFuzzer target: a safetensors header, edited, truncated or hostile, through the parser
// that Engine::LoadSafetensors and `zinf ckpt import` use. The input's first 8 bytes are the
// data section's size (little endian), the rest the header's JSON. Any input must give
// tensors that lie within the data without overlapping, each spanning exactly its shape's
// bytes, or a Status; a crash, an exception, a huge allocation or undefined behaviour is a bug.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "ckpt/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t data_bytes = 0;
  std::memcpy(&data_bytes, data, 8);
  const std::string_view json(reinterpret_cast<const char*>(data) + 8, size - 8);
  auto tensors = zinf::ckpt::ParseSafetensorsHeader(json, data_bytes, "fuzz");
  if (!tensors.ok()) {
    if (tensors.status().code() == zinf::StatusCode::kInternal) std::abort();
    return 0;
  }
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const zinf::ckpt::SafetensorsTensor& t : *tensors) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0 || __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) std::abort();
    }
    if (numel != t.numel || t.begin > t.end || t.end > data_bytes ||
        t.end - t.begin != numel * t.element_bytes) {
      std::abort();
    }
    if (t.end > t.begin) spans.emplace_back(t.begin, t.end);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first < spans[i - 1].second) std::abort();
  }
  return 0;
}
