// CreateDevice: a device by the name users give ("host", "cuda:N"). See zinf/device.h.
#include <fmt/core.h>

#include <charconv>
#include <string>

#include "zinf/device.h"

namespace zinf {

StatusOr<std::unique_ptr<Device>> CreateDevice(std::string_view name,
                                               uint64_t memory_budget_bytes) {
  if (name == "host") {
    HostDeviceOptions d;
    d.memory_budget_bytes = memory_budget_bytes;
    // ZINF_HOST_LINK_GBPS puts the device behind a modelled PCIe link, so that the overlap of
    // transfers with compute can be seen without a GPU.
    ZINF_RETURN_IF_ERROR(d.ApplyEnvironment());
    return CreateHostDevice(d);
  }
  if (name.rfind("cuda:", 0) == 0) {
    const std::string_view ordinal = name.substr(5);
    CudaDeviceOptions d;
    d.memory_budget_bytes = memory_budget_bytes;
    const auto [end, error] =
        std::from_chars(ordinal.data(), ordinal.data() + ordinal.size(), d.ordinal);
    if (ordinal.empty() || error != std::errc() || end != ordinal.data() + ordinal.size() ||
        d.ordinal < 0) {
      return InvalidArgument(fmt::format("device \"{}\": bad ordinal", name));
    }
    return CreateCudaDevice(d);
  }
  return InvalidArgument(fmt::format("device must be \"host\" or \"cuda:N\", got \"{}\"", name));
}

}  // namespace zinf
