// Note [Atomic checkpoints]
// A checkpoint is committed by two renames, each of a file that is complete and fsynced:
// first every rank renames its shard file into DIR/<tag>/ and rank 0, once all have, renames
// the manifest there; then rank 0 renames DIR/latest to name <tag>. Readers follow `latest`,
// so until the second rename they see the previous checkpoint, untouched (a new tag is a new
// directory). Only after it are older tag directories removed. The directory entries
// themselves are fsynced after each rename so that the rename survives a power loss.
#include <fcntl.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

#include "ckpt/checkpoint.h"
#include "ckpt/checkpoint_internal.h"
#include "core/crc32c.h"

namespace zinf::ckpt {
namespace {

namespace fs = std::filesystem;
using namespace internal;  // NOLINT: the format's constants and canonical text

constexpr uint64_t kAlign = 4096;

Status WriteAll(int fd, const void* data, uint64_t bytes, uint64_t offset,
                const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = pwrite(fd, p, std::min<uint64_t>(bytes, 1ull << 30), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, fmt::format("writing {}", path));
    }
    p += n;
    bytes -= n;
    offset += n;
  }
  return OkStatus();
}

Status SyncDirectory(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return ErrnoStatus(errno, fmt::format("opening directory {}", dir));
  const int rc = fsync(fd);
  const int err = errno;
  close(fd);
  return rc == 0 ? OkStatus() : ErrnoStatus(err, fmt::format("fsync of directory {}", dir));
}

uint64_t AlignUp(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

}  // namespace

namespace internal {

Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, fmt::format("creating {}", tmp));
  Status s = WriteAll(fd, text.data(), text.size(), 0, tmp);
  if (s.ok() && fsync(fd) != 0) s = ErrnoStatus(errno, fmt::format("fsync of {}", tmp));
  close(fd);
  if (s.ok() && rename(tmp.c_str(), path.c_str()) != 0) {
    s = ErrnoStatus(errno, fmt::format("renaming {} to {}", tmp, path));
  }
  if (!s.ok()) {
    unlink(tmp.c_str());
    return s;
  }
  return SyncDirectory(fs::path(path).parent_path().string());
}

}  // namespace internal

// ---- ShardWriter ----

StatusOr<ShardWriter> ShardWriter::Create(const std::string& path, std::string tag, int rank) {
  ShardWriter w;
  w.path_ = path;
  w.tag_ = std::move(tag);
  w.rank_ = rank;
  const std::string tmp = path + ".tmp";
  w.fd_ = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w.fd_ < 0) return ErrnoStatus(errno, fmt::format("creating checkpoint file {}", tmp));
  return w;
}

ShardWriter::ShardWriter(ShardWriter&& o) noexcept { *this = std::move(o); }

ShardWriter& ShardWriter::operator=(ShardWriter&& o) noexcept {
  std::swap(path_, o.path_);
  std::swap(tag_, o.tag_);
  std::swap(rank_, o.rank_);
  std::swap(fd_, o.fd_);
  std::swap(end_, o.end_);
  std::swap(sections_, o.sections_);
  return *this;
}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) {
    close(fd_);
    unlink((path_ + ".tmp").c_str());
  }
}

Status ShardWriter::Add(const std::string& name, uint64_t bytes) {
  if (fd_ < 0) return FailedPrecondition("ShardWriter::Add after Commit");
  end_ = AlignUp(end_);
  sections_.push_back({name, end_, bytes, 0, 0});
  end_ += bytes;
  return OkStatus();
}

Status ShardWriter::Write(const std::string& name, const void* data, uint64_t bytes) {
  auto it = std::find_if(sections_.begin(), sections_.end(),
                         [&](const Section& s) { return s.name == name; });
  if (it == sections_.end() || it->written + bytes > it->bytes) {
    return InvalidArgument(
        fmt::format("{}: {} bytes for section '{}' do not fit it", path_, bytes, name));
  }
  ZINF_RETURN_IF_ERROR(WriteAll(fd_, data, bytes, it->offset + it->written, path_ + ".tmp"));
  it->crc = Crc32c(data, bytes, it->crc);
  it->written += bytes;
  return OkStatus();
}

Status ShardWriter::Append(const std::string& name, const void* data, uint64_t bytes) {
  ZINF_RETURN_IF_ERROR(Add(name, bytes));
  return Write(name, data, bytes);
}

Status ShardWriter::Commit() {
  if (fd_ < 0) return FailedPrecondition("ShardWriter::Commit twice");
  for (const Section& s : sections_) {
    if (s.written != s.bytes) {
      return FailedPrecondition(fmt::format("{}: section '{}' has {} of its {} bytes", path_,
                                            s.name, s.written, s.bytes));
    }
  }
  nlohmann::json trailer = {
      {"format_version", kShardFormatVersion}, {"tag", tag_}, {"rank", rank_}};
  for (const Section& s : sections_) {
    trailer["sections"].push_back(
        {{"name", s.name}, {"offset", s.offset}, {"bytes", s.bytes}, {"crc32c", s.crc}});
  }
  std::string tail = trailer.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const uint64_t length = tail.size();
  static_assert(std::endian::native == std::endian::little);
  tail.append(reinterpret_cast<const char*>(&length), 8);
  tail.append(kMagic, 8);
  const std::string tmp = path_ + ".tmp";
  ZINF_RETURN_IF_ERROR(WriteAll(fd_, tail.data(), tail.size(), end_, tmp));
  if (fsync(fd_) != 0) return ErrnoStatus(errno, fmt::format("fsync of {}", tmp));
  close(fd_);
  fd_ = -1;
  if (rename(tmp.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return ErrnoStatus(err, fmt::format("renaming {} to {}", tmp, path_));
  }
  return SyncDirectory(fs::path(path_).parent_path().string());
}

// ---- Manifest ----

StatusOr<std::string> SerializeManifest(const Manifest& m) {
  ZINF_RETURN_IF_ERROR_CTX(ValidateManifest(m), "checkpoint manifest " + m.tag);
  nlohmann::json params = nlohmann::json::array();
  for (const ManifestParam& p : m.params) {
    params.push_back({{"name", p.name},
                      {"shape", p.shape},
                      {"numel", p.numel},
                      {"shard_size", p.shard_size},
                      {"flat_offset", p.flat_offset}});
    if (p.frozen) params.back()["frozen"] = true;
  }
  ZINF_ASSIGN_OR_RETURN(nlohmann::json engine_state, ParseObject(m.engine_state, "engine_state"));
  ZINF_ASSIGN_OR_RETURN(nlohmann::json client_state, ParseObject(m.client_state, "client_state"));
  ZINF_ASSIGN_OR_RETURN(nlohmann::json metadata, ParseObject(m.metadata, "metadata"));
  nlohmann::json json = {{"format", "zinf-checkpoint"},
                         {"format_version", m.frozen_elements > 0 ? kManifestVersion
                                            : !metadata.empty()   ? kManifestVersionWithoutFrozen
                                            : !m.buffers.empty()  ? kManifestVersionWithoutMetadata
                                                                  : kManifestVersionWithoutBuffers},
                         {"tag", m.tag},
                         {"world_size", m.world_size},
                         {"step", m.step},
                         {"shard_elements", m.shard_elements},
                         {"params", std::move(params)},
                         {"engine_state", std::move(engine_state)},
                         {"client_state", std::move(client_state)}};
  if (m.frozen_elements > 0) json["frozen_elements"] = m.frozen_elements;
  if (!m.buffers.empty()) {
    nlohmann::json buffers = nlohmann::json::array();
    for (const ManifestBuffer& b : m.buffers) {
      buffers.push_back(
          {{"name", b.name}, {"dtype", b.dtype}, {"shape", b.shape}, {"bytes", b.bytes}});
    }
    json["buffers"] = std::move(buffers);
  }
  if (!metadata.empty()) json["metadata"] = std::move(metadata);
  json["checksum"] = ManifestChecksum(json);
  return Dump(json, 1) + "\n";
}

Status WriteManifest(const std::string& dir, const Manifest& m) {
  ZINF_ASSIGN_OR_RETURN(const std::string text, SerializeManifest(m));
  return WriteFileAtomically(dir + "/manifest.json", text);
}

namespace {

// What a save writes into a tag directory before its manifest commits it.
bool IsUncommittedSaveFile(const fs::directory_entry& entry) {
  std::error_code ec;
  if (entry.symlink_status(ec).type() != fs::file_type::regular) return false;
  const std::string name = entry.path().filename().string();
  return name == "manifest.json.tmp" ||
         (name.starts_with("rank-") &&
          (name.ends_with(".zshard") || name.ends_with(".zshard.tmp")));
}

// A directory that a save created and never committed: no manifest, and nothing in it but
// what a save writes (so a directory of the user's is never taken for one).
bool IsAbandonedSave(const fs::path& dir) {
  std::error_code ec;
  if (fs::symlink_status(dir, ec).type() != fs::file_type::directory) return false;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!IsUncommittedSaveFile(*it)) return false;  // a manifest, or not zinf's
  }
  return !ec;
}

}  // namespace

Status CommitLatest(const std::string& root, const std::string& tag) {
  ZINF_RETURN_IF_ERROR(CheckTag(tag));
  ZINF_RETURN_IF_ERROR(WriteFileAtomically(root + "/latest", tag + "\n"));
  // Failing to delete an old checkpoint loses nothing: errors end the cleanup, quietly.
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code entry_ec;
    if (it->path().filename() == tag) continue;
    // A link is never followed: only real directories of ours are removed, older checkpoints
    // and saves that were killed before they committed.
    if ((it->symlink_status(entry_ec).type() == fs::file_type::directory &&
         fs::is_regular_file(it->path() / "manifest.json", entry_ec)) ||
        IsAbandonedSave(it->path())) {
      fs::remove_all(it->path(), entry_ec);
    }
  }
  return OkStatus();
}

void RemoveUncommittedShard(const std::string& tag_dir, int rank) {
  const std::string shard = tag_dir + "/" + ShardFileName(rank);
  std::error_code ec;
  if (fs::exists(tag_dir + "/manifest.json", ec)) return;  // committed after all
  fs::remove(shard, ec);
  fs::remove(shard + ".tmp", ec);
  if (rank == 0) fs::remove(tag_dir + "/manifest.json.tmp", ec);
  fs::remove(tag_dir, ec);  // only when empty: the last rank to clean up removes it
}

}  // namespace zinf::ckpt
