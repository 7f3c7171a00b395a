// CRC32C: the portable table engine and the run-time choice. Thread-safe.
#include "core/crc32c.h"

#include <array>
#include <cstring>

#include "zinf/cpu_info.h"

namespace zinf {
namespace crc32c_internal {
namespace {

constexpr uint32_t kPolyReflected = 0x82F63B78u;

// Slicing-by-8 tables: table[k][b] is the CRC of byte b followed by k zero bytes.
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  constexpr Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1) ? kPolyReflected : 0);
      t[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; ++b) {
      for (size_t k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
    }
  }
};
constexpr Tables kTables;

}  // namespace

uint32_t Crc32cTable(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  const auto& t = kTables.t;
  uint32_t c = ~crc;
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);  // little-endian x86-64 and aarch64
    const uint32_t lo = static_cast<uint32_t>(word) ^ c;
    const auto hi = static_cast<uint32_t>(word >> 32);
    c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
        t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
  return ~c;
}

}  // namespace crc32c_internal

namespace {

using Crc32cFn = uint32_t (*)(const void*, size_t, uint32_t);

Crc32cFn Pick() {
  return GetCpuInfo().isa.sse42 ? crc32c_internal::Crc32cSse42 : crc32c_internal::Crc32cTable;
}

}  // namespace

uint32_t Crc32c(const void* data, size_t size, uint32_t crc) {
  static const Crc32cFn fn = Pick();
  return fn(data, size, crc);
}

std::string_view Crc32cEngineName() { return GetCpuInfo().isa.sse42 ? "sse4.2" : "table"; }

}  // namespace zinf
