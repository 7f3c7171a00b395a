// safetensors reading: see safetensors.h.
#include "ckpt/safetensors.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/config_reader.h"
#include "zinf/dtype.h"

namespace zinf::ckpt {
namespace {

// The safetensors library refuses headers over 100 MB; so does zinf, before allocating one.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// The types zinf reads, with their sizes: the floats as values (`dtype`), the rest as bytes.
struct KnownType {
  std::string_view name;
  uint64_t bytes;
  bool is_float;
  ElementType dtype;  // where is_float
};
constexpr KnownType kReadTypes[] = {{"F32", 4, true, ElementType::kFp32},
                                    {"BF16", 2, true, ElementType::kBf16},
                                    {"F16", 2, true, ElementType::kFp16},
                                    {"F64", 8, false, {}},
                                    {"I64", 8, false, {}},
                                    {"I32", 4, false, {}},
                                    {"I16", 2, false, {}},
                                    {"I8", 1, false, {}},
                                    {"U8", 1, false, {}},
                                    {"BOOL", 1, false, {}}};

// The types safetensors defines that zinf does not read, to tell them from a typo.
constexpr std::string_view kOtherSafetensorsTypes[] = {"U64", "U32", "U16", "F8_E4M3", "F8_E5M2"};

Status ReadAt(int fd, void* out, uint64_t bytes, uint64_t offset, const std::string& what) {
  char* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t n = pread(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "reading " + what);
    if (n == 0) return DataLoss(fmt::format("{}: the file ends early", what));
    p += n;
    bytes -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return OkStatus();
}

StatusOr<std::vector<SafetensorsTensor>> Parse(std::string_view json, uint64_t data_bytes,
                                               std::string_view source) {
  // Not ordered_json: its key lookup is linear, so a header of n tensors parsed in O(n^2)
  // (300k tensors took 30 s). Tensors are put in file order below instead.
  StatusOr<nlohmann::json> parsed = ParseJson(json, "the header", /*unique_keys=*/true);
  if (!parsed.ok()) return DataLoss(fmt::format("{}: {}", source, parsed.status().message()));
  const nlohmann::json& header = *parsed;
  if (!header.is_object())
    return DataLoss(fmt::format("{}: the header is not a JSON object", source));
  std::vector<SafetensorsTensor> tensors;
  for (auto item = header.begin(); item != header.end(); ++item) {
    // Not a structured binding: clang 14 (the fuzz build's) cannot capture one in a lambda.
    const std::string& name = item.key();
    const nlohmann::json& entry = item.value();
    if (name == "__metadata__") continue;
    auto bad = [&](const std::string& what) {
      return DataLoss(fmt::format("{}: tensor '{}': {}", source, name, what));
    };
    if (!entry.is_object()) return bad("not a JSON object");
    SafetensorsTensor t;
    t.name = name;
    auto dtype = entry.find("dtype");
    if (dtype == entry.end() || !dtype->is_string()) return bad("no string \"dtype\"");
    const std::string type = dtype->get<std::string>();
    const KnownType* known = nullptr;
    for (const KnownType& k : kReadTypes) {
      if (k.name == type) known = &k;
    }
    if (known == nullptr) {
      const bool defined =
          std::find(std::begin(kOtherSafetensorsTypes), std::end(kOtherSafetensorsTypes), type) !=
          std::end(kOtherSafetensorsTypes);
      return InvalidArgument(fmt::format(
          "{}: tensor '{}' has dtype '{}', {}; zinf reads F32, BF16, F16, F64, I64, I32, I16, I8, "
          "U8 and BOOL",
          source, name, type.substr(0, 40),
          defined ? "which zinf does not read" : "which safetensors does not define"));
    }
    t.type = type;
    t.is_float = known->is_float;
    t.dtype = known->dtype;
    t.element_bytes = known->bytes;
    auto shape = entry.find("shape");
    if (shape == entry.end() || !shape->is_array()) return bad("no \"shape\" array");
    t.numel = 1;
    for (const auto& d : *shape) {
      if (!d.is_number_unsigned()) {
        return bad(fmt::format("shape has {}, not a non-negative integer", DescribeJson(d)));
      }
      const uint64_t n = d.get<uint64_t>();
      if (n > uint64_t{INT64_MAX} || __builtin_mul_overflow(t.numel, n, &t.numel)) {
        return bad(
            fmt::format("shape [{}, {}, ...] overflows 64 bits", fmt::join(t.shape, ", "), n));
      }
      t.shape.push_back(static_cast<int64_t>(n));
    }
    auto offsets = entry.find("data_offsets");
    if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      return bad("no \"data_offsets\" pair of non-negative integers");
    }
    t.begin = (*offsets)[0].get<uint64_t>();
    t.end = (*offsets)[1].get<uint64_t>();
    if (t.begin > t.end || t.end > data_bytes) {
      return bad(fmt::format("data_offsets [{}, {}) are not within the {} bytes of data", t.begin,
                             t.end, data_bytes));
    }
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(t.numel, t.element_bytes, &bytes) || bytes != t.end - t.begin) {
      return bad(fmt::format("shape [{}] of {} needs {} bytes, data_offsets span {}",
                             fmt::join(t.shape, ", "), type, bytes, t.end - t.begin));
    }
    tensors.push_back(std::move(t));
  }
  // File order; then overlapping tensors, which would alias each other's bytes (a corrupt or
  // hostile header), are neighbours. Empty tensors take no bytes and cannot overlap.
  std::stable_sort(tensors.begin(), tensors.end(),
                   [](const auto& a, const auto& b) { return a.begin < b.begin; });
  const SafetensorsTensor* last = nullptr;
  for (const SafetensorsTensor& t : tensors) {
    if (t.end == t.begin) continue;
    if (last != nullptr && t.begin < last->end) {
      return DataLoss(
          fmt::format("{}: tensors '{}' and '{}' overlap in the data", source, last->name, t.name));
    }
    if (last == nullptr || t.end > last->end) last = &t;
  }
  return tensors;
}

}  // namespace

std::string_view SafetensorsDtypeName(ElementType type) {
  switch (type) {
    case ElementType::kFp32:
      return "F32";
    case ElementType::kBf16:
      return "BF16";
    case ElementType::kFp16:
      return "F16";
    default:
      return "";
  }
}

StatusOr<std::vector<SafetensorsTensor>> ParseSafetensorsHeader(std::string_view json,
                                                                uint64_t data_bytes,
                                                                std::string_view source) {
  try {
    return Parse(json, data_bytes, source);
  } catch (const std::exception& e) {  // nlohmann on a type it did not expect: a bug here
    return Internal(
        fmt::format("{}: parsing the header: unexpected exception: {}", source, e.what()));
  }
}

StatusOr<SafetensorsReader> SafetensorsReader::Open(const std::string& path) {
  SafetensorsReader r;
  r.path_ = path;
  r.fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (r.fd_ < 0) return ErrnoStatus(errno, "opening " + path);
  struct stat st {};
  if (fstat(r.fd_, &st) != 0) return ErrnoStatus(errno, "stat of " + path);
  if (!S_ISREG(st.st_mode)) return InvalidArgument(path + " is not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    return DataLoss(
        fmt::format("{}: {} bytes is too short for a safetensors file (an 8-byte "
                    "header length, then the header)",
                    path, size));
  }
  uint64_t header_bytes = 0;
  static_assert(std::endian::native == std::endian::little);
  ZINF_RETURN_IF_ERROR(ReadAt(r.fd_, &header_bytes, 8, 0, path));
  if (header_bytes > size - 8) {
    return DataLoss(
        fmt::format("{}: the header length {} goes past the end of the file ({} "
                    "bytes): truncated, or not a safetensors file",
                    path, header_bytes, size));
  }
  if (header_bytes > kMaxHeaderBytes) {
    return DataLoss(fmt::format("{}: the header length {} is over the {} bytes safetensors allows",
                                path, header_bytes, kMaxHeaderBytes));
  }
  std::string header(header_bytes, '\0');
  ZINF_RETURN_IF_ERROR(ReadAt(r.fd_, header.data(), header_bytes, 8, path));
  r.data_offset_ = 8 + header_bytes;
  ZINF_ASSIGN_OR_RETURN(r.tensors_, ParseSafetensorsHeader(header, size - r.data_offset_, path));
  return r;
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&& o) noexcept
    : path_(std::move(o.path_)),
      fd_(std::exchange(o.fd_, -1)),
      data_offset_(o.data_offset_),
      tensors_(std::move(o.tensors_)) {}

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    data_offset_ = o.data_offset_;
    tensors_ = std::move(o.tensors_);
  }
  return *this;
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) close(fd_);
}

const SafetensorsTensor* SafetensorsReader::Find(std::string_view name) const {
  for (const SafetensorsTensor& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Status SafetensorsReader::ReadFp32(const SafetensorsTensor& t, float* out) const {
  return ReadFp32(t, 0, t.numel, out);
}

Status SafetensorsReader::ReadFp32(const SafetensorsTensor& t, uint64_t first, uint64_t count,
                                   float* out) const {
  const std::string what = fmt::format("{}: tensor '{}'", path_, t.name);
  if (first > t.numel || count > t.numel - first) {
    return InvalidArgument(fmt::format("{}: elements [{}, {} + {}) are past its {} elements", what,
                                       first, first, count, t.numel));
  }
  if (!t.is_float) {
    return InvalidArgument(
        fmt::format("{} is {}; values are read from F32, BF16 or F16 tensors", what, t.type));
  }
  const uint64_t at = data_offset_ + t.begin + first * ElementSize(t.dtype);
  if (t.dtype == ElementType::kFp32) return ReadAt(fd_, out, count * 4, at, what);
  // 16-bit values: read in pieces into a small buffer and widen.
  constexpr uint64_t kPiece = 1 << 20;
  std::vector<uint16_t> half(std::min<uint64_t>(count, kPiece));
  for (uint64_t done = 0; done < count;) {
    const uint64_t n = std::min<uint64_t>(kPiece, count - done);
    ZINF_RETURN_IF_ERROR(ReadAt(fd_, half.data(), n * 2, at + done * 2, what));
    ConvertToFp32(half.data(), t.dtype, out + done, n);
    done += n;
  }
  return OkStatus();
}

Status SafetensorsReader::ReadBytes(const SafetensorsTensor& t, void* out) const {
  return ReadAt(fd_, out, t.end - t.begin, data_offset_ + t.begin,
                fmt::format("{}: tensor '{}'", path_, t.name));
}

}  // namespace zinf::ckpt
