// Picks the kernel table for an instruction set, once, from GetCpuInfo().
//
// Thread-safe.
#ifndef ZINF_CPU_OPTIM_DISPATCH_H_
#define ZINF_CPU_OPTIM_DISPATCH_H_

#include "cpu_optim/kernels.h"
#include "zinf/cpu_optimizer.h"
#include "zinf/status.h"

namespace zinf::cpu_optim {

// Whether this CPU (and OS) can run `isa`'s kernels. kAuto is always supported.
bool IsaSupported(CpuKernelIsa isa);
// The best supported ISA for kAuto, else `isa` itself. Unavailable when the CPU lacks it.
StatusOr<CpuKernelIsa> ResolveIsa(CpuKernelIsa isa);
// The kernels of a resolved ISA (not kAuto).
const KernelTable& KernelsFor(CpuKernelIsa isa);

}  // namespace zinf::cpu_optim

#endif  // ZINF_CPU_OPTIM_DISPATCH_H_
