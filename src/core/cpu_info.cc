// CPU and memory probing from cpuid, sysfs and /proc.
#include "zinf/cpu_info.h"

#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "core/port_cpuid.h"

namespace zinf {
namespace {

std::string ReadFirstLine(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// sysfs cache sizes look like "48K" or "2048K" or "105M".
size_t ParseCacheSize(const std::string& text) {
  if (text.empty()) return 0;
  size_t value = std::stoull(text);
  const char unit = text.back();
  if (unit == 'K') value *= 1024;
  if (unit == 'M') value *= 1024 * 1024;
  return value;
}

void ProbeCaches(CpuInfo* info) {
  namespace fs = std::filesystem;
  const fs::path dir = "/sys/devices/system/cpu/cpu0/cache";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("index", 0) != 0) continue;
    const std::string level = ReadFirstLine(entry.path() / "level");
    const std::string type = ReadFirstLine(entry.path() / "type");
    const size_t size = ParseCacheSize(ReadFirstLine(entry.path() / "size"));
    if (level == "1" && type == "Data") info->l1d_bytes = size;
    if (level == "2") info->l2_bytes = size;
    if (level == "3") info->l3_bytes = size;
  }
}

void ProbeTopology(CpuInfo* info) {
  namespace fs = std::filesystem;
  info->logical_cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  cpu_set_t set;
  CPU_ZERO(&set);
  info->usable_cpus =
      sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : info->logical_cpus;
  std::set<std::pair<std::string, std::string>> cores;  // (package, core id)
  for (int cpu = 0; cpu < info->logical_cpus; ++cpu) {
    const fs::path topo =
        fs::path("/sys/devices/system/cpu") / ("cpu" + std::to_string(cpu)) / "topology";
    cores.emplace(ReadFirstLine(topo / "physical_package_id"), ReadFirstLine(topo / "core_id"));
  }
  info->physical_cores = cores.empty() ? info->logical_cpus : static_cast<int>(cores.size());
  int nodes = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/sys/devices/system/node", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("node", 0) == 0 && name.size() > 4 && std::isdigit(name[4])) ++nodes;
  }
  info->numa_nodes = nodes > 0 ? nodes : 1;
}

void ProbeProcFiles(CpuInfo* info) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      info->model_name = line.substr(line.find(':') + 2);
      break;
    }
  }
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    std::istringstream fields(line);
    std::string key;
    uint64_t kib = 0;
    fields >> key >> kib;
    if (key == "MemTotal:") info->total_memory_bytes = kib * 1024;
    if (key == "MemAvailable:") info->available_memory_bytes = kib * 1024;
  }
}

CpuInfo Probe() {
  CpuInfo info;
  info.vendor = port::ProbeIsa(&info.isa);
  ProbeTopology(&info);
  ProbeCaches(&info);
  ProbeProcFiles(&info);
  return info;
}

}  // namespace

const CpuInfo& GetCpuInfo() {
  static const CpuInfo info = Probe();
  return info;
}

std::string IsaSummary(const CpuIsa& isa) {
  std::string s;
  auto add = [&](bool has, const char* name) {
    if (!has) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(isa.sse42, "sse4.2");
  add(isa.avx, "avx");
  add(isa.avx2, "avx2");
  add(isa.fma, "fma");
  add(isa.f16c, "f16c");
  add(isa.avx512f, "avx512f");
  add(isa.avx512bw, "avx512bw");
  add(isa.avx512vl, "avx512vl");
  add(isa.avx512dq, "avx512dq");
  add(isa.avx512_bf16, "avx512_bf16");
  add(isa.avx512_fp16, "avx512_fp16");
  add(isa.amx_tile, "amx_tile");
  add(isa.amx_bf16, "amx_bf16");
  return s.empty() ? "none" : s;
}

}  // namespace zinf
