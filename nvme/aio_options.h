// AioOptions: how zinf's NVMe engine does I/O, with DeepSpeed's `aio` key names.
//
// A DeepSpeed config's "aio" object is accepted unchanged: block_size, queue_depth,
// thread_count / intra_op_parallelism, single_submit, overlap_events (and use_gds, which must
// be false). zinf adds its own keys for what DeepSpeed does not choose: the backend, O_DIRECT
// and registration. The defaults reach the disk's own limit without tuning; see Note [Default
// aio options] in aio_options.cc for how they were chosen.
//
// Thread-safety: a plain value.
#ifndef ZINF_NVME_AIO_OPTIONS_H_
#define ZINF_NVME_AIO_OPTIONS_H_

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>

#include "zinf/aio.h"
#include "zinf/status.h"

namespace zinf {

// Reads a JSON `aio` object (DeepSpeed or zinf keys) into *options, leaving absent keys at
// their current values, then validates. `path` names the object in errors ("aio").
[[nodiscard]] Status ReadAioOptions(const nlohmann::json& object, const std::string& path,
                                    AioOptions* options);

std::string_view IoBackendName(IoBackend backend);
std::string_view DirectIoName(DirectIo mode);

}  // namespace zinf

#endif  // ZINF_NVME_AIO_OPTIONS_H_
