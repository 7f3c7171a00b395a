// Values the GPT kernel tests share: deterministic inputs, and bf16 rounding as the kernels
// round matmul inputs.
#ifndef ZINF_TESTS_GPT_GPT_TEST_VALUES_H_
#define ZINF_TESTS_GPT_GPT_TEST_VALUES_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "zinf/dtype.h"

namespace gpt::testing {

// `x` rounded to bf16 (nearest even) and back.
inline float RoundToBf16(float x) {
  uint16_t h;
  zinf::ConvertFromFp32(&x, zinf::ElementType::kBf16, &h, 1);
  float y;
  zinf::ConvertToFp32(&h, zinf::ElementType::kBf16, &y, 1);
  return y;
}

// Deterministic values in [-1, 1).
inline std::vector<float> Values(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& f : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    f = static_cast<float>(static_cast<double>(x >> 11) / (1ull << 53) * 2 - 1);
  }
  return v;
}

}  // namespace gpt::testing

#endif  // ZINF_TESTS_GPT_GPT_TEST_VALUES_H_
