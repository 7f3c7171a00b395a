// What the checkpoint's reading and writing halves share (checkpoint_read.cc,
// checkpoint_write.cc, checkpoint.cc): the format's constants and the manifest's canonical
// text. Private to src/ckpt.
#ifndef ZINF_SRC_CKPT_CHECKPOINT_INTERNAL_H_
#define ZINF_SRC_CKPT_CHECKPOINT_INTERNAL_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "zinf/status.h"

namespace zinf::ckpt::internal {

inline constexpr char kMagic[8] = {'Z', 'I', 'N', 'F', 'S', 'H', 'D', '1'};
inline constexpr int kShardFormatVersion = 1;
// 2 added the manifest's checksum, 3 its buffers, 4 its metadata, 5 frozen parameters; 1 is
// still read (see checkpoint.h). A manifest is written as the oldest version that holds what
// it carries.
inline constexpr int kManifestVersion = 5;
inline constexpr int kManifestVersionWithoutFrozen = 4;
inline constexpr int kManifestVersionWithoutMetadata = 3;
inline constexpr int kManifestVersionWithoutBuffers = 2;
inline constexpr int kOldestManifestVersion = 1;
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 24;
// Elements per rank: 4 EiB of fp32, far past any disk, and small enough that byte counts
// (x4, x8) cannot overflow.
inline constexpr uint64_t kMaxShardElements = uint64_t{1} << 60;
// A manifest of a million parameters is about 200 MB; anything larger is not ours.
inline constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 30;

// Never throws: invalid UTF-8 (which the parser refuses anyway) is replaced.
std::string Dump(const nlohmann::json& j, int indent = -1);
// "crc32c:<8 hex digits>" of the compact dump of the manifest without its checksum.
std::string ManifestChecksum(const nlohmann::json& without_checksum);
// A JSON object from text, never throwing; `what` names it in errors (InvalidArgument).
StatusOr<nlohmann::json> ParseObject(std::string_view text, std::string_view what);
// Writes `text` to `path` atomically: temporary name, fsync, rename, fsync of the directory
// (checkpoint_write.cc).
Status WriteFileAtomically(const std::string& path, const std::string& text);

}  // namespace zinf::ckpt::internal

#endif  // ZINF_SRC_CKPT_CHECKPOINT_INTERNAL_H_
