// CreateCudaKernels for builds without CUDA (examples/CMakeLists.txt picks this file instead of
// gpt_kernels_cuda.{cc,cu}): the reason comes from CreateCudaDevice, which says how zinf was
// built.
#include "examples/gpt/gpt_kernels.h"

namespace gpt {

zinf::StatusOr<std::unique_ptr<GptKernels>> CreateCudaKernels(int ordinal,
                                                              uint64_t memory_budget_bytes,
                                                              ElementType) {
  auto device =
      zinf::CreateCudaDevice({.ordinal = ordinal, .memory_budget_bytes = memory_budget_bytes});
  if (!device.ok()) return device.status();
  return zinf::Unavailable("the GPT example was built without its CUDA backend (no nvcc)");
}

}  // namespace gpt
