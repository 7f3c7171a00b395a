// Reading checkpoints: resolving `latest`, parsing and checking the manifest, and the shard
// files' trailers and sections (format: checkpoint.h).
#include <fcntl.h>
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

#include "ckpt/checkpoint.h"
#include "ckpt/checkpoint_internal.h"
#include "core/config_reader.h"
#include "core/crc32c.h"
#include "core/log.h"
#include "zinf/input_file.h"

namespace zinf::ckpt {
namespace {

namespace fs = std::filesystem;
using namespace internal;  // NOLINT: the format's constants and canonical text

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
  StatusOr<bool> Bool(const char* key) const {
    ZINF_ASSIGN_OR_RETURN(const nlohmann::json* v, Get(key));
    if (!v->is_boolean()) return Wrong(key, *v, "true or false");
    return v->get<bool>();
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
      f.Only({"format", "format_version", "tag", "world_size", "step", "shard_elements",
              "frozen_elements", "params", "engine_state", "client_state", "buffers", "metadata"}));
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
  if (j.contains("frozen_elements")) {
    ZINF_ASSIGN_OR_RETURN(m.frozen_elements, f.Unsigned("frozen_elements"));
  }
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
    ZINF_RETURN_IF_ERROR(
        pf.Only({"name", "shape", "numel", "shard_size", "flat_offset", "frozen"}));
    ManifestParam mp;
    ZINF_ASSIGN_OR_RETURN(mp.name, pf.String("name"));
    ZINF_ASSIGN_OR_RETURN(mp.shape, pf.Ints("shape"));
    ZINF_ASSIGN_OR_RETURN(mp.numel, pf.Unsigned("numel"));
    ZINF_ASSIGN_OR_RETURN(mp.shard_size, pf.Unsigned("shard_size"));
    ZINF_ASSIGN_OR_RETURN(mp.flat_offset, pf.Unsigned("flat_offset"));
    if (p.contains("frozen")) {
      ZINF_ASSIGN_OR_RETURN(mp.frozen, pf.Bool("frozen"));
    }
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
  if (auto it = j.find("metadata"); it != j.end()) {
    if (!it->is_object()) {
      return InvalidArgument(fmt::format("metadata must be an object, got {}", DescribeJson(*it)));
    }
    m.metadata = Dump(*it);
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
