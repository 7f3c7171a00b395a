#include "core/units.h"

#include <fmt/core.h>

#include <cctype>
#include <charconv>
#include <cmath>

namespace zinf {

StatusOr<uint64_t> ParseBytes(std::string_view text) {
  auto bad = [&] {
    return InvalidArgument(
        fmt::format("'{}' is not a byte size (expected e.g. 4096, 512K, 64MiB, 4G, 1.5GB)", text));
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) return bad();
  double number = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + i, number);
  if (ec != std::errc() || ptr != text.data() + i || !(number >= 0)) return bad();
  std::string_view suffix = text.substr(i);
  while (!suffix.empty() && suffix.front() == ' ') suffix.remove_prefix(1);
  std::string s;
  for (char c : suffix) s += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double scale = 1;
  if (s.empty() || s == "B")
    scale = 1;
  else if (s == "K" || s == "KIB")
    scale = 1024.0;
  else if (s == "M" || s == "MIB")
    scale = 1024.0 * 1024;
  else if (s == "G" || s == "GIB")
    scale = 1024.0 * 1024 * 1024;
  else if (s == "T" || s == "TIB")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else if (s == "KB")
    scale = 1e3;
  else if (s == "MB")
    scale = 1e6;
  else if (s == "GB")
    scale = 1e9;
  else if (s == "TB")
    scale = 1e12;
  else
    return bad();
  const double bytes = number * scale;
  if (bytes > 1.8e19 || bytes != std::floor(bytes)) return bad();
  return static_cast<uint64_t>(bytes);
}

std::string FormatBytes(uint64_t bytes) {
  if (bytes < kKiB) return fmt::format("{} B", bytes);
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes) / kKiB;
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return fmt::format("{:.2f} {}", v, kUnits[u]);
}

}  // namespace zinf
