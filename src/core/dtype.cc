// See include/zinf/dtype.h.
#include "zinf/dtype.h"

namespace zinf {

std::string_view ElementTypeName(ElementType type) {
  switch (type) {
    case ElementType::kFp32:
      return "fp32";
    case ElementType::kBf16:
      return "bf16";
    case ElementType::kFp16:
      return "fp16";
    case ElementType::kFp64:
      return "fp64";
    case ElementType::kInt64:
      return "int64";
  }
  return "unknown";
}

size_t ElementSize(ElementType type) {
  switch (type) {
    case ElementType::kFp32:
      return 4;
    case ElementType::kBf16:
    case ElementType::kFp16:
      return 2;
    case ElementType::kFp64:
    case ElementType::kInt64:
      return 8;
  }
  return 0;
}

}  // namespace zinf
