// Reading a model's safetensors files for `zinf ckpt import` (see hf.h): one file, or a
// Hugging Face checkpoint directory whose index is checked against its shards, so that a
// directory put together wrongly is refused naming the file and tensor rather than imported
// with tensors missing or twice.
#include <fmt/core.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>

#include "ckpt/hf.h"
#include "core/config_reader.h"
#include "zinf/input_file.h"

namespace zinf::ckpt {
namespace {

namespace fs = std::filesystem;

// A safetensors index names at most this many bytes of JSON (a million tensors).
constexpr uint64_t kMaxIndexBytes = 256ull << 20;

StatusOr<bool> IsFile(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return ErrnoStatus(ec.value(), "searching " + path);
  }
  return !ec && fs::is_regular_file(st);
}

}  // namespace

StatusOr<std::vector<std::pair<std::string, std::string>>> ParseHfIndex(std::string_view text,
                                                                        std::string_view source) {
  auto bad = [&](const std::string& what) { return DataLoss(fmt::format("{}: {}", source, what)); };
  StatusOr<nlohmann::json> parsed = ParseJson(text, "the index", /*unique_keys=*/true);
  if (!parsed.ok()) return bad(std::string(parsed.status().message()));
  const nlohmann::json& index = *parsed;
  if (!index.is_object()) return bad("not a JSON object but " + DescribeJson(index));
  auto map = index.find("weight_map");
  if (map == index.end() || !map->is_object()) {
    return bad("no \"weight_map\" object of tensor names to shard files");
  }
  std::vector<std::pair<std::string, std::string>> entries;
  for (auto it = map->begin(); it != map->end(); ++it) {
    if (!it->is_string()) {
      return bad(fmt::format("weight_map names {} for tensor '{}', not a file name",
                             DescribeJson(*it), it.key()));
    }
    const std::string file = it->get<std::string>();
    if (file.empty() || file.find('/') != file.npos || file == "." || file == "..") {
      return bad(
          fmt::format("weight_map puts tensor '{}' in '{}', which is not a file name in "
                      "the directory",
                      it.key(), file.substr(0, 300)));
    }
    entries.emplace_back(it.key(), file);
  }
  if (entries.empty()) return bad("weight_map names no tensors");
  std::stable_sort(entries.begin(), entries.end(),
                   [](const auto& a, const auto& b) { return a.second < b.second; });
  return entries;
}

StatusOr<WeightFiles> WeightFiles::Open(const std::string& path) {
  WeightFiles w;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    ZINF_ASSIGN_OR_RETURN(SafetensorsReader file, SafetensorsReader::Open(path));
    w.files_.push_back(std::make_unique<SafetensorsReader>(std::move(file)));
  } else {
    const std::string config = path + "/" + kHfConfigFile;
    ZINF_ASSIGN_OR_RETURN(const bool has_config, IsFile(config));
    ZINF_ASSIGN_OR_RETURN(const bool single, IsFile(path + "/" + kHfWeightsFile));
    ZINF_ASSIGN_OR_RETURN(const bool indexed, IsFile(path + "/" + kHfIndexFile));
    if (!single && !indexed) {
      for (const char* pickle : {"pytorch_model.bin", "pytorch_model.bin.index.json"}) {
        ZINF_ASSIGN_OR_RETURN(const bool has_pickle, IsFile(path + "/" + pickle));
        if (has_pickle) {
          return InvalidArgument(fmt::format(
              "{} holds {} (PyTorch pickles), which zinf does not read: it reads safetensors "
              "(model.safetensors); save_pretrained(DIR) writes them (its default since "
              "transformers 4.35)",
              path, pickle));
        }
      }
      return InvalidArgument(
          fmt::format("{} is not a Hugging Face checkpoint: it has neither {} nor {}", path,
                      kHfWeightsFile, kHfIndexFile));
    }
    if (!has_config) {
      return InvalidArgument(fmt::format(
          "{} has no {}: a Hugging Face checkpoint directory holds the model's config beside "
          "its weights",
          path, kHfConfigFile));
    }
    ZINF_ASSIGN_OR_RETURN(w.config_json_, ReadInputFile(config, "the model's config"));
    ZINF_ASSIGN_OR_RETURN(const nlohmann::json parsed, ParseJson(w.config_json_, config));
    if (!parsed.is_object()) {
      return InvalidArgument(fmt::format("{} is not a JSON object", config));
    }
    if (single) {
      ZINF_ASSIGN_OR_RETURN(SafetensorsReader file,
                            SafetensorsReader::Open(path + "/" + kHfWeightsFile));
      w.files_.push_back(std::make_unique<SafetensorsReader>(std::move(file)));
    } else {
      const std::string index_path = path + "/" + kHfIndexFile;
      ZINF_ASSIGN_OR_RETURN(const std::string text,
                            ReadInputFile(index_path, "the weights index", kMaxIndexBytes));
      ZINF_ASSIGN_OR_RETURN(const auto entries, ParseHfIndex(text, index_path));
      std::map<std::string, std::string> shard_of(entries.begin(), entries.end());
      for (size_t i = 0; i < entries.size(); ++i) {
        const std::string& shard = entries[i].second;
        if (i > 0 && entries[i - 1].second == shard) continue;
        const std::string shard_path = path + "/" + shard;
        ZINF_ASSIGN_OR_RETURN(const bool present, IsFile(shard_path));
        if (!present) {
          return DataLoss(fmt::format("{} names shard {} (tensor '{}'), which is missing",
                                      index_path, shard, entries[i].first));
        }
        ZINF_ASSIGN_OR_RETURN(SafetensorsReader file, SafetensorsReader::Open(shard_path));
        for (const SafetensorsTensor& t : file.tensors()) {
          auto it = shard_of.find(t.name);
          if (it == shard_of.end() || it->second != shard) {
            return DataLoss(
                fmt::format("{} holds tensor '{}', which {} {}", shard_path, t.name, index_path,
                            it == shard_of.end() ? "does not name" : "puts in " + it->second));
          }
        }
        w.files_.push_back(std::make_unique<SafetensorsReader>(std::move(file)));
      }
      // Every tensor of a shard is the index's for that shard (above), so a name seen is
      // where the index puts it.
      std::set<std::string_view> seen;
      for (const auto& f : w.files_) {
        for (const SafetensorsTensor& t : f->tensors()) seen.insert(t.name);
      }
      for (const auto& [tensor, shard] : entries) {
        if (seen.count(tensor) == 0) {
          return DataLoss(
              fmt::format("{} puts tensor '{}' in {}, which lacks it", index_path, tensor, shard));
        }
      }
    }
  }
  for (const auto& f : w.files_) {
    for (const SafetensorsTensor& t : f->tensors()) w.tensors_.push_back({f.get(), &t});
  }
  if (w.tensors_.empty()) return InvalidArgument(path + " holds no tensors");
  return w;
}

}  // namespace zinf::ckpt
