// The on-disk checkpoint format, shared by the engine (save, load) and `zinf ckpt export`.
//
//   DIR/latest                     the tag of the newest complete checkpoint (one line): a
//                                  plain name of a directory in DIR (see CheckTag)
//   DIR/<tag>/manifest.json        world size, step, parameters and their shard layout,
//                                  engine and trainer state, and a checksum; written by rank
//                                  0, after every rank's shard file is complete
//   DIR/<tag>/rank-<r>.zshard      rank r's sections (fp32 master shard, optimizer state
//                                  arrays, optimizer scalars; rank 0's also "buffers"), each
//                                  with a CRC32C
//
// Every file is written under a temporary name, fsynced and renamed, and `latest` is replaced
// last, so a crash at any moment leaves the previous checkpoint loadable (See Note [Atomic
// checkpoints] in checkpoint.cc).
//
// The manifest is a JSON object (format_version 2): "format": "zinf-checkpoint", tag,
// world_size, step, shard_elements, params (name, shape, numel, shard_size, flat_offset),
// engine_state, client_state, and "checksum": "crc32c:<8 hex digits>", the CRC32C of the
// compact dump (nlohmann's dump(), keys sorted) of the object without "checksum". Version 1
// (zinf 0.1 before checksums) has no checksum and is still read, with every other check and a
// warning; nothing then protects its values from an edit or a bit flip that leaves them
// consistent (a step count, a learning-rate schedule's state, the client_state, a parameter's
// name or shape that still matches its shard). Where that matters, set
// ZINF_CHECKPOINT_STRICT=1: version 1 manifests are then refused (kStrictCheckpointsEnv).
// Version 3 adds "buffers" (name, dtype, shape, bytes): the model's module buffers (BatchNorm's
// running statistics), replicated rather than sharded as DeepSpeed keeps them, rank 0's values
// back to back in rank 0's "buffers" section; a checkpoint without buffers is still written as
// version 2, which older builds read. Version 4 adds "metadata", a JSON object describing the
// model that resuming does not need and `zinf ckpt export --hf` reads (Engine::
// SetCheckpointMetadata): "hf_config", the Hugging Face config of a transformers model
// (zinf.zero writes it), "zinf_gpt", the GPT example's model config; a checkpoint with no
// metadata is written as version 3 (or 2). Version 5 adds frozen parameters ("frozen": true
// in their entry, Note [Frozen parameters] in src/zero/partition.h), which have values but no
// optimizer state: "frozen_elements" per rank of them follow the shard_elements in the
// "params" section alone; a checkpoint without them is written as version 4 (or older).
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
#include <string_view>
#include <vector>

#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf::ckpt {

// One parameter as the manifest records it. Rank r holds elements [r * shard_size,
// min((r + 1) * shard_size, numel)) at `flat_offset` of its "params" section. numel is the
// product of the shape (1 for a scalar, shape []); shard_size is numel / world_size rounded up.
struct ManifestParam {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t numel = 0;
  uint64_t shard_size = 0;
  uint64_t flat_offset = 0;
  bool frozen = false;  // values only: its elements lie past shard_elements
};

// A module buffer: `dtype` is its safetensors name (F32, F64, F16, BF16, I64, I32, I16, I8,
// U8, BOOL), `bytes` the product of the shape times the element size.
struct ManifestBuffer {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
};

// The element size of a buffer dtype (see ManifestBuffer); 0 for a name not in the list.
uint64_t BufferDtypeBytes(std::string_view dtype);

struct Manifest {
  std::string tag;
  int world_size = 0;
  int64_t step = 0;
  uint64_t shard_elements = 0;  // elements per rank in each state section
  // Elements per rank of the frozen parameters, after shard_elements in "params" alone.
  uint64_t frozen_elements = 0;
  // Elements per rank in the "params" section.
  uint64_t params_elements() const { return shard_elements + frozen_elements; }
  std::vector<ManifestParam> params;
  std::string engine_state = "{}";      // JSON: the engine's scalars (loss scaler...)
  std::string client_state = "{}";      // JSON: the trainer's (data position...)
  std::vector<ManifestBuffer> buffers;  // in rank 0's "buffers" section, in this order
  std::string metadata = "{}";          // JSON: descriptions of the model (see above)
};

std::string ShardFileName(int rank);  // "rank-00003.zshard"

// OK when `tag` may name a checkpoint directory: a plain file name (not empty, at most 255
// bytes, no '/' or NUL, not starting with '.'), so that DIR/<tag> is a child of DIR.
// InvalidArgument naming the tag otherwise.
Status CheckTag(std::string_view tag);

// Checks a manifest on its own: a valid tag, world_size in [1, 2^24], step >= 0, a
// non-empty list of uniquely named parameters whose shapes are non-negative and give numel,
// whose shard_size is numel / world_size rounded up and whose shards lie within
// shard_elements (a frozen one's past it, within params_elements()) without overlapping (all
// arithmetic checked for overflow), and
// engine_state, client_state and metadata JSON objects (engine_state with the scalars the
// engine reads), and buffers uniquely named apart from the parameters, of a known dtype, whose
// bytes match their shape. InvalidArgument naming the parameter, the field, its value and what was
// expected.
Status ValidateManifest(const Manifest& manifest);

// ---- Writing (checkpoint_write.cc) ----

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

// The manifest's JSON text with its checksum (what WriteManifest writes); InvalidArgument when
// ValidateManifest refuses it.
StatusOr<std::string> SerializeManifest(const Manifest& manifest);
// Writes manifest.json of `dir` (temporary name, fsync, rename).
Status WriteManifest(const std::string& dir, const Manifest& manifest);
// Points `root`/latest at `tag` (temporary name, fsync, rename), then removes the other
// checkpoint directories under `root` (they are older: only `latest` is ever loaded).
// Also removes what saves killed before their commit left there (directories without a
// manifest holding only shard and temporary files).
Status CommitLatest(const std::string& root, const std::string& tag);
// After a save of `tag_dir` failed before its manifest was written: removes rank `rank`'s
// shard file (committed or temporary; rank 0 also the manifest's temporary file), and the
// directory once empty. Best effort, never fails: what it leaves, CommitLatest removes.
void RemoveUncommittedShard(const std::string& tag_dir, int rank);

// ---- Reading (checkpoint_read.cc) ----

// The checkpoint directory `path` names: `path` itself when it holds a manifest, else
// `path`/<contents of path/latest>. InvalidArgument when neither exists; DataLoss when
// `latest` names something other than a directory in `path` (see CheckTag) or one without a
// manifest; IoError (with the OS's reason) when `path` cannot be searched or read.
StatusOr<std::string> ResolveCheckpoint(const std::string& path);

// Parses manifest.json's text without touching the disk (the entry point for fuzzing): checks
// the format, the version, the checksum and then ValidateManifest. Never throws, whatever the
// bytes. `source` (the file's path) prefixes errors. DataLoss for a corrupt, edited or
// inconsistent manifest; FailedPrecondition for a format_version this build does not read.
// With kStrictCheckpointsEnv set to 1, a format_version 1 manifest (no checksum) is DataLoss.
inline constexpr char kStrictCheckpointsEnv[] = "ZINF_CHECKPOINT_STRICT";
StatusOr<Manifest> ParseManifest(std::string_view json, std::string_view source = "manifest.json");
// Reads and parses `dir`/manifest.json (see ParseManifest). Its consistency with the shard
// files (section sizes, checksums) is checked by their readers.
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

// Consolidates the checkpoint at `path` (see ResolveCheckpoint), written by any world size,
// into one safetensors file: one tensor per parameter with its full shape, then each module
// buffer as saved (its own dtype, from rank 0's "buffers" section). Memory: one
// parameter at a time. The manifest and every rank file's "params" section (size against
// the manifest, checksum) are verified before `out_file` is created; on any error nothing is
// left at `out_file` (an existing file there is kept as it was). `dtype`: kFp32, kBf16 or
// kFp16, else InvalidArgument. (A Hugging Face directory: ExportHf in ckpt/hf.h.)
Status ExportSafetensors(const std::string& path, const std::string& out_file, ElementType dtype);

}  // namespace zinf::ckpt

#endif  // ZINF_SRC_CKPT_CHECKPOINT_H_
