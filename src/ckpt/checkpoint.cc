// Note [Atomic checkpoints]
// A checkpoint is committed by two renames, each of a file that is complete and fsynced:
// first every rank renames its shard file into DIR/<tag>/ and rank 0, once all have, renames
// the manifest there; then rank 0 renames DIR/latest to name <tag>. Readers follow `latest`,
// so until the second rename they see the previous checkpoint, untouched (a new tag is a new
// directory). Only after it are older tag directories removed. The directory entries
// themselves are fsynced after each rename so that the rename survives a power loss.
#include "ckpt/checkpoint.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/config_reader.h"
#include "nvme/crc32c.h"

namespace zinf::ckpt {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'Z', 'I', 'N', 'F', 'S', 'H', 'D', '1'};
constexpr uint64_t kAlign = 4096;
constexpr int kFormatVersion = 1;

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

Status ReadAll(int fd, void* data, uint64_t bytes, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = pread(fd, p, std::min<uint64_t>(bytes, 1ull << 30), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, fmt::format("reading {}", path));
    }
    if (n == 0) return DataLoss(fmt::format("{}: unexpected end of file at byte {}", path, offset));
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

// Writes `text` to `path` atomically: temporary name, fsync, rename, fsync of the directory.
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

uint64_t AlignUp(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

}  // namespace

std::string ShardFileName(int rank) { return fmt::format("rank-{:05d}.zshard", rank); }

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
  nlohmann::json trailer = {{"format_version", kFormatVersion}, {"tag", tag_}, {"rank", rank_}};
  for (const Section& s : sections_) {
    trailer["sections"].push_back(
        {{"name", s.name}, {"offset", s.offset}, {"bytes", s.bytes}, {"crc32c", s.crc}});
  }
  std::string tail = trailer.dump();
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

Status WriteManifest(const std::string& dir, const Manifest& m) {
  nlohmann::json params = nlohmann::json::array();
  for (const ManifestParam& p : m.params) {
    params.push_back({{"name", p.name},
                      {"shape", p.shape},
                      {"numel", p.numel},
                      {"shard_size", p.shard_size},
                      {"flat_offset", p.flat_offset}});
  }
  const nlohmann::json json = {{"format", "zinf-checkpoint"},
                               {"format_version", kFormatVersion},
                               {"tag", m.tag},
                               {"world_size", m.world_size},
                               {"step", m.step},
                               {"shard_elements", m.shard_elements},
                               {"params", params},
                               {"engine_state", nlohmann::json::parse(m.engine_state)},
                               {"client_state", nlohmann::json::parse(m.client_state)}};
  return WriteFileAtomically(dir + "/manifest.json", json.dump(1) + "\n");
}

Status CommitLatest(const std::string& root, const std::string& tag) {
  ZINF_RETURN_IF_ERROR(WriteFileAtomically(root + "/latest", tag + "\n"));
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    if (e.is_directory() && e.path().filename() != tag && fs::exists(e.path() / "manifest.json")) {
      fs::remove_all(e.path(), ec);  // an old checkpoint: failing to delete it loses nothing
    }
  }
  return OkStatus();
}

StatusOr<std::string> ResolveCheckpoint(const std::string& path) {
  if (fs::exists(fs::path(path) / "manifest.json")) return path;
  std::ifstream latest(path + "/latest");
  std::string tag;
  if (!latest || !std::getline(latest, tag) || tag.empty()) {
    return InvalidArgument(fmt::format(
        "{} is not a zinf checkpoint: it has neither manifest.json nor a 'latest' file", path));
  }
  const std::string dir = path + "/" + tag;
  if (!fs::exists(fs::path(dir) / "manifest.json")) {
    return DataLoss(fmt::format("{}/latest names '{}', which has no manifest.json", path, tag));
  }
  return dir;
}

StatusOr<Manifest> ReadManifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  std::ifstream in(path);
  if (!in) return InvalidArgument(fmt::format("cannot open {}", path));
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) {
    return DataLoss(fmt::format("{} is not a valid zinf checkpoint manifest: {}", path, what));
  };
  if (j.is_discarded()) return bad("not JSON (truncated?)");
  if (j.value("format", "") != "zinf-checkpoint") return bad("no \"format\": \"zinf-checkpoint\"");
  if (j.value("format_version", 0) != kFormatVersion) {
    return bad(fmt::format("format_version {} (this build reads {})", j.value("format_version", 0),
                           kFormatVersion));
  }
  Manifest m;
  try {
    m.tag = j.at("tag").get<std::string>();
    m.world_size = j.at("world_size").get<int>();
    m.step = j.at("step").get<int64_t>();
    m.shard_elements = j.at("shard_elements").get<uint64_t>();
    for (const nlohmann::json& p : j.at("params")) {
      ManifestParam mp{p.at("name").get<std::string>(), p.at("shape").get<std::vector<int64_t>>(),
                       p.at("numel").get<uint64_t>(), p.at("shard_size").get<uint64_t>(),
                       p.at("flat_offset").get<uint64_t>()};
      if (mp.flat_offset + mp.shard_size > m.shard_elements ||
          mp.shard_size * m.world_size < mp.numel) {
        return bad(fmt::format("parameter '{}' does not fit its shards", mp.name));
      }
      m.params.push_back(std::move(mp));
    }
    m.engine_state = j.at("engine_state").dump();
    m.client_state = j.at("client_state").dump();
  } catch (const nlohmann::json::exception& e) {
    return bad(e.what());
  }
  if (m.world_size < 1) return bad("world_size < 1");
  return m;
}

// ---- ShardReader ----

StatusOr<ShardReader> ShardReader::Open(const std::string& path, const std::string& tag, int rank) {
  ShardReader r;
  r.path_ = path;
  r.fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (r.fd_ < 0 && errno == ENOENT) {
    return DataLoss(fmt::format("checkpoint file {} is missing", path));
  }
  if (r.fd_ < 0) return ErrnoStatus(errno, fmt::format("opening checkpoint file {}", path));
  const off_t size = lseek(r.fd_, 0, SEEK_END);
  auto corrupt = [&](const std::string& what) {
    return DataLoss(fmt::format("checkpoint file {} is truncated or corrupt: {}", path, what));
  };
  if (size < 16) return corrupt(fmt::format("{} bytes", size));
  char tail[16];
  ZINF_RETURN_IF_ERROR(ReadAll(r.fd_, tail, 16, size - 16, path));
  if (std::memcmp(tail + 8, kMagic, 8) != 0) return corrupt("no trailer at the end");
  uint64_t length = 0;
  std::memcpy(&length, tail, 8);
  if (length > static_cast<uint64_t>(size) - 16) return corrupt("trailer length out of range");
  std::string text(length, '\0');
  ZINF_RETURN_IF_ERROR(ReadAll(r.fd_, text.data(), length, size - 16 - length, path));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return corrupt("trailer is not JSON");
  try {
    if (j.at("tag").get<std::string>() != tag || j.at("rank").get<int>() != rank) {
      return corrupt(fmt::format("it belongs to checkpoint '{}' rank {}, expected '{}' rank {}",
                                 j.at("tag").get<std::string>(), j.at("rank").get<int>(), tag,
                                 rank));
    }
    for (const nlohmann::json& s : j.at("sections")) {
      Section section{s.at("offset").get<uint64_t>(), s.at("bytes").get<uint64_t>(),
                      s.at("crc32c").get<uint32_t>()};
      if (section.offset + section.bytes > static_cast<uint64_t>(size) - 16 - length) {
        return corrupt(
            fmt::format("section '{}' runs past the data", s.at("name").get<std::string>()));
      }
      r.sections_.emplace_back(s.at("name").get<std::string>(), section);
    }
  } catch (const nlohmann::json::exception& e) {
    return corrupt(e.what());
  }
  return r;
}

ShardReader::ShardReader(ShardReader&& o) noexcept { *this = std::move(o); }

ShardReader& ShardReader::operator=(ShardReader&& o) noexcept {
  std::swap(path_, o.path_);
  std::swap(fd_, o.fd_);
  std::swap(sections_, o.sections_);
  return *this;
}

ShardReader::~ShardReader() {
  if (fd_ >= 0) close(fd_);
}

StatusOr<const ShardReader::Section*> ShardReader::Find(const std::string& name) const {
  for (const auto& [n, s] : sections_) {
    if (n == name) return &s;
  }
  return DataLoss(fmt::format("checkpoint file {} has no section '{}'", path_, name));
}

bool ShardReader::HasSection(const std::string& name) const { return Find(name).ok(); }

StatusOr<uint64_t> ShardReader::SectionBytes(const std::string& name) const {
  ZINF_ASSIGN_OR_RETURN(const Section* s, Find(name));
  return s->bytes;
}

Status ShardReader::Read(const std::string& name, uint64_t offset, void* out,
                         uint64_t bytes) const {
  ZINF_ASSIGN_OR_RETURN(const Section* s, Find(name));
  if (offset + bytes > s->bytes) {
    return InvalidArgument(fmt::format("reading {} bytes at {} of section '{}' ({} bytes) of {}",
                                       bytes, offset, name, s->bytes, path_));
  }
  return ReadAll(fd_, out, bytes, s->offset + offset, path_);
}

Status ShardReader::Verify(const std::string& name,
                           const std::function<Status(const char*, uint64_t)>& sink,
                           uint64_t piece) const {
  ZINF_ASSIGN_OR_RETURN(const Section* s, Find(name));
  std::vector<char> buffer(std::min(piece, std::max<uint64_t>(s->bytes, 1)));
  uint32_t crc = 0;
  for (uint64_t done = 0; done < s->bytes;) {
    const uint64_t n = std::min<uint64_t>(buffer.size(), s->bytes - done);
    ZINF_RETURN_IF_ERROR(ReadAll(fd_, buffer.data(), n, s->offset + done, path_));
    crc = Crc32c(buffer.data(), n, crc);
    if (sink) ZINF_RETURN_IF_ERROR(sink(buffer.data(), n));
    done += n;
  }
  if (crc != s->crc) {
    return DataLoss(
        fmt::format("checkpoint file {}: section '{}' fails its checksum (crc32c {:08x}, "
                    "recorded {:08x}): the file is corrupt",
                    path_, name, crc, s->crc));
  }
  return OkStatus();
}

}  // namespace zinf::ckpt
