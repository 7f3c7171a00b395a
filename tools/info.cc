// `zinf info`: what a user needs to know before tuning offload on this machine — CPU and ISA,
// cores, NUMA, memory, GPUs and CUDA/NCCL versions, io_uring, and for each --path whether
// O_DIRECT works and how much space is free.
#include <fmt/core.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/units.h"
#include "nvme/path_probe.h"
#include "tools/commands.h"
#include "zinf/cpu_info.h"
#include "zinf/device.h"

namespace zinf::tools {
namespace {

struct InfoArgs {
  std::vector<std::string> paths;
  bool json = false;
};

nlohmann::json CollectInfo(const InfoArgs& args) {
  const CpuInfo& cpu = GetCpuInfo();
  nlohmann::json out;
  out["cpu"] = {{"model", cpu.model_name},        {"vendor", cpu.vendor},
                {"isa", IsaSummary(cpu.isa)},     {"logical_cpus", cpu.logical_cpus},
                {"usable_cpus", cpu.usable_cpus}, {"physical_cores", cpu.physical_cores},
                {"numa_nodes", cpu.numa_nodes},   {"l1d_bytes", cpu.l1d_bytes},
                {"l2_bytes", cpu.l2_bytes},       {"l3_bytes", cpu.l3_bytes}};
  out["memory"] = {{"total_bytes", cpu.total_memory_bytes},
                   {"available_bytes", cpu.available_memory_bytes}};

  const GpuReport gpus = ProbeGpus();
  nlohmann::json gpu_list = nlohmann::json::array();
  for (const GpuDescription& g : gpus.gpus) {
    gpu_list.push_back({{"ordinal", g.ordinal},
                        {"name", g.name},
                        {"total_memory_bytes", g.total_memory_bytes},
                        {"free_memory_bytes", g.free_memory_bytes},
                        {"compute_capability", fmt::format("{}.{}", g.compute_capability_major,
                                                           g.compute_capability_minor)},
                        {"multiprocessors", g.multiprocessors},
                        {"pci_bus_id", g.pci_bus_id}});
  }
  out["cuda"] = {{"built", gpus.cuda_built},
                 {"runtime_version", gpus.runtime_version},
                 {"driver_version", gpus.driver_version},
                 {"nccl_version", gpus.nccl_version},
                 {"gpus", gpu_list},
                 {"error", gpus.error}};

  const IoUringProbe uring = ProbeIoUring();
  out["io_uring"] = {
      {"available", uring.available}, {"error", uring.error}, {"kernel", uring.kernel}};

  nlohmann::json paths = nlohmann::json::array();
  for (const std::string& path : args.paths) {
    StatusOr<PathProbe> probe = ProbePath(path);
    if (!probe.ok()) {
      paths.push_back({{"path", path}, {"error", probe.status().message()}});
      continue;
    }
    paths.push_back({{"path", path},
                     {"filesystem", probe->filesystem},
                     {"free_bytes", probe->free_bytes},
                     {"total_bytes", probe->total_bytes},
                     {"writable", probe->writable},
                     {"o_direct", probe->o_direct},
                     {"o_direct_error", probe->o_direct_error}});
  }
  out["paths"] = paths;
  return out;
}

void PrintText(const nlohmann::json& info) {
  const auto& cpu = info["cpu"];
  fmt::print("CPU        {} ({})\n", cpu["model"].get<std::string>(),
             cpu["vendor"].get<std::string>());
  fmt::print("ISA        {}\n", cpu["isa"].get<std::string>());
  fmt::print("Cores      {} logical, {} physical, {} usable by this process; {} NUMA node(s)\n",
             cpu["logical_cpus"].get<int>(), cpu["physical_cores"].get<int>(),
             cpu["usable_cpus"].get<int>(), cpu["numa_nodes"].get<int>());
  fmt::print("Caches     L1d {}, L2 {}, L3 {}\n", FormatBytes(cpu["l1d_bytes"].get<uint64_t>()),
             FormatBytes(cpu["l2_bytes"].get<uint64_t>()),
             FormatBytes(cpu["l3_bytes"].get<uint64_t>()));
  fmt::print("Memory     {} total, {} available\n",
             FormatBytes(info["memory"]["total_bytes"].get<uint64_t>()),
             FormatBytes(info["memory"]["available_bytes"].get<uint64_t>()));

  const auto& cuda = info["cuda"];
  if (!cuda["built"].get<bool>()) {
    fmt::print("CUDA       not built into this zinf\n");
  } else {
    fmt::print(
        "CUDA       runtime {}, driver {}, NCCL {}\n", cuda["runtime_version"].get<std::string>(),
        cuda["driver_version"].get<std::string>().empty()
            ? "none"
            : cuda["driver_version"].get<std::string>(),
        cuda["nccl_version"].get<std::string>().empty() ? "not found"
                                                        : cuda["nccl_version"].get<std::string>());
  }
  if (cuda["gpus"].empty()) {
    const std::string why = cuda["error"].get<std::string>();
    fmt::print("GPUs       none{}\n", why.empty() ? "" : " (" + why + ")");
  }
  for (const auto& g : cuda["gpus"]) {
    fmt::print("GPU {}      {}, sm_{}, {} SMs, {} total / {} free\n", g["ordinal"].get<int>(),
               g["name"].get<std::string>(), g["compute_capability"].get<std::string>(),
               g["multiprocessors"].get<int>(),
               FormatBytes(g["total_memory_bytes"].get<uint64_t>()),
               FormatBytes(g["free_memory_bytes"].get<uint64_t>()));
  }
  const auto& uring = info["io_uring"];
  fmt::print("io_uring   {} (kernel {})\n",
             uring["available"].get<bool>() ? "available"
                                            : "unavailable: " + uring["error"].get<std::string>(),
             uring["kernel"].get<std::string>());
  for (const auto& p : info["paths"]) {
    fmt::print("Path       {}\n", p["path"].get<std::string>());
    if (p.contains("error")) {
      fmt::print("           error: {}\n", p["error"].get<std::string>());
      continue;
    }
    fmt::print("           {}, {} free of {}, {}\n", p["filesystem"].get<std::string>(),
               FormatBytes(p["free_bytes"].get<uint64_t>()),
               FormatBytes(p["total_bytes"].get<uint64_t>()),
               !p["writable"].get<bool>() ? "NOT writable"
               : p["o_direct"].get<bool>()
                   ? "O_DIRECT works"
                   : "no O_DIRECT (" + p["o_direct_error"].get<std::string>() + ")");
  }
}

}  // namespace

void AddInfoCommand(CLI::App& app) {
  auto args = std::make_shared<InfoArgs>();
  CLI::App* info = app.add_subcommand("info", "Show CPU, memory, GPUs, io_uring and NVMe paths");
  info->add_option("--path", args->paths, "A directory to check for offload (repeatable)");
  info->add_flag("--json", args->json, "Print one JSON object");
  info->callback([args] {
    const nlohmann::json out = CollectInfo(*args);
    if (args->json) {
      fmt::print("{}\n", out.dump(2));
    } else {
      PrintText(out);
    }
    for (const auto& p : out["paths"]) {
      if (p.contains("error")) ExitCode() = 1;  // a bad --path is the user's error
    }
  });
}

}  // namespace zinf::tools
