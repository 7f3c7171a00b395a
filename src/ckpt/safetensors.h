// Reading safetensors files: the weights `zinf ckpt import` turns into a checkpoint and
// Engine::LoadSafetensors loads into a model (`zinf ckpt export` writes them, export.cc).
//
// The format: an 8-byte little-endian header length N, N bytes of JSON mapping each tensor
// name to {"dtype", "shape", "data_offsets": [begin, end)} (offsets relative to the data,
// which follows the header), an optional "__metadata__" object of strings, then the data.
// Tensors are row-major. zinf reads F32, BF16 and F16 as values (widened to fp32), and F64
// and the integer types (I64, I32, I16, I8, U8, BOOL: BatchNorm's num_batches_tracked, masks)
// as bytes.
//
// Thread-safety: a SafetensorsReader may be read from several threads at once (pread).
#ifndef ZINF_SRC_CKPT_SAFETENSORS_H_
#define ZINF_SRC_CKPT_SAFETENSORS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf::ckpt {

struct SafetensorsTensor {
  std::string name;
  std::string type;                        // the safetensors name: "F32", "I64", ...
  bool is_float = true;                    // F32, BF16 or F16: `dtype` says which
  ElementType dtype = ElementType::kFp32;  // kFp32, kBf16 or kFp16 where is_float
  uint64_t element_bytes = 4;
  std::vector<int64_t> shape;   // [] for a scalar
  uint64_t numel = 0;           // the product of the shape
  uint64_t begin = 0, end = 0;  // data_offsets: bytes relative to the data
};

// "F32", "BF16", "F16" for those types; "" for the others.
std::string_view SafetensorsDtypeName(ElementType type);

// Parses the JSON header of a file whose data section has `data_bytes` bytes, without
// touching the disk (the entry point for fuzzing). Tensors come in the header's order. Never
// throws. DataLoss naming `source` and the tensor for: JSON that does not parse or is not an
// object, an entry without a string dtype, a shape of non-negative integers or two integer
// data_offsets, offsets out of order or past the data, a byte count that is not the shape's
// elements times the dtype's size, tensors that overlap. InvalidArgument naming the tensor for
// a dtype zinf does not read (the known safetensors types, e.g. I64, and unknown strings).
StatusOr<std::vector<SafetensorsTensor>> ParseSafetensorsHeader(std::string_view json,
                                                                uint64_t data_bytes,
                                                                std::string_view source);

class SafetensorsReader {
 public:
  // Opens `path` and checks its header (see ParseSafetensorsHeader): IoError when it cannot
  // be opened or read; DataLoss for a file shorter than 8 bytes, a header length past the
  // end of the file, or a header that fails to parse.
  static StatusOr<SafetensorsReader> Open(const std::string& path);
  SafetensorsReader(SafetensorsReader&&) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&&) noexcept;
  ~SafetensorsReader();

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // The tensor named `name`, or nullptr.
  const SafetensorsTensor* Find(std::string_view name) const;
  // Reads `tensor` (one of tensors()) into `out`, numel values, widened to fp32. IoError (or
  // DataLoss for a file that ends early) naming the file and tensor; InvalidArgument for a
  // tensor that is not F32, BF16 or F16.
  Status ReadFp32(const SafetensorsTensor& tensor, float* out) const;
  // Elements [first, first + count) of the flattened tensor; InvalidArgument past its end.
  Status ReadFp32(const SafetensorsTensor& tensor, uint64_t first, uint64_t count,
                  float* out) const;
  // The tensor's bytes as stored (any dtype): `out` holds tensor.end - tensor.begin bytes.
  Status ReadBytes(const SafetensorsTensor& tensor, void* out) const;

 private:
  SafetensorsReader() = default;
  std::string path_;
  int fd_ = -1;
  uint64_t data_offset_ = 0;  // 8 + header length
  std::vector<SafetensorsTensor> tensors_;
};

}  // namespace zinf::ckpt

#endif  // ZINF_SRC_CKPT_SAFETENSORS_H_
