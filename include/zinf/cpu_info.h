// What this machine's CPUs and memory are: instruction sets, cores, NUMA nodes, caches.
//
// Probed once (cpuid, sysfs, /proc) and cached; GetCpuInfo() is thread-safe.
#ifndef ZINF_CPU_INFO_H_
#define ZINF_CPU_INFO_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "zinf/export.h"

namespace zinf {

// Instruction sets that the CPU has *and* the operating system enables (XSAVE state).
struct CpuIsa {
  bool sse42 = false;
  bool avx = false;
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_bf16 = false;
  bool avx512_fp16 = false;
  bool amx_tile = false;
  bool amx_bf16 = false;
};

struct CpuInfo {
  std::string vendor;      // "GenuineIntel"
  std::string model_name;  // from /proc/cpuinfo
  CpuIsa isa;
  int logical_cpus = 0;  // online CPUs
  int usable_cpus = 0;   // CPUs in this process's affinity mask (what threads should use)
  int physical_cores = 0;
  int numa_nodes = 1;
  size_t l1d_bytes = 0;  // per core
  size_t l2_bytes = 0;   // per core (or per cluster sharing it)
  size_t l3_bytes = 0;   // per socket; 0 when absent
  uint64_t total_memory_bytes = 0;
  uint64_t available_memory_bytes = 0;  // MemAvailable at probe time
};

ZINF_EXPORT const CpuInfo& GetCpuInfo();

// "avx2 fma f16c avx512f avx512bw avx512_bf16 amx_bf16" — the ISA names present.
ZINF_EXPORT std::string IsaSummary(const CpuIsa& isa);

}  // namespace zinf

#endif  // ZINF_CPU_INFO_H_
