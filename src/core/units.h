// Byte sizes and durations as people write them: "4GiB", "512M", "1.5 GB".
#ifndef ZINF_CORE_UNITS_H_
#define ZINF_CORE_UNITS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "zinf/status.h"

namespace zinf {

inline constexpr uint64_t kKiB = 1024;
inline constexpr uint64_t kMiB = 1024 * kKiB;
inline constexpr uint64_t kGiB = 1024 * kMiB;

// Parses a byte count: a plain integer, or a number with a suffix. K, M, G, T (also KiB, MiB,
// GiB, TiB, k) are powers of 1024 as in fio and DeepSpeed's configs; KB, MB, GB, TB are powers
// of 1000. "1.5G" is allowed. InvalidArgument names the text when it is not a size.
StatusOr<uint64_t> ParseBytes(std::string_view text);

// "0 B", "512 B", "4.00 KiB", "1.50 GiB".
std::string FormatBytes(uint64_t bytes);

// Rounds up to a multiple of `alignment` (a power of two).
constexpr uint64_t AlignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) & ~(alignment - 1);
}
constexpr bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace zinf

#endif  // ZINF_CORE_UNITS_H_
