// `zinf ckpt export --hf`: a checkpoint as a Hugging Face model directory (see hf.h). The
// tensors' names, layouts and config come from hf_layout.h; this file writes them as
// save_pretrained does: shards filled in order up to max_shard_bytes, an index above one
// shard, config.json last.
#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <new>
#include <nlohmann/json.hpp>
#include <system_error>

#include "ckpt/checkpoint_internal.h"
#include "ckpt/export.h"
#include "ckpt/hf.h"
#include "ckpt/hf_layout.h"
#include "core/config_reader.h"
#include "zinf/dtype.h"
#include "zinf/input_file.h"

namespace zinf::ckpt {
namespace {

namespace fs = std::filesystem;

// config.json's names of the parameter types.
constexpr std::pair<const char*, ElementType> kTorchDtypes[] = {{"float32", ElementType::kFp32},
                                                                {"bfloat16", ElementType::kBf16},
                                                                {"float16", ElementType::kFp16}};

// The type the parameters are written in: the option, else the config's, else fp32; and
// config.json made to say it (transformers 4 reads "torch_dtype", 5 "dtype").
ElementType ChooseDtype(const HfExportOptions& options, nlohmann::json& config) {
  ElementType dtype = ElementType::kFp32;
  if (options.dtype_set) {
    dtype = options.dtype;
  } else {
    for (const char* key : {"dtype", "torch_dtype"}) {
      for (const auto& [name, type] : kTorchDtypes) {
        if (config.value(key, nlohmann::json()) == name) dtype = type;
      }
    }
  }
  const char* name = "float32";
  for (const auto& [n, type] : kTorchDtypes) {
    if (type == dtype) name = n;
  }
  if (config.contains("dtype")) config["dtype"] = name;
  if (config.contains("torch_dtype") || !config.contains("dtype")) config["torch_dtype"] = name;
  return dtype;
}

// `rows` x `cols` row-major into its transpose, in tiles that stay in cache.
void Transpose(const float* in, int64_t rows, int64_t cols, float* out) {
  constexpr int64_t kTile = 64;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      for (int64_t r = r0; r < std::min(rows, r0 + kTile); ++r) {
        for (int64_t c = c0; c < std::min(cols, c0 + kTile); ++c)
          out[c * rows + r] = in[r * cols + c];
      }
    }
  }
}

// What an export has written so far, removed unless it completes.
class WrittenFiles {
 public:
  explicit WrittenFiles(std::string dir, bool created_dir)
      : dir_(std::move(dir)), created_dir_(created_dir) {}
  ~WrittenFiles() {
    if (done_) return;
    std::error_code ec;
    for (const std::string& f : files_) fs::remove(f, ec);
    if (created_dir_) fs::remove(dir_, ec);  // only when empty
  }
  WrittenFiles(const WrittenFiles&) = delete;
  WrittenFiles& operator=(const WrittenFiles&) = delete;
  std::string Add(const std::string& name) {
    files_.push_back(dir_ + "/" + name);
    return files_.back();
  }
  void Done() { done_ = true; }

 private:
  std::string dir_;
  bool created_dir_;
  std::vector<std::string> files_;
  bool done_ = false;
};

// An absent or empty `dir`, created; whether this call created it.
StatusOr<bool> PrepareOutputDirectory(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec)) {
      return FailedPrecondition(fmt::format("--hf {} exists and is not a directory", dir));
    }
    if (!fs::is_empty(dir, ec) || ec) {
      return FailedPrecondition(fmt::format(
          "--hf {} is not empty: the export writes a fresh directory (files of an earlier "
          "model there, a model.safetensors beside a new index, would be loaded instead)",
          dir));
    }
    return false;
  }
  if (ec) return ErrnoStatus(ec.value(), "searching " + dir);
  if (!fs::create_directories(dir, ec)) return ErrnoStatus(ec.value(), "creating " + dir);
  return true;
}

Status Export(const std::string& path, const std::string& out_dir, const HfExportOptions& options) {
  nlohmann::json given;
  if (!options.config_file.empty()) {
    ZINF_ASSIGN_OR_RETURN(const std::string text,
                          ReadInputFile(options.config_file, "--hf-config"));
    ZINF_ASSIGN_OR_RETURN(given, ParseJson(text, "--hf-config " + options.config_file));
  }
  ZINF_ASSIGN_OR_RETURN(const ConsolidatedCheckpoint ckpt, ConsolidatedCheckpoint::Open(path));
  const Manifest& manifest = ckpt.manifest();
  StatusOr<HfLayout> layout_or =
      HfLayoutOf(manifest, options.config_file.empty() ? nullptr : &given);
  if (!layout_or.ok()) {
    return layout_or.status().WithContext(
        fmt::format("exporting {} as a Hugging Face model", ckpt.dir()));
  }
  HfLayout& layout = *layout_or;
  const ElementType dtype = ChooseDtype(options, layout.config);

  // The shards: tensors in order, a new shard where the next would pass the limit.
  std::vector<std::vector<SafetensorsEntry>> shards(1);
  std::vector<std::vector<const HfTensor*>> shard_tensors(1);
  uint64_t shard_bytes = 0, total = 0, largest = 0;
  for (const HfTensor& t : layout.tensors) {
    SafetensorsEntry e{t.name, "", t.shape, 0};
    if (t.is_buffer) {
      e.dtype = manifest.buffers[t.source].dtype;
      e.bytes = manifest.buffers[t.source].bytes;
    } else {
      const uint64_t numel = manifest.params[t.source].numel;
      e.dtype = SafetensorsDtypeName(dtype);
      e.bytes = numel * ElementSize(dtype);  // numel < 2^60: no overflow
      largest = std::max(largest, numel);
    }
    if (!shards.back().empty() && shard_bytes + e.bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_tensors.emplace_back();
      shard_bytes = 0;
    }
    shard_bytes += e.bytes;
    total += e.bytes;
    shards.back().push_back(std::move(e));
    shard_tensors.back().push_back(&t);
  }
  std::vector<float> full, transposed;
  std::vector<char> converted;
  try {
    full.reserve(largest);
    transposed.reserve(largest);
    converted.reserve(largest * ElementSize(dtype));
  } catch (const std::bad_alloc&) {
    return ResourceExhausted(fmt::format(
        "exporting {}: the largest parameter has {} elements, which this process cannot hold "
        "twice",
        ckpt.dir(), largest));
  }

  ZINF_ASSIGN_OR_RETURN(const bool created, PrepareOutputDirectory(out_dir));
  WrittenFiles written(out_dir, created);
  nlohmann::json weight_map = nlohmann::json::object();  // sorted by name, as HF writes it
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name = shards.size() == 1 ? std::string(kHfWeightsFile)
                                                : fmt::format("model-{:05d}-of-{:05d}.safetensors",
                                                              s + 1, shards.size());
    ZINF_ASSIGN_OR_RETURN(
        std::unique_ptr<SafetensorsWriter> out,
        SafetensorsWriter::Create(written.Add(name), shards[s], {{"format", "pt"}}));
    for (const HfTensor* t : shard_tensors[s]) {
      weight_map[t->name] = name;
      if (t->is_buffer) {
        const std::string_view bytes = ckpt.Buffer(t->source);
        ZINF_RETURN_IF_ERROR(out->Write(bytes.data(), bytes.size()));
        continue;
      }
      const ManifestParam& p = manifest.params[t->source];
      full.resize(p.numel);
      ZINF_RETURN_IF_ERROR(ckpt.ReadParam(t->source, full.data()));
      const float* values = full.data();
      if (t->transpose) {
        transposed.resize(p.numel);
        Transpose(full.data(), p.shape[0], p.shape[1], transposed.data());
        values = transposed.data();
      }
      converted.resize(p.numel * ElementSize(dtype));
      ConvertFromFp32(values, dtype, converted.data(), p.numel);
      ZINF_RETURN_IF_ERROR(out->Write(converted.data(), converted.size()));
    }
    ZINF_RETURN_IF_ERROR(out->Commit());
  }
  if (shards.size() > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total}}},
                                  {"weight_map", std::move(weight_map)}};
    ZINF_RETURN_IF_ERROR(
        internal::WriteFileAtomically(written.Add(kHfIndexFile), index.dump(2) + "\n"));
  }
  ZINF_RETURN_IF_ERROR(internal::WriteFileAtomically(written.Add(kHfConfigFile),
                                                     internal::Dump(layout.config, 2) + "\n"));
  written.Done();
  return OkStatus();
}

}  // namespace

StatusOr<uint64_t> ParseShardSize(std::string_view text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  std::string unit(text.substr(digits));
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::pair<const char*, uint64_t> kUnits[] = {{"", 1},
                                                     {"B", 1},
                                                     {"KB", 1'000},
                                                     {"MB", 1'000'000},
                                                     {"GB", 1'000'000'000},
                                                     {"KIB", 1ull << 10},
                                                     {"MIB", 1ull << 20},
                                                     {"GIB", 1ull << 30}};
  uint64_t n = 0;
  bool ok = digits > 0 && digits <= 18;
  if (ok) n = std::stoull(std::string(text.substr(0, digits)));
  for (const auto& [name, scale] : kUnits) {
    if (ok && unit == name) {
      uint64_t bytes = 0;
      if (n > 0 && !__builtin_mul_overflow(n, scale, &bytes)) return bytes;
    }
  }
  return InvalidArgument(fmt::format(
      "--max-shard-size must be a positive size such as 5GB, 500MB, 2GiB or a number of bytes, "
      "got '{}'",
      text.substr(0, 40)));
}

Status ExportHf(const std::string& path, const std::string& out_dir,
                const HfExportOptions& options) {
  if (options.max_shard_bytes == 0) return InvalidArgument("max_shard_bytes must be positive");
  return GuardedExport(path, options.dtype, [&] { return Export(path, out_dir, options); });
}

}  // namespace zinf::ckpt
