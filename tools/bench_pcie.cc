// `zinf bench pcie`: host<->device copy bandwidth through the Device interface (CudaDevice):
// host-to-device and device-to-host, from pinned (Device::AllocateHost) and pageable host
// memory, one way and both ways at once (two copy streams), by transfer size. GPU only: without
// a usable GPU it says why and exits 0.
//
// Each figure is the median of --reps timed batches; a batch repeats the copy until it has
// moved at least 1 GiB (or 8 copies), timed from the first enqueue to the streams' completion.
//
// Single-threaded driver.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/units.h"
#include "tools/bench_measure.h"
#include "tools/bench_util.h"
#include "tools/commands.h"
#include "zinf/device.h"
#include "zinf/host_memory.h"

namespace zinf::tools {
namespace {

struct PcieArgs {
  std::vector<std::string> sizes = {"1MiB", "16MiB", "256MiB"};
  int device = 0;
  bool host = false;
  double link_gbps = -1;  // --host only; < 0: from ZINF_HOST_LINK_GBPS
  int reps = 5;
  bool json = false;
};

// The HostDevice to measure, with room for two device buffers of `largest` bytes; stores its
// modelled link rate (0: none) in *link_bytes_per_second.
StatusOr<std::unique_ptr<Device>> OpenHostDevice(const PcieArgs& args, uint64_t largest,
                                                 uint64_t* link_bytes_per_second) {
  HostDeviceOptions options;
  options.memory_budget_bytes = 2 * largest;
  if (args.link_gbps < 0) {
    ZINF_RETURN_IF_ERROR(options.ApplyEnvironment());
  } else {  // in [0, 1e6]: checked by the command line parser
    options.link_bytes_per_second = static_cast<uint64_t>(std::llround(args.link_gbps * 1e9));
  }
  *link_bytes_per_second = options.link_bytes_per_second;
  return CreateHostDevice(options);
}

// The median GB/s of `reps` timed batches (after one that warms up) of `copies` copies of
// `size` bytes: mode 0 host to device, 1 device to host, 2 both at once on two streams.
StatusOr<double> CopyGBps(Stream& h2d, Stream& d2h, void* up, void* down, void* dev_up,
                          void* dev_down, uint64_t size, int copies, int mode, int reps) {
  std::vector<double> runs;
  for (int r = 0; r < reps + 1; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < copies; ++i) {
      if (mode != 1) ZINF_RETURN_IF_ERROR(h2d.Copy(dev_up, up, size, CopyKind::kHostToDevice));
      if (mode != 0) ZINF_RETURN_IF_ERROR(d2h.Copy(down, dev_down, size, CopyKind::kDeviceToHost));
    }
    ZINF_RETURN_IF_ERROR(h2d.Synchronize());
    ZINF_RETURN_IF_ERROR(d2h.Synchronize());
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double bytes = static_cast<double>(size) * copies * (mode == 2 ? 2 : 1);
    if (r > 0) runs.push_back(bytes / s / 1e9);
  }
  return Median(runs);
}

Status RunPcie(const PcieArgs& args) {
  std::vector<uint64_t> sizes;
  for (const std::string& s : args.sizes) {
    ZINF_ASSIGN_OR_RETURN(uint64_t bytes, ParseBytes(s));
    if (bytes == 0) return InvalidArgument("--size must be > 0");
    sizes.push_back(bytes);
  }
  const uint64_t largest = *std::max_element(sizes.begin(), sizes.end());
  uint64_t link_bytes_per_second = 0;
  std::unique_ptr<Device> owned_device;
  if (args.host) {
    ZINF_ASSIGN_OR_RETURN(owned_device, OpenHostDevice(args, largest, &link_bytes_per_second));
  } else {
    CudaDeviceOptions options;
    options.ordinal = args.device;
    StatusOr<std::unique_ptr<Device>> device_or = CreateCudaDevice(options);
    if (!device_or.ok()) {
      if (args.json) {
        nlohmann::json out = {{"gpu", false}, {"reason", device_or.status().message()}};
        fmt::print("{}\n", out.dump());
      } else {
        fmt::print(
            "zinf bench pcie: no GPU to measure ({}); nothing to do (--host measures "
            "the host device)\n",
            device_or.status().message());
      }
      return OkStatus();
    }
    owned_device = std::move(*device_or);
  }
  Device& device = *owned_device;
  const double link_gbps = static_cast<double>(link_bytes_per_second) / 1e9;
  ZINF_ASSIGN_OR_RETURN(HostBuffer pinned_up, device.AllocateHost(largest));
  ZINF_ASSIGN_OR_RETURN(HostBuffer pinned_down, device.AllocateHost(largest));
  ZINF_ASSIGN_OR_RETURN(HostBuffer pageable_up, HostBuffer::Allocate(largest));
  ZINF_ASSIGN_OR_RETURN(HostBuffer pageable_down, HostBuffer::Allocate(largest));
  ZINF_ASSIGN_OR_RETURN(DeviceBuffer dev_up, device.Allocate(largest));
  ZINF_ASSIGN_OR_RETURN(DeviceBuffer dev_down, device.Allocate(largest));
  for (HostBuffer* b : {&pinned_up, &pinned_down, &pageable_up, &pageable_down}) {
    std::memset(b->data(), 1, largest);  // fault the pages in before timing
  }
  if (args.host) {  // device memory is host memory here: fault it in too
    std::memset(dev_up.data(), 1, largest);
    std::memset(dev_down.data(), 1, largest);
  }
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Stream> h2d, device.CreateStream());
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Stream> d2h, device.CreateStream());
  // On the host device every host buffer is alike: one row per size, its limit the model.
  const std::vector<bool> memories =
      args.host ? std::vector<bool>{true} : std::vector<bool>{true, false};
  auto memory_name = [&](bool pinned) {
    return args.host ? "host" : pinned ? "pinned" : "pageable";
  };
  // A batch moves 1 GiB, or a quarter second's worth behind a modelled link.
  const uint64_t batch_bytes =
      link_bytes_per_second > 0 ? std::min<uint64_t>(kGiB, link_bytes_per_second / 4) : kGiB;

  if (!args.json) {
    fmt::print("pcie: {}; sizes", device.name());
    for (uint64_t s : sizes) fmt::print(" {}", FormatBytes(s));
    fmt::print("; median of {} batches; GB/s = 10^9 bytes/s\n", args.reps);
    fmt::print("{:>10}  {:>9}  {:>9}  {:>9}  {:>12}", "size", "memory", "H2D", "D2H", "both (sum)");
    if (link_gbps > 0) fmt::print("  {:>18}", "model (one, both)");
    fmt::print("\n");
  }
  nlohmann::json rows = nlohmann::json::array();
  for (uint64_t size : sizes) {
    const int copies = static_cast<int>(std::max<uint64_t>(8, batch_bytes / size));
    for (bool pinned : memories) {
      void* up = pinned ? pinned_up.data() : pageable_up.data();
      void* down = pinned ? pinned_down.data() : pageable_down.data();
      // mode 0: H2D only, 1: D2H only, 2: both at once.
      double gbps[3];
      for (int mode = 0; mode < 3; ++mode) {
        ZINF_ASSIGN_OR_RETURN(gbps[mode], CopyGBps(*h2d, *d2h, up, down, dev_up.data(),
                                                   dev_down.data(), size, copies, mode, args.reps));
      }
      nlohmann::json row = {{"size_bytes", size},
                            {"memory", memory_name(pinned)},
                            {"h2d_GBps", gbps[0]},
                            {"d2h_GBps", gbps[1]},
                            {"bidirectional_GBps", gbps[2]}};
      if (link_gbps > 0) row["model_GBps"] = link_gbps;
      rows.push_back(std::move(row));
      if (!args.json) {
        fmt::print("{:>10}  {:>9}  {:>9.2f}  {:>9.2f}  {:>12.2f}", FormatBytes(size),
                   memory_name(pinned), gbps[0], gbps[1], gbps[2]);
        if (link_gbps > 0) {
          fmt::print("  {:>18}", fmt::format("{:.2f}, {:.2f}", link_gbps, 2 * link_gbps));
        }
        fmt::print("\n");
      }
    }
  }
  if (args.json) {
    nlohmann::json out = {
        {"gpu", !args.host}, {"device", device.name()}, {"reps", args.reps}, {"rows", rows}};
    if (args.host) out["link_GBps"] = link_gbps;  // 0: no link model, memcpy
    fmt::print("{}\n", out.dump());
  }
  return OkStatus();
}

}  // namespace

StatusOr<LinkFigures> MeasureLink(uint64_t size_bytes, int reps) {
  if (size_bytes == 0 || reps < 1) return InvalidArgument("MeasureLink: size and reps must be > 0");
  LinkFigures f;
  std::unique_ptr<Device> device;
  StatusOr<std::unique_ptr<Device>> cuda = CreateCudaDevice(CudaDeviceOptions());
  if (cuda.ok()) {
    device = std::move(*cuda);
    f.gpu = true;
  } else {
    PcieArgs args;
    args.host = true;
    uint64_t link = 0;
    ZINF_ASSIGN_OR_RETURN(device, OpenHostDevice(args, size_bytes, &link));
    f.model_GBps = static_cast<double>(link) / 1e9;
  }
  f.device = device->name();
  ZINF_ASSIGN_OR_RETURN(HostBuffer up, device->AllocateHost(size_bytes));
  ZINF_ASSIGN_OR_RETURN(HostBuffer down, device->AllocateHost(size_bytes));
  ZINF_ASSIGN_OR_RETURN(DeviceBuffer dev_up, device->Allocate(size_bytes));
  ZINF_ASSIGN_OR_RETURN(DeviceBuffer dev_down, device->Allocate(size_bytes));
  std::memset(up.data(), 1, size_bytes);
  std::memset(down.data(), 1, size_bytes);
  if (!f.gpu) {
    std::memset(dev_up.data(), 1, size_bytes);
    std::memset(dev_down.data(), 1, size_bytes);
  }
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Stream> h2d, device->CreateStream());
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Stream> d2h, device->CreateStream());
  const uint64_t link = static_cast<uint64_t>(f.model_GBps * 1e9);
  const uint64_t batch = link > 0 ? std::min<uint64_t>(kGiB, link / 4) : 256 * kMiB;
  const int copies = static_cast<int>(std::max<uint64_t>(4, batch / size_bytes));
  ZINF_ASSIGN_OR_RETURN(f.h2d_GBps, CopyGBps(*h2d, *d2h, up.data(), down.data(), dev_up.data(),
                                             dev_down.data(), size_bytes, copies, 0, reps));
  ZINF_ASSIGN_OR_RETURN(f.d2h_GBps, CopyGBps(*h2d, *d2h, up.data(), down.data(), dev_up.data(),
                                             dev_down.data(), size_bytes, copies, 1, reps));
  return f;
}

void AddBenchPcieCommand(CLI::App& bench) {
  auto args = std::make_shared<PcieArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "pcie",
      "Host<->GPU copy bandwidth (or the host device's modelled link with --host): pinned and "
      "pageable, one way and both ways, by size");
  cmd->add_option("--size", args->sizes, "Transfer sizes (repeat; default 1MiB 16MiB 256MiB)");
  cmd->add_option("--device", args->device, "CUDA device ordinal")->capture_default_str();
  cmd->add_flag("--host", args->host,
                "Measure the host device (HostDevice) instead of a GPU, behind its modelled link");
  cmd->add_option("--link-gbps", args->link_gbps,
                  "With --host: the modelled link in GB/s (0: none, memcpy); default "
                  "ZINF_HOST_LINK_GBPS")
      ->check(CLI::Range(0.0, 1e6))
      ->needs("--host");
  cmd->add_option("--reps", args->reps, "Timed batches per figure (median reported)")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args] { Report("zinf bench pcie", RunPcie(*args)); });
}

}  // namespace zinf::tools
