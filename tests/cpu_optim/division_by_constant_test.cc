// Note [Division by a constant] (cpu_optim/kernel_impl.h): DivByConst gives the bits of x / c
// over the whole domain the kernels use it on (x = sqrt(v): 0, or 2^-75 up to 2^64; c a bias
// correction in (0, 1]), and keeps infinities and NaNs. The vector kernels evaluate the same
// operations per lane, and KernelsTest compares them with this scalar path bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu_optim/kernels.h"

namespace zinf::cpu_optim {
namespace division_test {
#define ZINF_CPU_OPTIM_ISA division_test
#include "cpu_optim/kernel_impl.h"
#undef ZINF_CPU_OPTIM_ISA
}  // namespace division_test

namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float Divide(float x, float c) {
  return division_test::DivByConst<division_test::ScalarVec>(x, c, 1.0f / c);
}

// The divisors: sqrt(1 - beta2^t) for the beta2 values trainers use, over a run's steps, and
// random values in [2^-13, 1] (every mantissa pattern is as likely).
std::vector<float> Divisors() {
  std::vector<float> out = {1.0f};
  for (double beta2 : {0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9995, 0.9999, 0.99999}) {
    for (int t : {1, 2, 3, 7, 10, 100, 1000, 10000, 100000}) {
      out.push_back(static_cast<float>(std::sqrt(1.0 - std::pow(beta2, t))));
    }
  }
  std::mt19937 rng(2026);
  std::uniform_real_distribution<float> c(0x1p-13f, 1.0f);
  for (int i = 0; i < 64; ++i) out.push_back(c(rng));
  return out;
}

TEST(DivisionByConstantTest, EqualsDivisionOverEveryExponent) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> mantissa(0, (1u << 23) - 1);
  int64_t checked = 0;
  for (float c : Divisors()) {
    for (int e = -75; e <= 64; ++e) {
      for (int i = 0; i < 1500; ++i) {
        // The extreme mantissas first, then random ones.
        const uint32_t m = i == 0 ? 0 : i == 1 ? (1u << 23) - 1 : mantissa(rng);
        const float x = std::ldexp(1.0f + static_cast<float>(m) * 0x1p-23f, e);
        ASSERT_EQ(Bits(Divide(x, c)), Bits(x / c)) << x << " / " << c;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 20'000'000);
}

TEST(DivisionByConstantTest, KeepsZeroInfinityAndNan) {
  for (float c : {1.0f, 0.0447101778f, 0x1p-13f}) {
    EXPECT_EQ(Bits(Divide(0.0f, c)), Bits(0.0f));
    EXPECT_EQ(Divide(std::numeric_limits<float>::infinity(), c),
              std::numeric_limits<float>::infinity());
    EXPECT_TRUE(std::isnan(Divide(std::numeric_limits<float>::quiet_NaN(), c)));
  }
}

}  // namespace
}  // namespace zinf::cpu_optim
