// `zinf ckpt export`: any world size's shards → one safetensors file.
//
// safetensors: an 8-byte little-endian header length, a JSON header mapping each tensor name
// to {dtype, shape, data_offsets: [begin, end)} relative to the data, then the data. The
// header is padded with spaces to a multiple of 8 so that the data is aligned. Parameters are
// written in manifest order, each assembled from its rank pieces in a buffer of its own size,
// so the memory used is that of the largest parameter, whatever the model size.
#include <fcntl.h>
#include <fmt/core.h>
#include <unistd.h>

#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "ckpt/checkpoint.h"

namespace zinf::ckpt {
namespace {

// fp32 → bf16 with round-to-nearest-even; NaN stays NaN.
uint16_t ToBf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((bits >> 16) | 0x40);
  return static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

}  // namespace

Status ExportSafetensors(const std::string& path, const std::string& out_file, ExportDType dtype) {
  ZINF_ASSIGN_OR_RETURN(const std::string dir, ResolveCheckpoint(path));
  ZINF_ASSIGN_OR_RETURN(const Manifest manifest, ReadManifest(dir));
  std::vector<ShardReader> shards;
  for (int r = 0; r < manifest.world_size; ++r) {
    ZINF_ASSIGN_OR_RETURN(ShardReader reader,
                          ShardReader::Open(dir + "/" + ShardFileName(r), manifest.tag, r));
    ZINF_ASSIGN_OR_RETURN(const uint64_t bytes, reader.SectionBytes("params"));
    if (bytes != manifest.shard_elements * 4) {
      return DataLoss(fmt::format("{}/{}: 'params' has {} bytes, the manifest says {}", dir,
                                  ShardFileName(r), bytes, manifest.shard_elements * 4));
    }
    ZINF_RETURN_IF_ERROR(reader.Verify("params"));
    shards.push_back(std::move(reader));
  }

  const uint64_t element_bytes = dtype == ExportDType::kBf16 ? 2 : 4;
  nlohmann::ordered_json header;
  header["__metadata__"] = {
      {"format", "pt"}, {"zinf_tag", manifest.tag}, {"zinf_step", std::to_string(manifest.step)}};
  uint64_t offset = 0;
  for (const ManifestParam& p : manifest.params) {
    header[p.name] = {{"dtype", dtype == ExportDType::kBf16 ? "BF16" : "F32"},
                      {"shape", p.shape},
                      {"data_offsets", {offset, offset + p.numel * element_bytes}}};
    offset += p.numel * element_bytes;
  }
  std::string head = header.dump();
  head.append((8 - head.size() % 8) % 8, ' ');
  const uint64_t head_size = head.size();
  static_assert(std::endian::native == std::endian::little);

  const std::string tmp = out_file + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, fmt::format("creating {}", tmp));
  auto write = [&](const void* data, size_t bytes) -> Status {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::write(fd, p, bytes);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoStatus(errno, fmt::format("writing {}", tmp));
      p += n;
      bytes -= n;
    }
    return OkStatus();
  };
  Status s = write(&head_size, 8);
  if (s.ok()) s = write(head.data(), head.size());
  std::vector<float> full;
  std::vector<uint16_t> half;
  for (const ManifestParam& p : manifest.params) {
    if (!s.ok()) break;
    full.resize(p.numel);
    for (int r = 0; r < manifest.world_size && s.ok(); ++r) {
      const uint64_t begin = r * p.shard_size;
      if (begin >= p.numel) break;
      const uint64_t count = std::min(p.shard_size, p.numel - begin);
      s = shards[r].Read("params", p.flat_offset * 4, full.data() + begin, count * 4);
    }
    if (!s.ok()) break;
    if (dtype == ExportDType::kBf16) {
      half.resize(p.numel);
      for (uint64_t i = 0; i < p.numel; ++i) half[i] = ToBf16(full[i]);
      s = write(half.data(), half.size() * 2);
    } else {
      s = write(full.data(), full.size() * 4);
    }
  }
  if (s.ok() && fsync(fd) != 0) s = ErrnoStatus(errno, fmt::format("fsync of {}", tmp));
  close(fd);
  if (s.ok() && rename(tmp.c_str(), out_file.c_str()) != 0) {
    s = ErrnoStatus(errno, fmt::format("renaming {} to {}", tmp, out_file));
  }
  if (!s.ok()) unlink(tmp.c_str());
  return s;
}

}  // namespace zinf::ckpt
