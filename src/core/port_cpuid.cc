#include "core/port_cpuid.h"

#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace zinf::port {

#if defined(__x86_64__) || defined(__i386__)

namespace {
uint64_t ReadXcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}
}  // namespace

std::string ProbeIsa(CpuIsa* isa) {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return "";
  const unsigned max_leaf = eax;
  char vendor[13] = {};
  std::memcpy(vendor, &ebx, 4);
  std::memcpy(vendor + 4, &edx, 4);
  std::memcpy(vendor + 8, &ecx, 4);

  __get_cpuid(1, &eax, &ebx, &ecx, &edx);
  const bool osxsave = ecx & bit_OSXSAVE;
  isa->sse42 = ecx & bit_SSE4_2;
  isa->fma = ecx & bit_FMA;
  isa->f16c = ecx & bit_F16C;
  const bool cpu_avx = ecx & bit_AVX;

  // The OS must save the wider registers, or using them faults.
  const uint64_t xcr0 = osxsave ? ReadXcr0() : 0;
  const bool os_avx = (xcr0 & 0x6) == 0x6;                 // XMM + YMM
  const bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;  // opmask + ZMM halves
  const bool os_amx = (xcr0 & 0x60000) == 0x60000;         // XTILECFG + XTILEDATA

  isa->avx = cpu_avx && os_avx;
  isa->fma = isa->fma && os_avx;
  isa->f16c = isa->f16c && os_avx;
  if (max_leaf >= 7) {
    __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx);
    isa->avx2 = (ebx & bit_AVX2) && os_avx;
    isa->avx512f = (ebx & bit_AVX512F) && os_avx512;
    isa->avx512dq = (ebx & bit_AVX512DQ) && os_avx512;
    isa->avx512bw = (ebx & bit_AVX512BW) && os_avx512;
    isa->avx512vl = (ebx & bit_AVX512VL) && os_avx512;
    isa->avx512_fp16 = (edx & (1u << 23)) && os_avx512;
    isa->amx_bf16 = (edx & (1u << 22)) && os_amx;
    isa->amx_tile = (edx & (1u << 24)) && os_amx;
    unsigned eax1 = 0, ebx1 = 0, ecx1 = 0, edx1 = 0;
    __get_cpuid_count(7, 1, &eax1, &ebx1, &ecx1, &edx1);
    isa->avx512_bf16 = (eax1 & (1u << 5)) && os_avx512;
  }
  return vendor;
}

#else

std::string ProbeIsa(CpuIsa*) { return ""; }

#endif

}  // namespace zinf::port
