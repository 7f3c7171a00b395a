// CRC32C with the SSE4.2 crc32 instruction. Built with -msse4.2 (this file only); called only
// where the CPU has SSE4.2 (see crc32c.cc). Thread-safe.
//
// The instruction has a latency of three cycles and a throughput of one, so one chain of it
// runs at a third of what the core can do (about 8 GB/s, against the 2-3 GB/s a disk swaps
// at, on the thread that reaps its completions). Long inputs go as three chains over three
// consecutive blocks, joined at the end of each triple: the CRC state is linear, so the state
// after blocks A, B, C is Z(Z(crc(s, A)) ^ crc(0, B)) ^ crc(0, C), where Z appends one block of
// zero bytes and is a fixed linear map of the 32-bit state, applied through four tables.
#include <nmmintrin.h>

#include <array>
#include <cstring>

#include "core/crc32c.h"

namespace zinf::crc32c_internal {
namespace {

constexpr size_t kBlock = 8192;  // bytes per chain; a triple is 24 KiB

uint64_t Load(const unsigned char* p) {
  uint64_t word;
  std::memcpy(&word, p, 8);
  return word;
}

// Z, the state after kBlock zero bytes, as zeros[k][b] = Z(b << 8k), XORed over the state's
// four bytes.
struct ZeroBlock {
  std::array<std::array<uint32_t, 256>, 4> zeros{};
  ZeroBlock() {
    std::array<uint32_t, 32> bit{};  // Z of each single-bit state
    for (int i = 0; i < 32; ++i) {
      uint64_t c = uint64_t{1} << i;
      for (size_t n = 0; n < kBlock; n += 8) c = _mm_crc32_u64(c, 0);
      bit[i] = static_cast<uint32_t>(c);
    }
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) {
        for (int i = 0; i < 8; ++i) {
          if (b & (1u << i)) zeros[k][b] ^= bit[8 * k + i];
        }
      }
    }
  }
  uint64_t operator()(uint64_t c) const {
    return zeros[0][c & 0xFF] ^ zeros[1][(c >> 8) & 0xFF] ^ zeros[2][(c >> 16) & 0xFF] ^
           zeros[3][(c >> 24) & 0xFF];
  }
};

}  // namespace

uint32_t Crc32cSse42(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  if (size >= 3 * kBlock) {
    static const ZeroBlock zero_block;
    do {
      uint64_t c1 = 0, c2 = 0;
      for (const unsigned char* end = p + kBlock; p < end; p += 8) {
        c = _mm_crc32_u64(c, Load(p));
        c1 = _mm_crc32_u64(c1, Load(p + kBlock));
        c2 = _mm_crc32_u64(c2, Load(p + 2 * kBlock));
      }
      c = zero_block(zero_block(c) ^ c1) ^ c2;
      p += 2 * kBlock;
      size -= 3 * kBlock;
    } while (size >= 3 * kBlock);
  }
  while (size >= 8) {
    c = _mm_crc32_u64(c, Load(p));
    p += 8;
    size -= 8;
  }
  auto c32 = static_cast<uint32_t>(c);
  while (size-- > 0) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}

}  // namespace zinf::crc32c_internal
