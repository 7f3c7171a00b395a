// Reading JSON config objects with errors that name the key path, the bad value and what is
// allowed, and that reject unknown keys.
//
//   ConfigReader aio(json["aio"], "aio");
//   aio.Int("queue_depth", &options.queue_depth, 1, 4096)
//      .Bytes("block_size", &options.block_size, 4096, 64 * kMiB);
//   ZINF_RETURN_IF_ERROR(aio.Finish());
//
// Each reader call leaves its output unchanged when the key is absent, so the defaults live
// in the options struct. The first error sticks; later calls do nothing and Finish() returns
// it. Finish() also reports keys that no call asked for: an unknown key is an error, never a
// silent no-op.
//
// Not thread-safe; one reader per object being parsed.
#ifndef ZINF_CORE_CONFIG_READER_H_
#define ZINF_CORE_CONFIG_READER_H_

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/status.h"

namespace zinf {

// Parses JSON text; `source` (a file name) prefixes errors, which give line and column.
StatusOr<nlohmann::json> ParseJson(std::string_view text, std::string_view source);
StatusOr<nlohmann::json> ReadJsonFile(const std::string& path);

class ConfigReader {
 public:
  // `object` must outlive the reader; `path` is its key path ("" for the root). A non-object
  // value is an error reported by Finish().
  ConfigReader(const nlohmann::json& object, std::string path);
  // The reader keeps a reference: a temporary object would dangle.
  ConfigReader(nlohmann::json&& object, std::string path) = delete;

  ConfigReader& Bool(std::string_view key, bool* out);
  ConfigReader& Int(std::string_view key, int64_t* out,
                    int64_t min = std::numeric_limits<int64_t>::min(),
                    int64_t max = std::numeric_limits<int64_t>::max());
  template <typename I>
  ConfigReader& Int(std::string_view key, I* out, int64_t min, int64_t max) {
    int64_t v = static_cast<int64_t>(*out);
    Int(key, &v, min, max);
    *out = static_cast<I>(v);
    return *this;
  }
  ConfigReader& Double(std::string_view key, double* out,
                       double min = -std::numeric_limits<double>::infinity(),
                       double max = std::numeric_limits<double>::infinity());
  ConfigReader& String(std::string_view key, std::string* out);
  // A string that must be one of `allowed`.
  ConfigReader& Enum(std::string_view key, std::string* out,
                     std::initializer_list<std::string_view> allowed);
  // A byte count: an integer, or a string such as "64MiB" (see ParseBytes).
  ConfigReader& Bytes(std::string_view key, uint64_t* out, uint64_t min = 0,
                      uint64_t max = std::numeric_limits<uint64_t>::max());
  // A list of exactly `count` numbers (count 0: any length).
  ConfigReader& Doubles(std::string_view key, std::vector<double>* out, size_t count);
  ConfigReader& Strings(std::string_view key, std::vector<std::string>* out);
  // A nested object, read by `read` with a reader whose path is "<path>.<key>".
  ConfigReader& Object(std::string_view key, const std::function<void(ConfigReader&)>& read);
  // A key zinf accepts and does not use (it has no effect here); logged once at debug level.
  ConfigReader& Ignore(std::string_view key);

  bool Has(std::string_view key) const;
  // Records an error found by the caller (e.g. a cross-field check), keyed to this object.
  void Fail(Status status);
  // The first error, or an error for keys that were present but never read.
  Status Finish();

  const std::string& path() const { return path_; }

 private:
  const nlohmann::json* Find(std::string_view key);  // marks the key as known
  std::string KeyPath(std::string_view key) const;

  const nlohmann::json& object_;
  std::string path_;
  std::set<std::string, std::less<>> known_;
  Status status_;
};

}  // namespace zinf

#endif  // ZINF_CORE_CONFIG_READER_H_
