// ElementType: the element formats zinf stores and moves (parameters, gradients, the
// low-precision parameter copy), one enum for the whole library.
//
// Thread-safety: pure functions.
#ifndef ZINF_DTYPE_H_
#define ZINF_DTYPE_H_

#include <cstddef>
#include <string_view>

#include "zinf/export.h"

namespace zinf {

enum class ElementType : int { kFp32 = 0, kBf16 = 1, kFp16 = 2 };
ZINF_EXPORT std::string_view ElementTypeName(ElementType type);  // "fp32", "bf16", "fp16"
ZINF_EXPORT size_t ElementSize(ElementType type);

}  // namespace zinf

#endif  // ZINF_DTYPE_H_
