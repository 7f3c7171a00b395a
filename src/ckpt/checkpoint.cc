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
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>

#include "core/config_reader.h"
#include "core/crc32c.h"
#include "core/log.h"

namespace zinf::ckpt {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'Z', 'I', 'N', 'F', 'S', 'H', 'D', '1'};
constexpr uint64_t kAlign = 4096;
constexpr int kShardFormatVersion = 1;
// 2 added the manifest's checksum, 3 its buffers; 1 is still read (see checkpoint.h).
constexpr int kManifestVersion = 3;
constexpr int kManifestVersionWithoutBuffers = 2;
constexpr int kOldestManifestVersion = 1;
constexpr int64_t kMaxWorldSize = int64_t{1} << 24;
// Elements per rank: 4 EiB of fp32, far past any disk, and small enough that byte counts
// (x4, x8) cannot overflow.
constexpr uint64_t kMaxShardElements = uint64_t{1} << 60;
// A manifest of a million parameters is about 200 MB; anything larger is not ours.
constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 30;
constexpr std::string_view kChecksumPrefix = "crc32c:";

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

// Never throws: invalid UTF-8 (which the parser refuses anyway) is replaced.
std::string Dump(const nlohmann::json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string ManifestChecksum(const nlohmann::json& without_checksum) {
  const std::string canonical = Dump(without_checksum);
  return fmt::format("{}{:08x}", kChecksumPrefix, Crc32c(canonical.data(), canonical.size()));
}

// A JSON object from text, never throwing; `what` names it in errors.
StatusOr<nlohmann::json> ParseObject(std::string_view text, std::string_view what) {
  ZINF_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(text, what));
  if (!j.is_object()) {
    return InvalidArgument(fmt::format("{} must be a JSON object, got {}", what, DescribeJson(j)));
  }
  return j;
}

// The engine's scalars (ScalarState in src/zero/engine.cc) that loading reads, with their
// types: an edited engine_state is refused here rather than throwing in the engine.
Status CheckEngineState(const nlohmann::json& state) {
  auto field = [&](const char* key) -> const nlohmann::json* {
    auto it = state.find(key);
    return it == state.end() ? nullptr : &*it;
  };
  auto in_range = [](const nlohmann::json* v, int64_t lo, int64_t hi) {
    if (v == nullptr || !v->is_number_integer()) return false;
    if (v->is_number_unsigned()) return v->get<uint64_t>() <= static_cast<uint64_t>(hi);
    return v->get<int64_t>() >= lo && v->get<int64_t>() <= hi;
  };
  auto wrong = [&](const char* key, std::string_view expected) {
    return InvalidArgument(fmt::format("engine_state.{} must be {}, got {}", key, expected,
                                       field(key) ? DescribeJson(*field(key)) : "nothing"));
  };
  for (const char* key : {"steps", "iteration", "last_overflow_iteration"}) {
    if (!in_range(field(key), INT64_MIN, INT64_MAX)) return wrong(key, "an integer");
  }
  for (const char* key : {"hysteresis_left", "state_count"}) {
    if (!in_range(field(key), INT32_MIN, INT32_MAX)) return wrong(key, "a 32-bit integer");
  }
  if (field("loss_scale") == nullptr || !field("loss_scale")->is_number()) {
    return wrong("loss_scale", "a number");
  }
  if (field("optimizer") == nullptr || !field("optimizer")->is_string()) {
    return wrong("optimizer", "a string");
  }
  return OkStatus();
}

// Whether `path` exists: false where it does not (or a parent is not a directory), an error
// naming `what` where the OS cannot tell (permission denied, a loop of symbolic links...).
StatusOr<bool> Exists(const fs::path& path, std::string_view what) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory) {
    return ErrnoStatus(ec.value(), fmt::format("searching {} {}", what, path.string()));
  }
  return !ec && fs::exists(st);
}

}  // namespace

std::string ShardFileName(int rank) { return fmt::format("rank-{:05d}.zshard", rank); }

Status CheckTag(std::string_view tag) {
  if (tag.empty() || tag.size() > 255 || tag[0] == '.' || tag.find('/') != tag.npos ||
      tag.find('\0') != tag.npos) {
    return InvalidArgument(fmt::format(
        "checkpoint tag '{}' must be a plain directory name (1 to 255 bytes, no '/', not "
        "starting with '.')",
        tag.substr(0, 300)));
  }
  // DIR/latest is the pointer file, and names ending in .tmp are files being written: a tag
  // of either name could never commit.
  if (tag == "latest" || tag.ends_with(".tmp")) {
    return InvalidArgument(fmt::format(
        "checkpoint tag '{}' is reserved: 'latest' is the pointer to the newest checkpoint and "
        "'.tmp' names files being written",
        tag));
  }
  return OkStatus();
}

uint64_t BufferDtypeBytes(std::string_view dtype) {
  for (auto [name, bytes] :
       {std::pair{"F32", 4}, std::pair{"F64", 8}, std::pair{"F16", 2}, std::pair{"BF16", 2},
        std::pair{"I64", 8}, std::pair{"I32", 4}, std::pair{"I16", 2}, std::pair{"I8", 1},
        std::pair{"U8", 1}, std::pair{"BOOL", 1}}) {
    if (dtype == name) return static_cast<uint64_t>(bytes);
  }
  return 0;
}

Status ValidateManifest(const Manifest& m) {
  ZINF_RETURN_IF_ERROR(CheckTag(m.tag));
  if (m.world_size < 1 || m.world_size > kMaxWorldSize) {
    return InvalidArgument(
        fmt::format("world_size must be in [1, {}], got {}", kMaxWorldSize, m.world_size));
  }
  if (m.step < 0) return InvalidArgument(fmt::format("step must be >= 0, got {}", m.step));
  if (m.shard_elements > kMaxShardElements) {
    return InvalidArgument(
        fmt::format("shard_elements must be at most 2^60, got {}", m.shard_elements));
  }
  if (m.params.empty()) return InvalidArgument("the parameter list is empty");
  const uint64_t world = static_cast<uint64_t>(m.world_size);
  std::set<std::string_view> names;
  // [flat_offset, flat_offset + shard_size) of each parameter that has elements, and its index.
  std::vector<std::pair<std::pair<uint64_t, uint64_t>, size_t>> ranges;
  for (size_t i = 0; i < m.params.size(); ++i) {
    const ManifestParam& p = m.params[i];
    auto bad = [&](const std::string& what) {
      return InvalidArgument(fmt::format("parameter {} '{}': {}", i, p.name, what));
    };
    if (p.name.empty()) return bad("the name is empty");
    if (!names.insert(p.name).second) return bad("the name appears twice");
    uint64_t product = 1;
    for (int64_t dim : p.shape) {
      if (dim < 0) {
        return bad(fmt::format("shape {} has a negative dimension", Dump(nlohmann::json(p.shape))));
      }
      if (__builtin_mul_overflow(product, static_cast<uint64_t>(dim), &product)) {
        return bad(
            fmt::format("shape {} has more than 2^64 elements", Dump(nlohmann::json(p.shape))));
      }
    }
    if (product != p.numel) {
      return bad(fmt::format("shape {} has {} elements, numel is {}", Dump(nlohmann::json(p.shape)),
                             product, p.numel));
    }
    const uint64_t shard = p.numel / world + (p.numel % world != 0 ? 1 : 0);
    if (p.shard_size != shard) {
      return bad(fmt::format("shard_size is {}, expected {} (numel {} over {} ranks)", p.shard_size,
                             shard, p.numel, world));
    }
    if (p.flat_offset > m.shard_elements || p.shard_size > m.shard_elements - p.flat_offset) {
      return bad(fmt::format("elements [{}, {} + {}) lie outside the {} of a rank's shard",
                             p.flat_offset, p.flat_offset, p.shard_size, m.shard_elements));
    }
    if (p.shard_size > 0) ranges.push_back({{p.flat_offset, p.shard_size}, i});
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t k = 1; k < ranges.size(); ++k) {
    const auto& [prev, a] = ranges[k - 1];
    const auto& [next, b] = ranges[k];
    if (next.first < prev.first + prev.second) {
      return InvalidArgument(fmt::format(
          "parameter {} '{}' (elements [{}, {})) overlaps parameter {} '{}' (elements [{}, {}))", b,
          m.params[b].name, next.first, next.first + next.second, a, m.params[a].name, prev.first,
          prev.first + prev.second));
    }
  }
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    const ManifestBuffer& b = m.buffers[i];
    auto bad = [&](const std::string& what) {
      return InvalidArgument(fmt::format("buffer {} '{}': {}", i, b.name, what));
    };
    if (b.name.empty()) return bad("the name is empty");
    if (!names.insert(b.name).second) return bad("the name appears twice (or is a parameter's)");
    const uint64_t element = BufferDtypeBytes(b.dtype);
    if (element == 0) {
      return bad(
          fmt::format("dtype \"{}\" is not one of F32, F64, F16, BF16, I64, I32, I16, "
                      "I8, U8, BOOL",
                      b.dtype.substr(0, 20)));
    }
    uint64_t product = element;
    for (int64_t dim : b.shape) {
      if (dim < 0 || __builtin_mul_overflow(product, static_cast<uint64_t>(dim), &product) ||
          product > kMaxShardElements) {
        return bad(fmt::format("shape {} is negative or too large", Dump(nlohmann::json(b.shape))));
      }
    }
    if (product != b.bytes) {
      return bad(fmt::format("shape {} of {} is {} bytes, the manifest says {}",
                             Dump(nlohmann::json(b.shape)), b.dtype, product, b.bytes));
    }
  }
  ZINF_ASSIGN_OR_RETURN(const nlohmann::json engine, ParseObject(m.engine_state, "engine_state"));
  ZINF_RETURN_IF_ERROR(CheckEngineState(engine));
  ZINF_RETURN_IF_ERROR(ParseObject(m.client_state, "client_state").status());
  return OkStatus();
}

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
  }
  ZINF_ASSIGN_OR_RETURN(nlohmann::json engine_state, ParseObject(m.engine_state, "engine_state"));
  ZINF_ASSIGN_OR_RETURN(nlohmann::json client_state, ParseObject(m.client_state, "client_state"));
  nlohmann::json json = {
      {"format", "zinf-checkpoint"},
      {"format_version", m.buffers.empty() ? kManifestVersionWithoutBuffers : kManifestVersion},
      {"tag", m.tag},
      {"world_size", m.world_size},
      {"step", m.step},
      {"shard_elements", m.shard_elements},
      {"params", std::move(params)},
      {"engine_state", std::move(engine_state)},
      {"client_state", std::move(client_state)}};
  if (!m.buffers.empty()) {
    nlohmann::json buffers = nlohmann::json::array();
    for (const ManifestBuffer& b : m.buffers) {
      buffers.push_back(
          {{"name", b.name}, {"dtype", b.dtype}, {"shape", b.shape}, {"bytes", b.bytes}});
    }
    json["buffers"] = std::move(buffers);
  }
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

StatusOr<std::string> ResolveCheckpoint(const std::string& path) {
  ZINF_ASSIGN_OR_RETURN(const bool here,
                        Exists(fs::path(path) / "manifest.json", "checkpoint directory"));
  if (here) return path;
  const std::string latest_path = path + "/latest";
  ZINF_ASSIGN_OR_RETURN(const bool has_latest, Exists(latest_path, "checkpoint directory"));
  if (!has_latest) {
    return InvalidArgument(fmt::format(
        "{} is not a zinf checkpoint: it has neither manifest.json nor a 'latest' file", path));
  }
  ZINF_ASSIGN_OR_RETURN(std::string tag, ReadInputFile(latest_path, "checkpoint pointer", 4096));
  if (!tag.empty() && tag.back() == '\n') tag.pop_back();
  if (Status s = CheckTag(tag); !s.ok()) {
    return DataLoss(fmt::format("{} names '{}', which is not a checkpoint in {}: {}", latest_path,
                                tag.substr(0, 300), path, s.message()));
  }
  const std::string dir = path + "/" + tag;
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(dir, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return ErrnoStatus(ec.value(), fmt::format("searching checkpoint directory {}", dir));
  }
  if (ec || st.type() != fs::file_type::directory) {
    return DataLoss(
        fmt::format("{} names '{}', which is not a directory in {}", latest_path, tag, path));
  }
  ZINF_ASSIGN_OR_RETURN(const bool has_manifest,
                        Exists(fs::path(dir) / "manifest.json", "checkpoint directory"));
  if (!has_manifest) {
    return DataLoss(fmt::format("{}/latest names '{}', which has no manifest.json", path, tag));
  }
  return dir;
}

namespace {

// Typed fields of a parsed manifest: errors say which field, what it holds and what it must.
class Fields {
 public:
  Fields(const nlohmann::json& object, std::string path)
      : object_(object), path_(std::move(path)) {}

  StatusOr<const nlohmann::json*> Get(const char* key) const {
    auto it = object_.find(key);
    if (it == object_.end()) return InvalidArgument(fmt::format("{}{} is missing", path_, key));
    return &*it;
  }
  StatusOr<int64_t> Int(const char* key) const {
    ZINF_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(key));
    if (!v->is_number_integer() ||
        (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX})) {
      return Wrong(key, *v, "an integer");
    }
    return v->get<int64_t>();
  }
  StatusOr<uint64_t> Unsigned(const char* key) const {
    ZINF_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(key));
    if (!v->is_number_unsigned()) return Wrong(key, *v, "a non-negative integer");
    return v->get<uint64_t>();
  }
  StatusOr<std::string> String(const char* key) const {
    ZINF_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(key));
    if (!v->is_string()) return Wrong(key, *v, "a string");
    return v->get<std::string>();
  }
  StatusOr<std::vector<int64_t>> Ints(const char* key) const {
    ZINF_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(key));
    std::vector<int64_t> out;
    if (!v->is_array()) return Wrong(key, *v, "a list of integers");
    for (const nlohmann::json& e : *v) {
      if (!e.is_number_integer() ||
          (e.is_number_unsigned() && e.get<uint64_t>() > uint64_t{INT64_MAX})) {
        return Wrong(key, *v, "a list of integers");
      }
      out.push_back(e.get<int64_t>());
    }
    return out;
  }
  // Every key must be one of `allowed`.
  Status Only(std::initializer_list<std::string_view> allowed) const {
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (std::find(allowed.begin(), allowed.end(), it.key()) == allowed.end()) {
        return InvalidArgument(fmt::format("{}{} is not a manifest key", path_, it.key()));
      }
    }
    return OkStatus();
  }

 private:
  Status Wrong(const char* key, const nlohmann::json& v, const char* expected) const {
    return InvalidArgument(
        fmt::format("{}{} must be {}, got {}", path_, key, expected, DescribeJson(v)));
  }
  const nlohmann::json& object_;
  std::string path_;
};

// `j` without its checksum (verified and removed by the caller).
StatusOr<Manifest> ManifestFromJson(const nlohmann::json& j) {
  const Fields f(j, "");
  ZINF_RETURN_IF_ERROR(
      f.Only({"format", "format_version", "tag", "world_size", "step", "shard_elements", "params",
              "engine_state", "client_state", "buffers"}));
  Manifest m;
  ZINF_ASSIGN_OR_RETURN(m.tag, f.String("tag"));
  ZINF_ASSIGN_OR_RETURN(const int64_t world, f.Int("world_size"));
  if (world < 1 || world > kMaxWorldSize) {
    return InvalidArgument(
        fmt::format("world_size must be in [1, {}], got {}", kMaxWorldSize, world));
  }
  m.world_size = static_cast<int>(world);
  ZINF_ASSIGN_OR_RETURN(m.step, f.Int("step"));
  ZINF_ASSIGN_OR_RETURN(m.shard_elements, f.Unsigned("shard_elements"));
  ZINF_ASSIGN_OR_RETURN(const nlohmann::json* params, f.Get("params"));
  if (!params->is_array()) {
    return InvalidArgument(fmt::format("params must be a list, got {}", DescribeJson(*params)));
  }
  for (size_t i = 0; i < params->size(); ++i) {
    const nlohmann::json& p = (*params)[i];
    const std::string where = fmt::format("params[{}]", i);
    if (!p.is_object()) {
      return InvalidArgument(fmt::format("{} must be an object, got {}", where, DescribeJson(p)));
    }
    const Fields pf(p, where + ".");
    ZINF_RETURN_IF_ERROR(pf.Only({"name", "shape", "numel", "shard_size", "flat_offset"}));
    ManifestParam mp;
    ZINF_ASSIGN_OR_RETURN(mp.name, pf.String("name"));
    ZINF_ASSIGN_OR_RETURN(mp.shape, pf.Ints("shape"));
    ZINF_ASSIGN_OR_RETURN(mp.numel, pf.Unsigned("numel"));
    ZINF_ASSIGN_OR_RETURN(mp.shard_size, pf.Unsigned("shard_size"));
    ZINF_ASSIGN_OR_RETURN(mp.flat_offset, pf.Unsigned("flat_offset"));
    m.params.push_back(std::move(mp));
  }
  if (auto it = j.find("buffers"); it != j.end()) {
    if (!it->is_array()) {
      return InvalidArgument(fmt::format("buffers must be a list, got {}", DescribeJson(*it)));
    }
    for (size_t i = 0; i < it->size(); ++i) {
      const nlohmann::json& b = (*it)[i];
      const std::string where = fmt::format("buffers[{}]", i);
      if (!b.is_object()) {
        return InvalidArgument(fmt::format("{} must be an object, got {}", where, DescribeJson(b)));
      }
      const Fields bf(b, where + ".");
      ZINF_RETURN_IF_ERROR(bf.Only({"name", "dtype", "shape", "bytes"}));
      ManifestBuffer mb;
      ZINF_ASSIGN_OR_RETURN(mb.name, bf.String("name"));
      ZINF_ASSIGN_OR_RETURN(mb.dtype, bf.String("dtype"));
      ZINF_ASSIGN_OR_RETURN(mb.shape, bf.Ints("shape"));
      ZINF_ASSIGN_OR_RETURN(mb.bytes, bf.Unsigned("bytes"));
      m.buffers.push_back(std::move(mb));
    }
  }
  for (const char* key : {"engine_state", "client_state"}) {
    ZINF_ASSIGN_OR_RETURN(const nlohmann::json* state, f.Get(key));
    if (!state->is_object()) {
      return InvalidArgument(
          fmt::format("{} must be an object, got {}", key, DescribeJson(*state)));
    }
    (std::string_view(key) == "engine_state" ? m.engine_state : m.client_state) = Dump(*state);
  }
  ZINF_RETURN_IF_ERROR(ValidateManifest(m));
  return m;
}

}  // namespace

StatusOr<Manifest> ParseManifest(std::string_view text, std::string_view source) {
  auto bad = [&](std::string_view what) {
    return DataLoss(fmt::format("{} is not a valid zinf checkpoint manifest: {}", source, what));
  };
  try {
    StatusOr<nlohmann::json> parsed = ParseJson(text, "it");
    if (!parsed.ok()) return bad(parsed.status().message());
    nlohmann::json& j = *parsed;
    if (!j.is_object()) return bad(fmt::format("not a JSON object but {}", DescribeJson(j)));
    auto format = j.find("format");
    if (format == j.end() || *format != "zinf-checkpoint") {
      return bad("no \"format\": \"zinf-checkpoint\"");
    }
    auto version = j.find("format_version");
    if (version == j.end() || !version->is_number_unsigned()) {
      return bad(fmt::format("format_version must be an integer, got {}",
                             version == j.end() ? "nothing" : DescribeJson(*version)));
    }
    if (version->get<uint64_t>() < kOldestManifestVersion ||
        version->get<uint64_t>() > kManifestVersion) {
      return FailedPrecondition(fmt::format(
          "{}: format_version {} is not supported by this build of zinf, which reads versions "
          "{} to {} (a checkpoint from a newer zinf?)",
          source, version->get<uint64_t>(), kOldestManifestVersion, kManifestVersion));
    }
    const int v = static_cast<int>(version->get<uint64_t>());
    if (v < 2) {
      const char* strict = std::getenv(kStrictCheckpointsEnv);
      if (strict != nullptr && std::string_view(strict) == "1") {
        return DataLoss(fmt::format(
            "{} is format_version {}, which has no checksum, and {}=1 refuses unprotected "
            "manifests: load it without {} once and save it again",
            source, v, kStrictCheckpointsEnv, kStrictCheckpointsEnv));
      }
      log::Warn("{} is format_version {}: it has no checksum, so an edit to it is not detected",
                source, v);
    } else {
      auto recorded = j.find("checksum");
      if (recorded == j.end() || !recorded->is_string()) {
        return bad(fmt::format("format_version {} needs a \"checksum\" string, got {}", v,
                               recorded == j.end() ? "nothing" : DescribeJson(*recorded)));
      }
      const std::string expected = recorded->get<std::string>();
      j.erase("checksum");
      const std::string actual = ManifestChecksum(j);
      if (actual != expected) {
        return DataLoss(fmt::format(
            "{} fails its checksum (content {}, recorded {}): it was edited or is corrupt", source,
            actual, expected.substr(0, 40)));
      }
    }
    StatusOr<Manifest> m = ManifestFromJson(j);
    if (!m.ok()) return bad(m.status().message());
    return m;
  } catch (const std::exception& e) {  // bad_alloc; nothing else is expected to throw
    return bad(fmt::format("reading it failed: {}", e.what()));
  }
}

StatusOr<Manifest> ReadManifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  ZINF_ASSIGN_OR_RETURN(const std::string text,
                        ReadInputFile(path, "checkpoint manifest", kMaxManifestBytes));
  return ParseManifest(text, path);
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
  if (length > static_cast<uint64_t>(size) - 16 || length > kMaxManifestBytes) {
    return corrupt(fmt::format("trailer length {} out of range", length));
  }
  std::string text(length, '\0');
  ZINF_RETURN_IF_ERROR(ReadAll(r.fd_, text.data(), length, size - 16 - length, path));
  StatusOr<nlohmann::json> trailer = ParseJson(text, "its trailer");
  if (!trailer.ok()) return corrupt(trailer.status().message());
  const nlohmann::json& j = *trailer;
  const uint64_t data_end = static_cast<uint64_t>(size) - 16 - length;
  try {
    if (j.at("tag").get<std::string>() != tag || j.at("rank").get<int>() != rank) {
      return corrupt(fmt::format("it belongs to checkpoint '{}' rank {}, expected '{}' rank {}",
                                 j.at("tag").get<std::string>(), j.at("rank").get<int>(), tag,
                                 rank));
    }
    for (const nlohmann::json& s : j.at("sections")) {
      Section section{s.at("offset").get<uint64_t>(), s.at("bytes").get<uint64_t>(),
                      s.at("crc32c").get<uint32_t>()};
      if (section.offset > data_end || section.bytes > data_end - section.offset) {
        return corrupt(
            fmt::format("section '{}' runs past the data", s.at("name").get<std::string>()));
      }
      r.sections_.emplace_back(s.at("name").get<std::string>(), section);
    }
  } catch (const std::exception& e) {  // nlohmann's type errors
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
  if (offset > s->bytes || bytes > s->bytes - offset) {
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
