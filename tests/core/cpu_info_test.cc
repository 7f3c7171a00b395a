#include "zinf/cpu_info.h"

#include <gtest/gtest.h>
#include <unistd.h>

namespace zinf {
namespace {

TEST(CpuInfoTest, CountsAreSane) {
  const CpuInfo& info = GetCpuInfo();
  EXPECT_EQ(info.logical_cpus, sysconf(_SC_NPROCESSORS_ONLN));
  EXPECT_GE(info.usable_cpus, 1);
  EXPECT_LE(info.usable_cpus, info.logical_cpus);
  EXPECT_GE(info.physical_cores, 1);
  EXPECT_LE(info.physical_cores, info.logical_cpus);
  EXPECT_GE(info.numa_nodes, 1);
  EXPECT_GT(info.total_memory_bytes, 0u);
  EXPECT_LE(info.available_memory_bytes, info.total_memory_bytes);
}

TEST(CpuInfoTest, IsaImplications) {
  const CpuIsa& isa = GetCpuInfo().isa;
  // Each wider ISA requires the narrower one it extends.
  if (isa.avx2) {
    EXPECT_TRUE(isa.avx);
  }
  if (isa.avx512bw) {
    EXPECT_TRUE(isa.avx512f);
  }
  if (isa.avx512f) {
    EXPECT_TRUE(isa.avx2);
  }
  if (isa.amx_bf16) {
    EXPECT_TRUE(isa.amx_tile);
  }
#if defined(__x86_64__)
  EXPECT_TRUE(isa.sse42) << "every x86-64 CPU zinf supports has SSE4.2";
  EXPECT_FALSE(GetCpuInfo().vendor.empty());
#endif
}

TEST(CpuInfoTest, Summary) {
  CpuIsa none;
  EXPECT_EQ(IsaSummary(none), "none");
  CpuIsa some;
  some.avx2 = some.fma = true;
  EXPECT_EQ(IsaSummary(some), "avx2 fma");
}

}  // namespace
}  // namespace zinf
