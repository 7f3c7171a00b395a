// CRC32C with the SSE4.2 crc32 instruction. Built with -msse4.2 (this file only); called only
// where the CPU has SSE4.2 (see crc32c.cc). Thread-safe.
#include <nmmintrin.h>

#include <cstring>

#include "core/crc32c.h"

namespace zinf::crc32c_internal {

uint32_t Crc32cSse42(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
    p += 8;
    size -= 8;
  }
  auto c32 = static_cast<uint32_t>(c);
  while (size-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}

}  // namespace zinf::crc32c_internal
