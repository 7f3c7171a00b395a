// Reading a model's safetensors files for `zinf ckpt import` (see hf.h): one file, or a
// Hugging Face checkpoint directory whose index is checked against its shards, so that a
// directory put together wrongly is refused naming the file and tensor rather than imported
// with tensors missing or twice.
#include <fmt/core.h>

#include <algorithm>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
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

// Whether `name` is `suffix` or ends with "." + `suffix`.
bool EndsWith(std::string_view name, std::string_view suffix) {
  return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix &&
         (name.size() == suffix.size() || name[name.size() - suffix.size() - 1] == '.');
}

// The first of `keys` that `config` holds as a non-negative integer, with its value.
std::optional<std::pair<std::string, int64_t>> SizeKey(const nlohmann::json& config,
                                                       std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    auto it = config.find(key);
    if (it != config.end() && it->is_number_integer() && it->get<int64_t>() >= 0) {
      return std::pair<std::string, int64_t>(key, it->get<int64_t>());
    }
  }
  return std::nullopt;
}

// The block index N of a name holding ".h.N.", ".layers.N.", ".layer.N." or ".blocks.N."
// (or starting so), or -1.
int64_t BlockIndex(std::string_view name) {
  for (std::string_view marker : {"h.", "layers.", "layer.", "blocks."}) {
    for (size_t at = name.find(marker); at != name.npos; at = name.find(marker, at + 1)) {
      if (at != 0 && name[at - 1] != '.') continue;
      size_t digits = at + marker.size();
      size_t end = digits;
      while (end < name.size() && end - digits < 9 && name[end] >= '0' && name[end] <= '9') ++end;
      if (end > digits && end < name.size() && name[end] == '.') {
        return std::stoll(std::string(name.substr(digits, end - digits)));
      }
    }
  }
  return -1;
}

}  // namespace

Status CheckHfConfigAgainstTensors(const nlohmann::json& config, std::string_view source,
                                   const std::vector<const SafetensorsTensor*>& tensors) {
  auto mismatch = [&](const std::pair<std::string, int64_t>& key, const SafetensorsTensor& t,
                      std::string_view what) {
    return InvalidArgument(
        fmt::format("{} says {} {}, but tensor '{}' is {} ({}): the config is another model's; "
                    "from_pretrained would refuse the directory",
                    source, key.first, key.second, t.name, nlohmann::json(t.shape).dump(), what));
  };
  const auto vocab = SizeKey(config, {"vocab_size"});
  const auto hidden = SizeKey(config, {"hidden_size", "n_embd", "d_model"});
  const auto positions = SizeKey(config, {"max_position_embeddings", "n_positions"});
  const auto layers = SizeKey(config, {"num_hidden_layers", "n_layer", "num_layers"});
  int64_t blocks = 0;
  const SafetensorsTensor* last_block = nullptr;
  for (const SafetensorsTensor* t : tensors) {
    const bool token_embedding =
        EndsWith(t->name, "wte.weight") || EndsWith(t->name, "embed_tokens.weight") ||
        EndsWith(t->name, "word_embeddings.weight") || EndsWith(t->name, "embed_in.weight") ||
        EndsWith(t->name, "tok_embeddings.weight");
    const bool head = EndsWith(t->name, "lm_head.weight") || EndsWith(t->name, "embed_out.weight");
    if ((token_embedding || head) && t->shape.size() == 2) {
      if (vocab && t->shape[0] != vocab->second) {
        return mismatch(*vocab, *t, "its rows are the vocabulary");
      }
      if (hidden && t->shape[1] != hidden->second) {
        return mismatch(*hidden, *t, "its columns are the hidden size");
      }
    }
    const bool position_embedding =
        EndsWith(t->name, "wpe.weight") || EndsWith(t->name, "position_embeddings.weight");
    if (position_embedding && t->shape.size() == 2 && positions &&
        t->shape[0] != positions->second) {
      return mismatch(*positions, *t, "its rows are the positions");
    }
    const int64_t block = BlockIndex(t->name);
    if (block >= 0 && block + 1 > blocks) {
      blocks = block + 1;
      last_block = t;
    }
  }
  if (layers && last_block != nullptr && blocks != layers->second) {
    return InvalidArgument(fmt::format(
        "{} says {} {}, but the tensors number {} blocks (the last is '{}'): the config is "
        "another model's; from_pretrained would refuse the directory",
        source, layers->first, layers->second, blocks, last_block->name));
  }
  return OkStatus();
}

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
  nlohmann::json config_object;  // config.json's, where the path is a directory
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
    ZINF_ASSIGN_OR_RETURN(config_object, ParseJson(w.config_json_, config));
    if (!config_object.is_object()) {
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
  if (!w.config_json_.empty()) {
    std::vector<const SafetensorsTensor*> tensors;
    for (const Entry& e : w.tensors_) tensors.push_back(e.tensor);
    ZINF_RETURN_IF_ERROR(
        CheckHfConfigAgainstTensors(config_object, path + "/" + kHfConfigFile, tensors));
  }
  return w;
}

}  // namespace zinf::ckpt
