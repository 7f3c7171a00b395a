// `zinf ckpt export`: any world size's shards → one safetensors file.
//
// safetensors: an 8-byte little-endian header length, a JSON header mapping each tensor name
// to {dtype, shape, data_offsets: [begin, end)} relative to the data, then the data. The
// header is padded with spaces to a multiple of 8 so that the data is aligned. Module buffers
// follow the parameters in their saved dtype (--dtype converts parameters only, as DeepSpeed's
// zero_to_fp32 keeps buffers as they are). Parameters are
// written in manifest order, each assembled from its rank pieces in a buffer of its own size,
// so the memory used is that of the largest parameter, whatever the model size.
#include <fcntl.h>
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <new>
#include <nlohmann/json.hpp>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/safetensors.h"

namespace zinf::ckpt {
namespace {

// fp32 → bf16 with round-to-nearest-even; NaN stays NaN.
uint16_t ToBf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((bits >> 16) | 0x40);
  return static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

// The output under its temporary name: removed unless Commit renamed it into place, so that
// a failure (or an exception) at any point leaves nothing at the output path.
class TempOutput {
 public:
  explicit TempOutput(std::string out_file) : out_(std::move(out_file)), tmp_(out_ + ".tmp") {}
  ~TempOutput() {
    if (fd_ >= 0) close(fd_);
    if (created_ && !committed_) unlink(tmp_.c_str());
  }
  TempOutput(const TempOutput&) = delete;
  TempOutput& operator=(const TempOutput&) = delete;

  Status Open() {
    fd_ = open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return ErrnoStatus(errno, fmt::format("creating {}", tmp_));
    created_ = true;
    return OkStatus();
  }
  Status Write(const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::write(fd_, p, bytes);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoStatus(errno, fmt::format("writing {}", tmp_));
      p += n;
      bytes -= n;
    }
    return OkStatus();
  }
  Status Commit() {
    if (fsync(fd_) != 0) return ErrnoStatus(errno, fmt::format("fsync of {}", tmp_));
    close(fd_);
    fd_ = -1;
    if (rename(tmp_.c_str(), out_.c_str()) != 0) {
      return ErrnoStatus(errno, fmt::format("renaming {} to {}", tmp_, out_));
    }
    committed_ = true;
    return OkStatus();
  }

 private:
  std::string out_, tmp_;
  int fd_ = -1;
  bool created_ = false, committed_ = false;
};

Status Export(const std::string& path, const std::string& out_file, ElementType dtype) {
  ZINF_ASSIGN_OR_RETURN(const std::string dir, ResolveCheckpoint(path));
  ZINF_ASSIGN_OR_RETURN(const Manifest manifest, ReadManifest(dir));
  // ReadManifest has checked the manifest on its own; what follows checks it against the
  // shard files before anything is allocated or written.
  std::vector<ShardReader> shards;
  const uint64_t section_bytes = manifest.shard_elements * 4;  // < 2^62: no overflow
  for (int r = 0; r < manifest.world_size; ++r) {
    ZINF_ASSIGN_OR_RETURN(ShardReader reader,
                          ShardReader::Open(dir + "/" + ShardFileName(r), manifest.tag, r));
    ZINF_ASSIGN_OR_RETURN(const uint64_t bytes, reader.SectionBytes("params"));
    if (bytes != section_bytes) {
      return DataLoss(fmt::format("{}/{}: 'params' has {} bytes, the manifest says {}", dir,
                                  ShardFileName(r), bytes, section_bytes));
    }
    ZINF_RETURN_IF_ERROR(reader.Verify("params"));
    shards.push_back(std::move(reader));
  }
  // The module buffers, replicated: rank 0's, as saved. Read whole (they are small: running
  // statistics and counters), checked against the manifest and their checksum.
  std::string buffers;
  if (!manifest.buffers.empty()) {
    uint64_t total = 0;
    for (const ManifestBuffer& b : manifest.buffers) total += b.bytes;  // validated: no overflow
    ZINF_ASSIGN_OR_RETURN(const uint64_t bytes, shards[0].SectionBytes("buffers"));
    if (bytes != total) {
      return DataLoss(fmt::format("{}/{}: 'buffers' has {} bytes, the manifest says {}", dir,
                                  ShardFileName(0), bytes, total));
    }
    ZINF_RETURN_IF_ERROR(shards[0].Verify("buffers", [&](const char* data, uint64_t n) {
      buffers.append(data, n);
      return OkStatus();
    }));
  }

  const uint64_t element_bytes = dtype == ElementType::kBf16 ? 2 : 4;
  nlohmann::ordered_json header;
  header["__metadata__"] = {
      {"format", "pt"}, {"zinf_tag", manifest.tag}, {"zinf_step", std::to_string(manifest.step)}};
  uint64_t offset = 0, largest = 0;
  for (const ManifestParam& p : manifest.params) {
    if (p.name == "__metadata__") {
      return DataLoss(
          fmt::format("{}/manifest.json: a parameter is named '__metadata__', which "
                      "safetensors reserves",
                      dir));
    }
    uint64_t bytes = 0, end = 0;
    if (__builtin_mul_overflow(p.numel, element_bytes, &bytes) ||
        __builtin_add_overflow(offset, bytes, &end)) {
      return DataLoss(
          fmt::format("{}/manifest.json: parameter '{}' of {} elements overflows the "
                      "file's offsets",
                      dir, p.name, p.numel));
    }
    header[p.name] = {{"dtype", SafetensorsDtypeName(dtype)},
                      {"shape", p.shape},
                      {"data_offsets", {offset, end}}};
    offset = end;
    largest = std::max(largest, p.numel);
  }
  for (const ManifestBuffer& b : manifest.buffers) {
    if (b.name == "__metadata__") {
      return DataLoss(fmt::format("{}/manifest.json: a buffer is named '__metadata__'", dir));
    }
    header[b.name] = {
        {"dtype", b.dtype}, {"shape", b.shape}, {"data_offsets", {offset, offset + b.bytes}}};
    offset += b.bytes;
  }
  std::string head = header.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  head.append((8 - head.size() % 8) % 8, ' ');
  const uint64_t head_size = head.size();
  static_assert(std::endian::native == std::endian::little);

  // One parameter at a time: the largest decides the memory.
  std::vector<float> full;
  std::vector<uint16_t> half;
  try {
    full.reserve(largest);
    if (dtype == ElementType::kBf16) half.reserve(largest);
  } catch (const std::bad_alloc&) {
    return ResourceExhausted(fmt::format(
        "exporting {}: the largest parameter has {} elements, {} bytes of buffers, which this "
        "process cannot allocate",
        dir, largest, largest * (4 + (dtype == ElementType::kBf16 ? 2 : 0))));
  }

  TempOutput out(out_file);
  ZINF_RETURN_IF_ERROR(out.Open());
  ZINF_RETURN_IF_ERROR(out.Write(&head_size, 8));
  ZINF_RETURN_IF_ERROR(out.Write(head.data(), head.size()));
  for (const ManifestParam& p : manifest.params) {
    full.resize(p.numel);
    for (int r = 0; r < manifest.world_size; ++r) {
      const uint64_t begin = r * p.shard_size;
      if (begin >= p.numel) break;
      const uint64_t count = std::min(p.shard_size, p.numel - begin);
      ZINF_RETURN_IF_ERROR(
          shards[r].Read("params", p.flat_offset * 4, full.data() + begin, count * 4));
    }
    if (dtype == ElementType::kBf16) {
      half.resize(p.numel);
      for (uint64_t i = 0; i < p.numel; ++i) half[i] = ToBf16(full[i]);
      ZINF_RETURN_IF_ERROR(out.Write(half.data(), half.size() * 2));
    } else {
      ZINF_RETURN_IF_ERROR(out.Write(full.data(), full.size() * 4));
    }
  }
  ZINF_RETURN_IF_ERROR(out.Write(buffers.data(), buffers.size()));
  return out.Commit();
}

}  // namespace

Status ExportSafetensors(const std::string& path, const std::string& out_file, ElementType dtype) {
  if (dtype != ElementType::kFp32 && dtype != ElementType::kBf16) {
    return InvalidArgument(
        fmt::format("export dtype must be fp32 or bf16, got {}", ElementTypeName(dtype)));
  }
  try {
    return Export(path, out_file, dtype);
  } catch (const std::bad_alloc&) {
    return ResourceExhausted(fmt::format("exporting {}: out of memory", path));
  } catch (const std::exception& e) {  // a bug: say so rather than abort
    return Internal(fmt::format("exporting {}: unexpected exception: {}", path, e.what()));
  }
}

}  // namespace zinf::ckpt
