// CRC32C (Castagnoli), the checksum SwapStore keeps per extent piece.
//
// Crc32c picks, once, the SSE4.2 crc32 instruction when the CPU has it (crc32c_sse42.cc,
// built with -msse4.2 alone) and a table-driven version otherwise. Both engines are exposed
// so that tests run each against the other and against known vectors.
//
// Thread-safe (pure functions).
#ifndef ZINF_CORE_CRC32C_H_
#define ZINF_CORE_CRC32C_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace zinf {

// Extends `crc` (the CRC of earlier bytes; 0 to start) over data[0, size).
uint32_t Crc32c(const void* data, size_t size, uint32_t crc = 0);

// "sse4.2" or "table": what Crc32c uses on this CPU.
std::string_view Crc32cEngineName();

namespace crc32c_internal {
uint32_t Crc32cTable(const void* data, size_t size, uint32_t crc);
// Only call where GetCpuInfo().isa.sse42.
uint32_t Crc32cSse42(const void* data, size_t size, uint32_t crc);
}  // namespace crc32c_internal

}  // namespace zinf

#endif  // ZINF_CORE_CRC32C_H_
