// The on-disk checkpoint format, shared by the engine (save, load) and `zinf ckpt export`.
//
//   DIR/latest                     the tag of the newest complete checkpoint (one line)
//   DIR/<tag>/manifest.json        world size, step, parameters and their shard layout,
//                                  engine and trainer state; written by rank 0, after every
//                                  rank's shard file is complete
//   DIR/<tag>/rank-<r>.zshard      rank r's sections (fp32 master shard, optimizer state
//                                  arrays, optimizer scalars), each with a CRC32C
//
// Every file is written under a temporary name, fsynced and renamed, and `latest` is replaced
// last, so a crash at any moment leaves the previous checkpoint loadable (See Note [Atomic
// checkpoints] in checkpoint.cc).
//
// A shard file is its sections back to back, each starting at a multiple of 4096, then a
// JSON trailer that lists them (name, offset, bytes, crc32c) with the tag and rank, then the
// trailer's length (u64, little endian) and the magic "ZINFSHD1". A truncated or corrupt file
// is DataLoss naming the file and what is wrong.
#ifndef ZINF_SRC_CKPT_CHECKPOINT_H_
#define ZINF_SRC_CKPT_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "zinf/status.h"

namespace zinf::ckpt {

// One parameter as the manifest records it. Rank r holds elements [r * shard_size,
// min((r + 1) * shard_size, numel)) at `flat_offset` of its "params" section.
struct ManifestParam {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t numel = 0;
  uint64_t shard_size = 0;
  uint64_t flat_offset = 0;
};

struct Manifest {
  std::string tag;
  int world_size = 0;
  int64_t step = 0;
  uint64_t shard_elements = 0;  // elements per rank in each state section
  std::vector<ManifestParam> params;
  std::string engine_state = "{}";  // JSON: the engine's scalars (loss scaler...)
  std::string client_state = "{}";  // JSON: the trainer's (data position...)
};

std::string ShardFileName(int rank);  // "rank-00003.zshard"

// ---- Writing ----

// Writes a shard file. Sections are declared with their sizes first (Add), then each is
// written front to back (Write), sections in any interleaving: how NVMe-resident state is
// streamed out chunk by chunk, each chunk carrying a piece of several sections. Commit writes
// the trailer, fsyncs and renames the file into place.
class ShardWriter {
 public:
  // Opens `path` + ".tmp" for writing.
  static StatusOr<ShardWriter> Create(const std::string& path, std::string tag, int rank);
  ShardWriter(ShardWriter&&) noexcept;
  ShardWriter& operator=(ShardWriter&&) noexcept;
  ~ShardWriter();  // an uncommitted file is removed

  Status Add(const std::string& name, uint64_t bytes);
  // Appends to the section; InvalidArgument past its declared size.
  Status Write(const std::string& name, const void* data, uint64_t bytes);
  Status Append(const std::string& name, const void* data, uint64_t bytes);  // Add + Write
  // FailedPrecondition while a section is incomplete.
  Status Commit();

 private:
  ShardWriter() = default;
  struct Section {
    std::string name;
    uint64_t offset = 0, bytes = 0, written = 0;
    uint32_t crc = 0;
  };
  std::string path_, tag_;
  int rank_ = 0;
  int fd_ = -1;
  uint64_t end_ = 0;  // end of the declared sections
  std::vector<Section> sections_;
};

// Writes manifest.json of `dir` (temporary name, fsync, rename).
Status WriteManifest(const std::string& dir, const Manifest& manifest);
// Points `root`/latest at `tag` (temporary name, fsync, rename), then removes the other
// checkpoint directories under `root` (they are older: only `latest` is ever loaded).
Status CommitLatest(const std::string& root, const std::string& tag);

// ---- Reading ----

// The checkpoint directory `path` names: `path` itself when it holds a manifest, else
// `path`/<contents of path/latest>. InvalidArgument when neither exists.
StatusOr<std::string> ResolveCheckpoint(const std::string& path);
StatusOr<Manifest> ReadManifest(const std::string& dir);

// A shard file whose trailer has been read and checked (magic, length, section bounds
// against the file size, tag and rank).
class ShardReader {
 public:
  static StatusOr<ShardReader> Open(const std::string& path, const std::string& tag, int rank);
  ShardReader(ShardReader&&) noexcept;
  ShardReader& operator=(ShardReader&&) noexcept;
  ~ShardReader();

  bool HasSection(const std::string& name) const;
  StatusOr<uint64_t> SectionBytes(const std::string& name) const;
  // Reads `bytes` at `offset` within the section. Does not verify the checksum.
  Status Read(const std::string& name, uint64_t offset, void* out, uint64_t bytes) const;
  // Reads the whole section in pieces of at most `piece` bytes, verifying its CRC32C; `sink`
  // (optional) sees each piece in order. DataLoss names the file and section on a mismatch.
  Status Verify(const std::string& name,
                const std::function<Status(const char* data, uint64_t bytes)>& sink = nullptr,
                uint64_t piece = 16ull << 20) const;

 private:
  ShardReader() = default;
  struct Section {
    uint64_t offset = 0, bytes = 0;
    uint32_t crc = 0;
  };
  StatusOr<const Section*> Find(const std::string& name) const;
  std::string path_;
  int fd_ = -1;
  std::vector<std::pair<std::string, Section>> sections_;
};

// ---- Export ----

enum class ExportDType { kFp32, kBf16 };

// Consolidates the checkpoint at `path` (see ResolveCheckpoint), written by any world size,
// into one safetensors file: one tensor per parameter with its full shape. Memory: one
// parameter at a time. Every rank file's "params" section is verified first.
Status ExportSafetensors(const std::string& path, const std::string& out_file, ExportDType dtype);

}  // namespace zinf::ckpt

#endif  // ZINF_SRC_CKPT_CHECKPOINT_H_
