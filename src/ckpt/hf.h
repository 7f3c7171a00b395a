// Hugging Face checkpoint directories, both ways:
//   `zinf ckpt export --hf DIR` (ExportHf): config.json and model.safetensors, or above
//   max_shard_bytes model-00001-of-0000N.safetensors... with model.safetensors.index.json,
//   as save_pretrained writes them, so that from_pretrained(DIR) loads the model;
//   `zinf ckpt import DIR` (WeightFiles): such a directory, or one safetensors file.
//
// The index: {"metadata": {"total_size": bytes of tensor data}, "weight_map": {tensor name:
// shard file name}}.
//
// Thread-safety: a WeightFiles may be read from several threads at once (see
// SafetensorsReader).
#ifndef ZINF_SRC_CKPT_HF_H_
#define ZINF_SRC_CKPT_HF_H_

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/safetensors.h"
#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf::ckpt {

inline constexpr char kHfConfigFile[] = "config.json";
inline constexpr char kHfWeightsFile[] = "model.safetensors";
inline constexpr char kHfIndexFile[] = "model.safetensors.index.json";
// save_pretrained's default max_shard_size ("5GB", decimal).
inline constexpr uint64_t kHfDefaultMaxShardBytes = 5'000'000'000;

struct HfExportOptions {
  // A config.json to write (--hf-config); empty: the checkpoint's own (see ckpt/hf_layout.h).
  std::string config_file;
  // The parameters' type; kFp32, kBf16 or kFp16. Unset: the config's torch_dtype (or dtype)
  // where it is one of float32, bfloat16, float16, else fp32. config.json says the type
  // written. Module buffers keep their own.
  bool dtype_set = false;
  ElementType dtype = ElementType::kFp32;
  // Tensors go into shards of at most this many bytes (a larger tensor alone in its own), as
  // save_pretrained's max_shard_size; one shard is model.safetensors with no index.
  uint64_t max_shard_bytes = kHfDefaultMaxShardBytes;
};

// Writes the checkpoint at `path` (see ResolveCheckpoint), saved by any world size, as a
// Hugging Face model directory `out_dir`, which must be empty or absent (a stale
// model.safetensors there would take precedence over a new index). Memory: the largest
// parameter, twice. Everything is checked before anything is written; on an error after that,
// what this call wrote is removed. InvalidArgument for a mapping refused (ckpt/hf_layout.h), a
// bad config file or option; FailedPrecondition for an `out_dir` that is not empty; DataLoss
// for a corrupt checkpoint; IoError.
Status ExportHf(const std::string& path, const std::string& out_dir,
                const HfExportOptions& options);

// "5GB", "500MB", "2GiB", "100kB" or a plain number of bytes, as transformers reads
// max_shard_size (decimal units for kB/MB/GB, binary for KiB/MiB/GiB). InvalidArgument
// otherwise, or for 0.
StatusOr<uint64_t> ParseShardSize(std::string_view text);

// The weight_map of model.safetensors.index.json's text, (tensor, shard file) in the order of
// the shard files, then of the index. DataLoss naming `source` for JSON that is not an object
// with a "weight_map" object of strings, a tensor named twice, or a shard that is not a plain
// file name in the directory.
StatusOr<std::vector<std::pair<std::string, std::string>>> ParseHfIndex(std::string_view text,
                                                                        std::string_view source);

// Checks a Hugging Face config.json (`config`, from `source`) against the model's tensors, as
// from_pretrained would find them when it builds the model from that config: vocab_size and
// the hidden size (hidden_size, n_embd, d_model) against the token embedding (and lm_head),
// the positions (max_position_embeddings, n_positions) against a learned position embedding,
// the layer count (num_hidden_layers, n_layer) against the numbered blocks. A key or tensor
// that is absent is not checked. InvalidArgument naming the key, its value, the tensor and its
// shape.
Status CheckHfConfigAgainstTensors(const nlohmann::json& config, std::string_view source,
                                   const std::vector<const SafetensorsTensor*>& tensors);

// The safetensors files of a model, opened and cross-checked: a file, or a Hugging Face
// checkpoint directory (config.json, and model.safetensors or a sharded
// model.safetensors.index.json; model.safetensors first where both are, as from_pretrained).
class WeightFiles {
 public:
  struct Entry {
    const SafetensorsReader* file;
    const SafetensorsTensor* tensor;
  };
  // InvalidArgument naming what is missing: no config.json, no weights (a directory of
  // pytorch_model.bin pickles is refused naming safetensors); DataLoss for an index that does
  // not agree with its shards: a shard missing, a tensor the index names that its shard lacks,
  // a tensor of a shard the index does not name there; the readers' errors for a bad file;
  // InvalidArgument for a config.json that disagrees with the tensors
  // (CheckHfConfigAgainstTensors).
  static StatusOr<WeightFiles> Open(const std::string& path);

  // config.json's text (a JSON object); empty for a lone file.
  const std::string& config_json() const { return config_json_; }
  // Every tensor, shard after shard, each in its file's order.
  const std::vector<Entry>& tensors() const { return tensors_; }

 private:
  std::string config_json_;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::vector<Entry> tensors_;
};

}  // namespace zinf::ckpt

#endif  // ZINF_SRC_CKPT_HF_H_
