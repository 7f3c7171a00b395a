// ElementType: the element formats zinf stores, moves and reduces, one enum for the whole
// library: parameters, gradients and the low-precision parameter copy are fp32, bf16 or fp16;
// collectives also carry fp64 and int64 scalars (gradient norms, agreement flags).
//
// Thread-safety: pure functions.
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

}  // namespace zinf

#endif  // ZINF_DTYPE_H_
