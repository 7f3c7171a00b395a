// What `zinf ckpt export` (one safetensors file, export.cc) and `zinf ckpt export --hf` (a
// Hugging Face directory, hf_export.cc) share: a checkpoint read whole, one parameter at a
// time, and safetensors files written atomically. Private to src/ckpt.
//
// Thread-safety: one thread uses each object.
#ifndef ZINF_SRC_CKPT_EXPORT_H_
#define ZINF_SRC_CKPT_EXPORT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/checkpoint.h"
#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf::ckpt {

// A checkpoint (any world size) opened for consolidation. Open resolves `path` (see
// ResolveCheckpoint), reads the manifest and verifies every rank file's "params" section
// (size against the manifest, checksum) and rank 0's "buffers", so that a corrupt checkpoint
// is refused before anything is written.
class ConsolidatedCheckpoint {
 public:
  static StatusOr<ConsolidatedCheckpoint> Open(const std::string& path);

  const std::string& dir() const { return dir_; }
  const Manifest& manifest() const { return manifest_; }
  // The full value of manifest().params[i], numel floats into `out`, from the ranks' shards.
  Status ReadParam(size_t i, float* out) const;
  // The bytes of manifest().buffers[i], rank 0's as saved.
  std::string_view Buffer(size_t i) const;

 private:
  std::string dir_;
  Manifest manifest_;
  std::vector<ShardReader> shards_;
  std::string buffers_;                  // back to back, in the manifest's order
  std::vector<uint64_t> buffer_offset_;  // of each buffer in buffers_
};

// One tensor of a safetensors file: `dtype` a safetensors name, `bytes` its data's size.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
};

// Writes a safetensors file: the header lists `entries` (data back to back in their order,
// the header padded with spaces to a multiple of 8) and `metadata`; then Write appends the
// data, entry after entry, and Commit fsyncs it and renames it to `out_file`. Until Commit
// the file has a temporary name, removed when the writer is destroyed, so that a failure
// leaves nothing at `out_file` (an existing file there is kept as it was). DataLoss for an
// entry named "__metadata__" (safetensors reserves it) or offsets that overflow.
class SafetensorsWriter {
 public:
  static StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& out_file, const std::vector<SafetensorsEntry>& entries,
      const std::map<std::string, std::string>& metadata);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  Status Write(const void* data, uint64_t bytes);
  // FailedPrecondition when the data written is not the entries' total.
  Status Commit();

 private:
  SafetensorsWriter(std::string out_file, uint64_t data_bytes);
  std::string out_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
  uint64_t data_bytes_ = 0, written_ = 0;
};

// Runs an export of the checkpoint at `path` in parameter type `dtype`: InvalidArgument for a
// type other than kFp32, kBf16, kFp16; an exception that escapes `export_fn` becomes a Status
// (ResourceExhausted for out of memory, Internal otherwise), so none reaches the caller.
Status GuardedExport(const std::string& path, ElementType dtype,
                     const std::function<Status()>& export_fn);

}  // namespace zinf::ckpt

#endif  // ZINF_SRC_CKPT_EXPORT_H_
