#include "core/config_reader.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_set>
#include <vector>

#include "core/log.h"
#include "core/units.h"

namespace zinf {

std::string DescribeJson(const nlohmann::json& value) {
  if (value.is_array() || value.is_object()) {
    return fmt::format("{} {} ({})", value.size(),
                       value.is_array() ? "elements" : (value.size() == 1 ? "key" : "keys"),
                       value.type_name());
  }
  std::string text;
  if (value.is_string()) {  // cut before dumping: a string may be megabytes long
    const std::string& s = value.get_ref<const std::string&>();
    text = nlohmann::json(s.substr(0, 64))
               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  } else {
    text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return fmt::format("{} ({})", text, value.type_name());
}

namespace {

// Finds a key named twice in one object, at any depth. A SAX pass of its own, before the
// parse: nlohmann's parser callback rescans an object's members at the end of every member
// that is an object, which made a safetensors header of n tensors O(n^2).
class DuplicateKeyFinder : public nlohmann::json_sax<nlohmann::json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    open_.emplace_back();
    return true;
  }
  bool key(string_t& name) override {
    if (open_.back().insert(name).second) return true;
    duplicate_ = name.substr(0, 200);
    return false;  // stops the pass
  }
  bool end_object() override {
    open_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;  // the parse proper reports it
  }
  const std::string& duplicate() const { return duplicate_; }

 private:
  std::vector<std::unordered_set<std::string>> open_;
  std::string duplicate_;
};

}  // namespace

StatusOr<nlohmann::json> ParseJson(std::string_view text, std::string_view source,
                                   bool unique_keys) {
  ZINF_RETURN_IF_ERROR(CheckJsonDepth(text, source));
  try {
    if (unique_keys) {
      DuplicateKeyFinder keys;
      nlohmann::json::sax_parse(text.begin(), text.end(), &keys);
      if (!keys.duplicate().empty()) {
        return InvalidArgument(
            fmt::format("{} names the key '{}' twice in one object", source, keys.duplicate()));
      }
    }
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(fmt::format("{} is not valid JSON: {}", source, e.what()));
  } catch (const std::exception& e) {  // bad_alloc on a huge document: say so, do not abort
    return ResourceExhausted(fmt::format("parsing {}: {}", source, e.what()));
  }
}

StatusOr<nlohmann::json> ReadJsonFile(const std::string& path, std::string_view what) {
  ZINF_ASSIGN_OR_RETURN(std::string text, ReadInputFile(path, what.empty() ? "config file" : what));
  return ParseJson(text, path);
}

ConfigReader::ConfigReader(const nlohmann::json& object, std::string path)
    : object_(object), path_(std::move(path)) {
  if (!object_.is_object()) {
    status_ = InvalidArgument(fmt::format("config key '{}' must be an object, got {}",
                                          path_.empty() ? "<root>" : path_, DescribeJson(object_)));
  }
}

std::string ConfigReader::KeyPath(std::string_view key) const {
  return path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
}

namespace {

bool IsAutoValue(const nlohmann::json& v) {
  return v.is_string() && v.get_ref<const std::string&>() == "auto";
}

}  // namespace

const nlohmann::json* ConfigReader::FindAsGiven(std::string_view key) {
  known_.emplace(key);
  if (!status_.ok()) return nullptr;
  auto it = object_.find(key);
  return it == object_.end() ? nullptr : &*it;
}

const nlohmann::json* ConfigReader::Find(std::string_view key) {
  const nlohmann::json* v = FindAsGiven(key);
  if (v == nullptr || !drop_auto_ || !IsAutoValue(*v)) return v;
  std::string path = KeyPath(key);
  if (std::find(dropped_.begin(), dropped_.end(), path) == dropped_.end()) {
    dropped_.push_back(std::move(path));
  }
  return nullptr;
}

bool ConfigReader::Has(std::string_view key) const {
  if (!object_.is_object()) return false;
  auto it = object_.find(key);
  return it != object_.end() && !(drop_auto_ && IsAutoValue(*it));
}

ConfigReader& ConfigReader::DropAuto() {
  drop_auto_ = true;
  return *this;
}

void ConfigReader::Fail(Status status) {
  if (status_.ok()) status_ = std::move(status);
}

ConfigReader& ConfigReader::Bool(std::string_view key, bool* out) {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return *this;
  if (!v->is_boolean()) {
    Fail(InvalidArgument(fmt::format("config key '{}' must be true or false, got {}", KeyPath(key),
                                     DescribeJson(*v))));
    return *this;
  }
  *out = v->get<bool>();
  return *this;
}

ConfigReader& ConfigReader::Int(std::string_view key, int64_t* out, int64_t min, int64_t max) {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return *this;
  // 1e9 written as a float is common in DeepSpeed configs; accept it when it is integral.
  const bool integral_float = v->is_number_float() && std::isfinite(v->get<double>()) &&
                              std::floor(v->get<double>()) == v->get<double>() &&
                              std::fabs(v->get<double>()) < 9.2e18;
  if (!v->is_number_integer() && !integral_float) {
    Fail(InvalidArgument(
        fmt::format("config key '{}' must be an integer, got {}", KeyPath(key), DescribeJson(*v))));
    return *this;
  }
  int64_t value = 0;
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX}) {
    value = INT64_MAX;
  } else {
    value = integral_float ? static_cast<int64_t>(v->get<double>()) : v->get<int64_t>();
  }
  if (value < min || value > max) {
    Fail(InvalidArgument(fmt::format("config key '{}' must be in [{}, {}], got {}", KeyPath(key),
                                     min, max, v->dump())));
    return *this;
  }
  *out = value;
  return *this;
}

ConfigReader& ConfigReader::Double(std::string_view key, double* out, double min, double max) {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return *this;
  if (!v->is_number()) {
    Fail(InvalidArgument(
        fmt::format("config key '{}' must be a number, got {}", KeyPath(key), DescribeJson(*v))));
    return *this;
  }
  const double value = v->get<double>();
  if (!(value >= min && value <= max)) {
    Fail(InvalidArgument(fmt::format("config key '{}' must be in [{}, {}], got {}", KeyPath(key),
                                     min, max, v->dump())));
    return *this;
  }
  *out = value;
  return *this;
}

ConfigReader& ConfigReader::String(std::string_view key, std::string* out) {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return *this;
  if (!v->is_string()) {
    Fail(InvalidArgument(
        fmt::format("config key '{}' must be a string, got {}", KeyPath(key), DescribeJson(*v))));
    return *this;
  }
  *out = v->get<std::string>();
  return *this;
}

ConfigReader& ConfigReader::Enum(std::string_view key, std::string* out,
                                 std::initializer_list<std::string_view> allowed) {
  std::string value = *out;
  String(key, &value);
  if (!status_.ok() || !Has(key)) return *this;
  for (std::string_view a : allowed) {
    if (a == value) {
      *out = value;
      return *this;
    }
  }
  std::string list;
  for (std::string_view a : allowed) list += fmt::format("{}{}", list.empty() ? "" : ", ", a);
  Fail(InvalidArgument(
      fmt::format("config key '{}' must be one of {}; got \"{}\"", KeyPath(key), list, value)));
  return *this;
}

namespace {

// A JSON number that is a whole, non-negative count that fits uint64_t (5e8 as DeepSpeed
// configs write it counts too); nullopt for anything else.
std::optional<uint64_t> WholeCount(const nlohmann::json& v) {
  if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0)) {
    return v.get<uint64_t>();
  }
  if (v.is_number_float() && v.get<double>() >= 0 &&
      std::floor(v.get<double>()) == v.get<double>() && v.get<double>() < 1.8e19) {
    return static_cast<uint64_t>(v.get<double>());
  }
  return std::nullopt;
}

}  // namespace

ConfigReader& ConfigReader::Count(std::string_view key, uint64_t* out, uint64_t min, uint64_t max,
                                  bool bytes) {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return *this;
  std::optional<uint64_t> value = WholeCount(*v);
  if (!value.has_value() && bytes && v->is_string()) {
    StatusOr<uint64_t> parsed = ParseBytes(v->get<std::string>());
    if (!parsed.ok()) {
      Fail(std::move(parsed).status().WithContext(fmt::format("config key '{}'", KeyPath(key))));
      return *this;
    }
    value = *parsed;
  }
  if (!value.has_value()) {
    Fail(InvalidArgument(
        bytes ? fmt::format(
                    "config key '{}' must be a byte count (integer or a string like \"64MiB\"), "
                    "got {}",
                    KeyPath(key), DescribeJson(*v))
        : v->is_string()
            ? fmt::format("config key '{}' counts elements (parameters), not bytes: give a "
                          "number such as 5e8, got {}",
                          KeyPath(key), DescribeJson(*v))
            : fmt::format("config key '{}' must be a non-negative whole number of elements (such "
                          "as 5e8), got {}",
                          KeyPath(key), DescribeJson(*v))));
    return *this;
  }
  if (*value < min || *value > max) {
    Fail(InvalidArgument(fmt::format("config key '{}' must be in [{}, {}] {}, got {}", KeyPath(key),
                                     min, max, bytes ? "bytes" : "elements", *value)));
    return *this;
  }
  *out = *value;
  return *this;
}

ConfigReader& ConfigReader::Bytes(std::string_view key, uint64_t* out, uint64_t min, uint64_t max) {
  return Count(key, out, min, max, /*bytes=*/true);
}

ConfigReader& ConfigReader::Elements(std::string_view key, uint64_t* out, uint64_t min,
                                     uint64_t max) {
  return Count(key, out, min, max, /*bytes=*/false);
}

bool ConfigReader::IsAuto(std::string_view key) {
  const nlohmann::json* v = FindAsGiven(key);
  return v != nullptr && IsAutoValue(*v);
}

ConfigReader& ConfigReader::Doubles(std::string_view key, std::vector<double>* out, size_t count) {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return *this;
  bool ok = v->is_array() && (count == 0 || v->size() == count);
  if (ok) {
    for (const auto& e : *v) ok = ok && e.is_number();
  }
  if (!ok) {
    Fail(InvalidArgument(fmt::format(
        "config key '{}' must be a list of {} numbers, got {}", KeyPath(key),
        count == 0 ? std::string("any number of") : std::to_string(count), DescribeJson(*v))));
    return *this;
  }
  out->clear();
  for (const auto& e : *v) out->push_back(e.get<double>());
  return *this;
}

ConfigReader& ConfigReader::Strings(std::string_view key, std::vector<std::string>* out) {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return *this;
  if (v->is_string()) {  // DeepSpeed's nvme_path may be one path or a list
    *out = {v->get<std::string>()};
    return *this;
  }
  bool ok = v->is_array();
  if (ok) {
    for (const auto& e : *v) ok = ok && e.is_string();
  }
  if (!ok) {
    Fail(
        InvalidArgument(fmt::format("config key '{}' must be a string or a list of strings, "
                                    "got {}",
                                    KeyPath(key), DescribeJson(*v))));
    return *this;
  }
  out->clear();
  for (const auto& e : *v) out->push_back(e.get<std::string>());
  return *this;
}

ConfigReader& ConfigReader::Object(std::string_view key,
                                   const std::function<void(ConfigReader&)>& read) {
  const nlohmann::json* v = Find(key);
  if (v == nullptr) return *this;
  ConfigReader child(*v, KeyPath(key));
  child.drop_auto_ = drop_auto_;
  if (child.status_.ok()) read(child);
  for (std::string& path : child.dropped_) {
    if (std::find(dropped_.begin(), dropped_.end(), path) == dropped_.end()) {
      dropped_.push_back(std::move(path));
    }
  }
  Fail(child.Finish());
  return *this;
}

ConfigReader& ConfigReader::Ignore(std::string_view key) {
  if (Find(key) != nullptr) log::Debug("config key '{}' has no effect in zinf", KeyPath(key));
  return *this;
}

namespace {

// Levenshtein distance, for suggesting the key a misspelt one was meant to be.
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

Status ConfigReader::Finish() {
  if (!status_.ok()) return status_;
  for (auto it = object_.begin(); it != object_.end(); ++it) {
    if (known_.count(it.key()) != 0) continue;
    std::string list;
    for (const std::string& k : known_) list += fmt::format("{}{}", list.empty() ? "" : ", ", k);
    // The nearest known key, when it is near enough to be a misspelling of it (a third of
    // its letters at most).
    std::string_view nearest;
    size_t best = it.key().size() / 3 + 1;
    for (const std::string& k : known_) {
      const size_t d = EditDistance(it.key(), k);
      if (d < best) best = d, nearest = k;
    }
    const std::string suggestion =
        nearest.empty() ? "" : fmt::format("; did you mean '{}'?", KeyPath(nearest));
    status_ =
        InvalidArgument(fmt::format("config key '{}' is not recognized{} (allowed here: {})",
                                    KeyPath(it.key()), suggestion, list.empty() ? "none" : list));
    break;
  }
  return status_;
}

}  // namespace zinf
