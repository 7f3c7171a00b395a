// AioOptions validation and the JSON `aio` reader.
//
// Note [Default aio options]
// The defaults (1 MiB pieces, 8 in flight, one ring, one system call per piece, O_DIRECT,
// registered buffers and files) were chosen by `zinf bench nvme --sweep` against fio over
// {128 KiB, 1 MiB, 8 MiB} x {QD 8, 32}; bench/RESULTS.md has the figures. They are DeepSpeed's
// defaults except single_submit, for two reasons measured on the work disk:
//
// - Batched submission merges. io_uring plugs the block layer when one io_uring_enter carries
//   more than two requests, and the plug (or the I/O scheduler) merges file-adjacent pieces
//   into requests up to max_sectors_kb: with batches, 1 MiB pieces reached the disk as 4 MiB
//   requests (/sys/block/*/stat counts the merges), and reads ran 10-25% slower than the same
//   pieces submitted one by one; fio with iodepth_batch_submit=8 slows down the same way. One
//   piece per call keeps block_size the size the device sees. A call costs about a
//   microsecond, nothing at a few thousand pieces a second.
// - Eight 1 MiB pieces keep 8 MiB in flight, which saturates the disks measured (a PCIe 4
//   drive needs about bandwidth x latency = 7 GB/s x 0.5 ms = 3.5 MB), and the buffers being
//   filled stay few: on a virtual disk whose host copies into guest memory, reads into 8 MiB of
//   buffers ran at 3.7 GB/s and into 32 MiB or more at 2.6 GB/s, for fio as for zinf.
//
// One completion thread reaps a few thousand completions a second with CPU to spare; a second
// ring helps only when several drives are striped.
#include "nvme/aio_options.h"

#include <fmt/core.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/config_reader.h"
#include "core/units.h"

namespace zinf {
namespace {

constexpr uint64_t kMinBlock = 4096;
constexpr uint64_t kMaxBlock = 256 * kMiB;
constexpr int kMaxThreads = 64;

}  // namespace

std::string_view IoBackendName(IoBackend backend) {
  switch (backend) {
    case IoBackend::kAuto:
      return "auto";
    case IoBackend::kIoUring:
      return "io_uring";
    case IoBackend::kPosix:
      return "posix";
  }
  return "?";
}

std::string_view DirectIoName(DirectIo mode) {
  switch (mode) {
    case DirectIo::kAuto:
      return "auto";
    case DirectIo::kOn:
      return "on";
    case DirectIo::kOff:
      return "off";
  }
  return "?";
}

Status AioOptions::Validate() const {
  if (block_size < kMinBlock || block_size > kMaxBlock || block_size % 4096 != 0) {
    return InvalidArgument(
        fmt::format("aio.block_size must be a multiple of 4096 in [{}, {}], got {}", kMinBlock,
                    kMaxBlock, block_size));
  }
  if (queue_depth < 1 || queue_depth > kMaxAioQueueDepth) {
    return InvalidArgument(
        fmt::format("aio.queue_depth must be in [1, {}], got {}", kMaxAioQueueDepth, queue_depth));
  }
  if (thread_count < 1 || thread_count > kMaxThreads) {
    return InvalidArgument(
        fmt::format("aio.thread_count must be in [1, {}], got {}", kMaxThreads, thread_count));
  }
  return OkStatus();
}

Status ReadAioOptions(const nlohmann::json& object, const std::string& path, AioOptions* options) {
  ConfigReader r(object, path);
  // Ranges are checked by Validate() below so that a JSON value and a struct field get the
  // same message; the reader only checks types here.
  r.Bytes("block_size", &options->block_size);
  int64_t queue_depth = options->queue_depth;
  r.Int("queue_depth", &queue_depth);
  int64_t threads = options->thread_count;
  r.Int("thread_count", &threads);
  if (r.Has("intra_op_parallelism")) {
    int64_t intra = threads;
    r.Int("intra_op_parallelism", &intra);
    if (r.Has("thread_count") && intra != threads) {
      r.Fail(InvalidArgument(
          fmt::format("{0}.thread_count ({1}) and {0}.intra_op_parallelism ({2}) disagree; set one",
                      path, threads, intra)));
    }
    threads = intra;
  }
  r.Bool("single_submit", &options->single_submit);
  r.Bool("overlap_events", &options->overlap_events);
  bool use_gds = false;
  r.Bool("use_gds", &use_gds);
  if (use_gds) {
    r.Fail(InvalidArgument(fmt::format(
        "{}.use_gds=true is not supported: zinf stages NVMe I/O through pinned host memory",
        path)));
  }
  std::string backend(IoBackendName(options->backend));
  r.Enum("backend", &backend, {"auto", "io_uring", "posix"});
  std::string direct(DirectIoName(options->direct_io));
  r.Enum("direct_io", &direct, {"auto", "on", "off"});
  r.Bool("register_buffers", &options->register_buffers);
  r.Bool("register_files", &options->register_files);
  ZINF_RETURN_IF_ERROR(r.Finish());

  // Clamp into int range before narrowing so that absurd values still reach Validate().
  auto narrow = [](int64_t v) {
    return static_cast<int>(std::clamp<int64_t>(v, -1, int64_t{1} << 30));
  };
  options->queue_depth = narrow(queue_depth);
  options->thread_count = narrow(threads);
  options->backend = backend == "io_uring" ? IoBackend::kIoUring
                     : backend == "posix"  ? IoBackend::kPosix
                                           : IoBackend::kAuto;
  options->direct_io = direct == "on"    ? DirectIo::kOn
                       : direct == "off" ? DirectIo::kOff
                                         : DirectIo::kAuto;
  return options->Validate();
}

}  // namespace zinf
