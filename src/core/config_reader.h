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

#include "zinf/input_file.h"
#include "zinf/status.h"

namespace zinf {

// Parses JSON text from memory, never throwing: `source` (a file name) prefixes errors, which
// give line and column. Text nested deeper than kMaxJsonDepth is refused before parsing, and
// so, with `unique_keys`, is an object that names a key twice (formats such as safetensors
// forbid it; DeepSpeed configs, like Python's json, take the last). The one place zinf parses
// JSON (Note [Bounded input] in src/core/input_file.cc). Safe on arbitrary bytes (the entry
// point for fuzzing configs).
StatusOr<nlohmann::json> ParseJson(std::string_view text, std::string_view source,
                                   bool unique_keys = false);
// ReadInputFile (regular file or "-", at most kMaxInputFileBytes), then ParseJson. `what` names
// the input in errors ("--profile"); empty: "config file".
StatusOr<nlohmann::json> ReadJsonFile(const std::string& path, std::string_view what = {});

// A value for an error message: a scalar's JSON cut at 60 characters, or an array's or
// object's size, and its type: "\"8\" (string)", "3 elements (array)". Never throws, and
// never dumps a container, which may be large.
std::string DescribeJson(const nlohmann::json& value);

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
  // An element count (reduce_bucket_size, stage3_prefetch_bucket_size, ...): an integer, or a
  // number with an integral value such as 5e8. Strings are refused, "500MB" included, because
  // the key counts elements, not bytes; the message says so.
  ConfigReader& Elements(std::string_view key, uint64_t* out, uint64_t min = 0,
                         uint64_t max = std::numeric_limits<uint64_t>::max());
  // True when the key holds the string "auto" (DeepSpeed's "fill this in from the trainer"),
  // and marks the key as read: the caller resolves it. False when absent or anything else.
  bool IsAuto(std::string_view key);
  // From here on a key holding "auto" reads as absent, so the caller's default stays: what
  // DeepSpeed's pydantic config models (zero_optimization, fp16, bf16, ...) do with "auto".
  // IsAuto still sees the value. Readers of nested objects inherit the mode, and the keys so
  // dropped, by full key path, are collected in dropped() of the reader that set the mode.
  ConfigReader& DropAuto();
  const std::vector<std::string>& dropped() const { return dropped_; }
  // A list of exactly `count` numbers (count 0: any length).
  ConfigReader& Doubles(std::string_view key, std::vector<double>* out, size_t count);
  ConfigReader& Strings(std::string_view key, std::vector<std::string>* out);
  // A nested object, read by `read` with a reader whose path is "<path>.<key>".
  ConfigReader& Object(std::string_view key, const std::function<void(ConfigReader&)>& read);
  // A key zinf accepts and does not use (it has no effect here); logged once at debug level.
  ConfigReader& Ignore(std::string_view key);
  // The value as given (nullptr when absent, or after an error), for checks the typed readers
  // do not cover; marks the key as read.
  const nlohmann::json* Raw(std::string_view key) { return Find(key); }

  bool Has(std::string_view key) const;
  // Records an error found by the caller (e.g. a cross-field check), keyed to this object.
  void Fail(Status status);
  // The first error, or an error for keys that were present but never read.
  Status Finish();

  const std::string& path() const { return path_; }

 private:
  const nlohmann::json* Find(std::string_view key);         // marks the key as known
  const nlohmann::json* FindAsGiven(std::string_view key);  // as Find, "auto" never dropped
  std::string KeyPath(std::string_view key) const;
  // Bytes (strings with units allowed) or Elements (numbers only).
  ConfigReader& Count(std::string_view key, uint64_t* out, uint64_t min, uint64_t max, bool bytes);

  const nlohmann::json& object_;
  std::string path_;
  std::set<std::string, std::less<>> known_;
  Status status_;
  bool drop_auto_ = false;
  std::vector<std::string> dropped_;
};

}  // namespace zinf

#endif  // ZINF_CORE_CONFIG_READER_H_
