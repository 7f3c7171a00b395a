// `zinf ckpt export`: any world size's shards → one safetensors file.
//
// safetensors: an 8-byte little-endian header length, a JSON header mapping each tensor name
// to {dtype, shape, data_offsets: [begin, end)} relative to the data, then the data. The
// header is padded with spaces to a multiple of 8 so that the data is aligned. Module buffers
// follow the parameters in their saved dtype (--dtype converts parameters only, as DeepSpeed's
// zero_to_fp32 keeps buffers as they are). Parameters are
// written in manifest order, each assembled from its rank pieces in a buffer of its own size,
// so the memory used is that of the largest parameter, whatever the model size.
#include "ckpt/export.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <new>
#include <nlohmann/json.hpp>
#include <vector>

#include "ckpt/safetensors.h"
#include "zinf/dtype.h"

namespace zinf::ckpt {

// ---- ConsolidatedCheckpoint ----

StatusOr<ConsolidatedCheckpoint> ConsolidatedCheckpoint::Open(const std::string& path) {
  ConsolidatedCheckpoint c;
  ZINF_ASSIGN_OR_RETURN(c.dir_, ResolveCheckpoint(path));
  ZINF_ASSIGN_OR_RETURN(c.manifest_, ReadManifest(c.dir_));
  const std::string& dir = c.dir_;
  const Manifest& manifest = c.manifest_;
  // ReadManifest has checked the manifest on its own; what follows checks it against the
  // shard files before anything is allocated or written.
  const uint64_t section_bytes = manifest.params_elements() * 4;  // < 2^63: no overflow
  for (int r = 0; r < manifest.world_size; ++r) {
    ZINF_ASSIGN_OR_RETURN(ShardReader reader,
                          ShardReader::Open(dir + "/" + ShardFileName(r), manifest.tag, r));
    ZINF_ASSIGN_OR_RETURN(const uint64_t bytes, reader.SectionBytes("params"));
    if (bytes != section_bytes) {
      return DataLoss(fmt::format("{}/{}: 'params' has {} bytes, the manifest says {}", dir,
                                  ShardFileName(r), bytes, section_bytes));
    }
    ZINF_RETURN_IF_ERROR(reader.Verify("params"));
    c.shards_.push_back(std::move(reader));
  }
  // The module buffers, replicated: rank 0's, as saved. Read whole (they are small: running
  // statistics and counters), checked against the manifest and their checksum.
  uint64_t total = 0;
  for (const ManifestBuffer& b : manifest.buffers) {
    c.buffer_offset_.push_back(total);
    total += b.bytes;  // validated: no overflow
  }
  if (!manifest.buffers.empty()) {
    ZINF_ASSIGN_OR_RETURN(const uint64_t bytes, c.shards_[0].SectionBytes("buffers"));
    if (bytes != total) {
      return DataLoss(fmt::format("{}/{}: 'buffers' has {} bytes, the manifest says {}", dir,
                                  ShardFileName(0), bytes, total));
    }
    ZINF_RETURN_IF_ERROR(c.shards_[0].Verify("buffers", [&](const char* data, uint64_t n) {
      c.buffers_.append(data, n);
      return OkStatus();
    }));
  }
  return c;
}

Status ConsolidatedCheckpoint::ReadParam(size_t i, float* out) const {
  const ManifestParam& p = manifest_.params.at(i);
  for (int r = 0; r < manifest_.world_size; ++r) {
    const uint64_t begin = r * p.shard_size;
    if (begin >= p.numel) break;
    const uint64_t count = std::min(p.shard_size, p.numel - begin);
    ZINF_RETURN_IF_ERROR(shards_[r].Read("params", p.flat_offset * 4, out + begin, count * 4));
  }
  return OkStatus();
}

std::string_view ConsolidatedCheckpoint::Buffer(size_t i) const {
  return std::string_view(buffers_).substr(buffer_offset_.at(i), manifest_.buffers.at(i).bytes);
}

// ---- SafetensorsWriter ----

SafetensorsWriter::SafetensorsWriter(std::string out_file, uint64_t data_bytes)
    : out_(std::move(out_file)), tmp_(out_ + ".tmp"), data_bytes_(data_bytes) {}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) close(fd_);
  if (!committed_) unlink(tmp_.c_str());
}

StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& out_file, const std::vector<SafetensorsEntry>& entries,
    const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    if (e.name == "__metadata__") {
      return DataLoss(fmt::format(
          "{}: a tensor is named '__metadata__', which safetensors reserves", out_file));
    }
    uint64_t end = 0;
    if (__builtin_add_overflow(offset, e.bytes, &end)) {
      return DataLoss(fmt::format("{}: tensor '{}' of {} bytes overflows the file's offsets",
                                  out_file, e.name, e.bytes));
    }
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string head = header.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  head.append((8 - head.size() % 8) % 8, ' ');
  const uint64_t head_size = head.size();
  static_assert(std::endian::native == std::endian::little);

  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter(out_file, offset));
  w->fd_ = open(w->tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd_ < 0) return ErrnoStatus(errno, fmt::format("creating {}", w->tmp_));
  ZINF_RETURN_IF_ERROR(w->Write(&head_size, 8));
  ZINF_RETURN_IF_ERROR(w->Write(head.data(), head.size()));
  w->written_ = 0;  // counts data only
  return w;
}

Status SafetensorsWriter::Write(const void* data, uint64_t bytes) {
  const char* p = static_cast<const char*>(data);
  written_ += bytes;
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, std::min<uint64_t>(bytes, 1ull << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, fmt::format("writing {}", tmp_));
    p += n;
    bytes -= n;
  }
  return OkStatus();
}

Status SafetensorsWriter::Commit() {
  if (written_ != data_bytes_) {
    return FailedPrecondition(fmt::format("{}: {} bytes of data written, the header lists {}", tmp_,
                                          written_, data_bytes_));
  }
  if (fsync(fd_) != 0) return ErrnoStatus(errno, fmt::format("fsync of {}", tmp_));
  close(fd_);
  fd_ = -1;
  if (rename(tmp_.c_str(), out_.c_str()) != 0) {
    return ErrnoStatus(errno, fmt::format("renaming {} to {}", tmp_, out_));
  }
  committed_ = true;
  return OkStatus();
}

namespace {

Status Export(const std::string& path, const std::string& out_file, ElementType dtype) {
  ZINF_ASSIGN_OR_RETURN(const ConsolidatedCheckpoint ckpt, ConsolidatedCheckpoint::Open(path));
  const Manifest& manifest = ckpt.manifest();
  std::vector<SafetensorsEntry> entries;
  uint64_t largest = 0;
  for (const ManifestParam& p : manifest.params) {
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(p.numel, ElementSize(dtype), &bytes)) {
      return DataLoss(
          fmt::format("{}/manifest.json: parameter '{}' of {} elements overflows the "
                      "file's offsets",
                      ckpt.dir(), p.name, p.numel));
    }
    entries.push_back({p.name, std::string(SafetensorsDtypeName(dtype)), p.shape, bytes});
    largest = std::max(largest, p.numel);
  }
  for (const ManifestBuffer& b : manifest.buffers) {
    entries.push_back({b.name, b.dtype, b.shape, b.bytes});
  }
  // One parameter at a time: the largest decides the memory.
  std::vector<float> full;
  std::vector<char> converted;
  try {
    full.reserve(largest);
    if (dtype != ElementType::kFp32) converted.reserve(largest * ElementSize(dtype));
  } catch (const std::bad_alloc&) {
    return ResourceExhausted(fmt::format(
        "exporting {}: the largest parameter has {} elements, {} bytes of buffers, which this "
        "process cannot allocate",
        ckpt.dir(), largest, largest * (4 + (dtype != ElementType::kFp32 ? 2 : 0))));
  }
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> out,
                        SafetensorsWriter::Create(out_file, entries,
                                                  {{"format", "pt"},
                                                   {"zinf_tag", manifest.tag},
                                                   {"zinf_step", std::to_string(manifest.step)}}));
  for (size_t i = 0; i < manifest.params.size(); ++i) {
    const uint64_t numel = manifest.params[i].numel;
    full.resize(numel);
    ZINF_RETURN_IF_ERROR(ckpt.ReadParam(i, full.data()));
    if (dtype == ElementType::kFp32) {
      ZINF_RETURN_IF_ERROR(out->Write(full.data(), numel * 4));
    } else {
      converted.resize(numel * ElementSize(dtype));
      ConvertFromFp32(full.data(), dtype, converted.data(), numel);
      ZINF_RETURN_IF_ERROR(out->Write(converted.data(), converted.size()));
    }
  }
  for (size_t i = 0; i < manifest.buffers.size(); ++i) {
    const std::string_view bytes = ckpt.Buffer(i);
    ZINF_RETURN_IF_ERROR(out->Write(bytes.data(), bytes.size()));
  }
  return out->Commit();
}

}  // namespace

Status GuardedExport(const std::string& path, ElementType dtype,
                     const std::function<Status()>& export_fn) {
  if (dtype != ElementType::kFp32 && dtype != ElementType::kBf16 && dtype != ElementType::kFp16) {
    return InvalidArgument(
        fmt::format("export dtype must be fp32, bf16 or fp16, got {}", ElementTypeName(dtype)));
  }
  try {
    return export_fn();
  } catch (const std::bad_alloc&) {
    return ResourceExhausted(fmt::format("exporting {}: out of memory", path));
  } catch (const std::exception& e) {  // a bug: say so rather than abort
    return Internal(fmt::format("exporting {}: unexpected exception: {}", path, e.what()));
  }
}

Status ExportSafetensors(const std::string& path, const std::string& out_file, ElementType dtype) {
  return GuardedExport(path, dtype, [&] { return Export(path, out_file, dtype); });
}

}  // namespace zinf::ckpt
