// Run-time kernel selection: the only place that maps CPU features to kernel tables.
#include "cpu_optim/dispatch.h"

#include <string>

#include "zinf/cpu_info.h"

namespace zinf::cpu_optim {

bool IsaSupported(CpuKernelIsa isa) {
  const CpuIsa& cpu = GetCpuInfo().isa;
  switch (isa) {
    case CpuKernelIsa::kAuto:
    case CpuKernelIsa::kScalar:
      return true;
    case CpuKernelIsa::kAvx2:
      return cpu.avx2 && cpu.fma && cpu.f16c;
    case CpuKernelIsa::kAvx512:
      return cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.avx512dq && cpu.fma && cpu.f16c;
  }
  return false;
}

StatusOr<CpuKernelIsa> ResolveIsa(CpuKernelIsa isa) {
  if (isa == CpuKernelIsa::kAuto) {
    if (IsaSupported(CpuKernelIsa::kAvx512)) return CpuKernelIsa::kAvx512;
    if (IsaSupported(CpuKernelIsa::kAvx2)) return CpuKernelIsa::kAvx2;
    return CpuKernelIsa::kScalar;
  }
  if (isa != CpuKernelIsa::kScalar && isa != CpuKernelIsa::kAvx2 && isa != CpuKernelIsa::kAvx512) {
    return InvalidArgument("cpu optimizer isa must be auto, scalar, avx2 or avx512, got " +
                           std::to_string(static_cast<int>(isa)));
  }
  if (!IsaSupported(isa)) {
    return Unavailable("cpu optimizer isa " + std::string(CpuKernelIsaName(isa)) +
                       " is not supported by this CPU (it has: " + IsaSummary(GetCpuInfo().isa) +
                       ")");
  }
  return isa;
}

const KernelTable& KernelsFor(CpuKernelIsa isa) {
  switch (isa) {
    case CpuKernelIsa::kAvx512:
      return Avx512Kernels();
    case CpuKernelIsa::kAvx2:
      return Avx2Kernels();
    default:
      return ScalarKernels();
  }
}

}  // namespace zinf::cpu_optim
