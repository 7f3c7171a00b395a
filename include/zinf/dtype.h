// ElementType: the element formats zinf stores, moves and reduces, one enum for the whole
// library: parameters, gradients and the low-precision parameter copy are fp32, bf16 or fp16;
// collectives also carry fp64 and int64 scalars (gradient norms, agreement flags). And the one
// home of the conversions between fp32 and the 16-bit types, which every layer, tool, example
// and test calls: they run on the CPU optimizer's vectorized kernels, picked once for this CPU
// (cpu_optim/optimizer_types.cc), so a caller links zinf_cpu_optim (or libzinf.so).
//
// Thread-safety: pure functions; the conversions may run on any threads at once.
#ifndef ZINF_DTYPE_H_
#define ZINF_DTYPE_H_

#include <cstddef>
#include <string_view>

#include "zinf/export.h"

namespace zinf {

enum class ElementType : int { kFp32 = 0, kBf16 = 1, kFp16 = 2, kFp64 = 3, kInt64 = 4 };
// "fp32", "bf16", "fp16", "fp64", "int64"
ZINF_EXPORT std::string_view ElementTypeName(ElementType type);
ZINF_EXPORT size_t ElementSize(ElementType type);  // bytes; 0 for a value outside the enum

// `count` fp32 values from `src` into `dst` as `type`, count * ElementSize(type) bytes: round to
// nearest even, NaN stays NaN (quiet), as the optimizers' 16-bit parameter copies are rounded.
// `type` is kFp32 (a copy), kBf16 or kFp16; the other types are not element formats and must
// not be passed. `src` and `dst` must not overlap.
ZINF_EXPORT void ConvertFromFp32(const float* src, ElementType type, void* dst, size_t count);
// `count` values of `type` (kFp32, kBf16 or kFp16) from `src` widened into `dst` as fp32,
// exactly. `src` and `dst` must not overlap.
ZINF_EXPORT void ConvertToFp32(const void* src, ElementType type, float* dst, size_t count);

}  // namespace zinf

#endif  // ZINF_DTYPE_H_
