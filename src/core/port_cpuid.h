// CPU instruction-set detection; the only place with architecture #ifs for cpuid.
#ifndef ZINF_CORE_PORT_CPUID_H_
#define ZINF_CORE_PORT_CPUID_H_

#include <string>

#include "zinf/cpu_info.h"

namespace zinf::port {

// Fills the ISA flags (empty on non-x86 builds) and returns the vendor string.
std::string ProbeIsa(CpuIsa* isa);

}  // namespace zinf::port

#endif  // ZINF_CORE_PORT_CPUID_H_
