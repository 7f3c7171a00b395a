// CreateNcclCommunicator for builds without NCCL (CMake picks this file instead of
// nccl_communicator.cc).
#include "comm/communicator.h"

namespace zinf {

StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(TcpStore&,
                                                               const NcclOptions& options) {
  ZINF_RETURN_IF_ERROR(options.Validate());  // a bad call is the caller's error in any build
  return Unavailable("zinf was built without NCCL (it is found beside the CUDA toolkit)");
}

}  // namespace zinf
