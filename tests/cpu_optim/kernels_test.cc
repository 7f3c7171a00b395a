// Every kernel this CPU supports against the scalar reference, element by element and bit for
// bit: all optimizers, gradient types, copy types, store modes, awkward sizes and unaligned
// pointers; and the scalar bf16/fp16 conversions against their definitions and F16C.
#include "cpu_optim/kernels.h"

#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu_optim/dispatch.h"
#include "zinf/cpu_optimizer.h"

namespace zinf::cpu_optim {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Equal bits, or both NaN (payloads may differ between paths that combine two NaNs).
bool SameFloat(float a, float b) { return Bits(a) == Bits(b) || (std::isnan(a) && std::isnan(b)); }

std::vector<const KernelTable*> VectorKernels() {
  std::vector<const KernelTable*> out;
  for (CpuKernelIsa isa : SupportedCpuKernelIsas()) {
    if (isa != CpuKernelIsa::kScalar) out.push_back(&KernelsFor(isa));
  }
  return out;
}

// Arrays for one kernel run, padded so that the data can start at any float offset.
struct Arrays {
  Arrays(size_t n, size_t offset, Elem grad_type, CopyKind copy, bool two_states)
      : n(n), offset(offset), grad_type(grad_type), copy(copy), two_states(two_states) {
    const size_t pad = n + 64;
    p.resize(pad);
    s0.resize(pad);
    s1.resize(pad);
    g32.resize(pad);
    g16.resize(pad);
    c16.assign(pad, 0xDEAD);
  }
  StepArrays View() {
    StepArrays a;
    a.params = p.data() + offset;
    a.state0 = s0.data() + offset;
    a.state1 = two_states ? s1.data() + offset : nullptr;
    a.grads = grad_type == Elem::kFp32 ? static_cast<const void*>(g32.data() + offset)
                                       : static_cast<const void*>(g16.data() + offset);
    a.grad_type = grad_type;
    a.copy = copy == CopyKind::kNone ? nullptr : c16.data() + offset;
    a.copy_type = copy == CopyKind::kFp16 ? Elem::kFp16 : Elem::kBf16;
    a.count = n;
    return a;
  }
  size_t n, offset;
  Elem grad_type;
  CopyKind copy;
  bool two_states;
  std::vector<float> p, s0, s1, g32;
  std::vector<uint16_t> g16, c16;
};

// splitmix64: cheap enough to fill millions of elements per case.
struct Rng {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float Uniform() { return static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
  float Signed() { return 2.0f * Uniform() - 1.0f; }
};

void Fill(Arrays* a, uint32_t seed, bool adagrad) {
  Rng rng{seed};
  for (size_t i = 0; i < a->p.size(); ++i) {
    a->p[i] = 2.0f * rng.Signed();
    a->s0[i] = adagrad ? 1e-3f * rng.Uniform() : 0.1f * rng.Signed();
    a->s1[i] = 1e-3f * rng.Uniform();  // second moments are non-negative
    // Gradients over a wide range of magnitudes, zeros included (Lion's sign(0)).
    const uint64_t r = rng.Next();
    float g = rng.Signed() * std::ldexp(1.0f, static_cast<int>(r % 24) - 12);
    if (r % 97 == 0) g = 0.0f;
    a->g32[i] = g;
    a->g16[i] = a->grad_type == Elem::kFp16 ? FloatToFp16(g) : FloatToBf16(g);
  }
}

StepCoeffs Coeffs(Kind kind, bool l2) {
  StepCoeffs c;
  c.kind = kind;
  c.grad_scale = 0.75f;
  c.beta1 = 0.9f;
  c.one_minus_beta1 = 0.1f;
  c.beta2 = 0.999f;
  c.one_minus_beta2 = 0.001f;
  c.eps = 1e-8f;
  c.bc2_sqrt = 0.0447101778f;
  c.inv_bc2_sqrt = 1.0f / c.bc2_sqrt;
  c.neg_step_size = -1e-2f;
  c.param_decay = 0.9999f;
  c.has_l2 = l2;
  c.l2 = 0.01f;
  return c;
}

std::string Describe(const KernelTable& k, Kind kind, Elem g, CopyKind c, bool nt, size_t n,
                     size_t offset) {
  return std::string(k.name) + " kind=" + std::to_string(static_cast<int>(kind)) +
         " grad=" + std::to_string(static_cast<int>(g)) +
         " copy=" + std::to_string(static_cast<int>(c)) + " nt=" + std::to_string(nt) +
         " n=" + std::to_string(n) + " offset=" + std::to_string(offset);
}

void ExpectSameArrays(Arrays& want, Arrays& got, const std::string& what) {
  for (size_t i = 0; i < want.p.size(); ++i) {
    ASSERT_TRUE(SameFloat(want.p[i], got.p[i]))
        << what << " params[" << i << "] " << want.p[i] << " vs " << got.p[i];
    ASSERT_TRUE(SameFloat(want.s0[i], got.s0[i])) << what << " state0[" << i << "]";
    ASSERT_TRUE(SameFloat(want.s1[i], got.s1[i])) << what << " state1[" << i << "]";
    ASSERT_EQ(want.c16[i], got.c16[i]) << what << " copy[" << i << "]";
  }
}

class KernelsTest : public ::testing::TestWithParam<size_t> {};

// The large size: a million elements with an odd tail. In sanitizer builds (ZINF_SLOW_BUILD),
// where AddressSanitizer's checks make this test take 7 minutes at that size, a tenth of it
// walks the same loops, streaming heads and tails.
#ifdef ZINF_SLOW_BUILD
constexpr size_t kLarge = 100003;
#else
constexpr size_t kLarge = 1000003;
#endif

TEST_P(KernelsTest, EveryKernelMatchesScalarBitForBit) {
  const size_t n = GetParam();
  const auto kernels = VectorKernels();
  if (kernels.empty()) GTEST_SKIP() << "this CPU has no vector kernel (no AVX2+FMA+F16C)";
  // Offsets 0 (aligned vectors), 3 (unaligned), 16 (one line in): with the copy and states all
  // shifted together, streaming stores engage after a scalar head.
  const std::vector<size_t> offsets =
      n > 100000 ? std::vector<size_t>{0, 3} : std::vector<size_t>{0, 1, 3, 16};
  for (const KernelTable* k : kernels) {
    for (Kind kind : {Kind::kAdamW, Kind::kAdam, Kind::kAdagrad, Kind::kLion}) {
      const bool two = kind == Kind::kAdamW || kind == Kind::kAdam;
      for (Elem g : {Elem::kFp32, Elem::kBf16, Elem::kFp16}) {
        for (CopyKind c : {CopyKind::kNone, CopyKind::kBf16, CopyKind::kFp16}) {
          for (bool nt : {false, true}) {
            for (size_t offset : offsets) {
              const bool l2 = (n + offset) % 2 == 0;
              const std::string what = Describe(*k, kind, g, c, nt, n, offset);
              Arrays want(n, offset, g, c, two), got(n, offset, g, c, two);
              Fill(&want, static_cast<uint32_t>(n * 7 + offset), kind == Kind::kAdagrad);
              Fill(&got, static_cast<uint32_t>(n * 7 + offset), kind == Kind::kAdagrad);
              const StepCoeffs coeffs = Coeffs(kind, l2);
              ScalarKernels().step(coeffs, want.View(), false, 0);
              k->step(coeffs, got.View(), nt, 1024);
              ExpectSameArrays(want, got, what);
              if (HasFailure()) return;
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, KernelsTest,
                         ::testing::Values(size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17},
                                           kLarge));

TEST(KernelsTest, NonFiniteGradientsPropagateTheSameWay) {
  const auto kernels = VectorKernels();
  if (kernels.empty()) GTEST_SKIP() << "this CPU has no vector kernel";
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const KernelTable* k : kernels) {
    for (Kind kind : {Kind::kAdamW, Kind::kAdam, Kind::kAdagrad, Kind::kLion}) {
      const bool two = kind == Kind::kAdamW || kind == Kind::kAdam;
      const size_t n = 67;
      Arrays want(n, 0, Elem::kFp32, CopyKind::kBf16, two);
      Fill(&want, 5, kind == Kind::kAdagrad);
      want.g32[0] = inf;
      want.g32[9] = -inf;
      want.g32[20] = nan;
      want.g32[66] = nan;  // in the tail
      Arrays got = want;
      ScalarKernels().step(Coeffs(kind, true), want.View(), false, 0);
      k->step(Coeffs(kind, true), got.View(), false, 0);
      ExpectSameArrays(want, got, std::string(k->name) + " non-finite");
      EXPECT_TRUE(std::isnan(got.p[20]) || std::isinf(got.p[20]) || kind == Kind::kLion);
    }
  }
}

TEST(KernelsTest, GradSumSquaresAgreesAcrossKernelsAndFlagsNonFinite) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{1000003}}) {
    for (Elem type : {Elem::kFp32, Elem::kBf16, Elem::kFp16}) {
      Arrays a(n, 1, type, CopyKind::kNone, false);
      Fill(&a, 11, false);
      const StepArrays v = a.View();
      double exact = 0.0;
      for (size_t i = 0; i < n; ++i) {
        const double x = type == Elem::kFp32   ? a.g32[i + 1]
                         : type == Elem::kBf16 ? Bf16ToFloat(a.g16[i + 1])
                                               : Fp16ToFloat(a.g16[i + 1]);
        exact += x * x;
      }
      for (CpuKernelIsa isa : SupportedCpuKernelIsas()) {
        const double got = KernelsFor(isa).grad_sum_squares(v.grads, type, n);
        EXPECT_NEAR(got, exact, 1e-12 * exact + 1e-300) << CpuKernelIsaName(isa) << " n=" << n;
      }
    }
  }
  std::vector<float> g(100, 1.0f);
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                    -std::numeric_limits<float>::infinity()}) {
    for (size_t at : {size_t{0}, size_t{50}, size_t{99}}) {
      g[at] = bad;
      for (CpuKernelIsa isa : SupportedCpuKernelIsas()) {
        EXPECT_FALSE(std::isfinite(KernelsFor(isa).grad_sum_squares(g.data(), Elem::kFp32, 100)))
            << CpuKernelIsaName(isa) << " at " << at;
      }
      g[at] = 1.0f;
    }
  }
  // The largest finite fp32 squared does not overflow the double sum.
  std::vector<float> big(64, std::numeric_limits<float>::max());
  for (CpuKernelIsa isa : SupportedCpuKernelIsas()) {
    EXPECT_TRUE(std::isfinite(KernelsFor(isa).grad_sum_squares(big.data(), Elem::kFp32, 64)));
  }
}

TEST(KernelsTest, LimitKernelTouchesEveryElement) {
  for (CpuKernelIsa isa : SupportedCpuKernelIsas()) {
    for (bool nt : {false, true}) {
      const size_t n = 1000003;
      Arrays a(n, 0, Elem::kFp32, CopyKind::kBf16, true);
      std::fill(a.p.begin(), a.p.end(), 1.0f);
      std::fill(a.s0.begin(), a.s0.end(), 2.0f);
      std::fill(a.s1.begin(), a.s1.end(), 3.0f);
      std::fill(a.g32.begin(), a.g32.end(), 1.0f);
      KernelsFor(isa).limit(a.View(), nt, 1024);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(a.p[i], 2.0f) << CpuKernelIsaName(isa) << " " << i;
        ASSERT_EQ(a.s0[i], 3.0f);
        ASSERT_EQ(a.s1[i], 4.0f);
        ASSERT_EQ(a.c16[i], FloatToBf16(2.0f));
      }
    }
  }
}

// ---- Conversions ----

TEST(ConversionsTest, Bf16RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBf16(FromBits(0x3F808000)), 0x3F80);  // tie, even stays
  EXPECT_EQ(FloatToBf16(FromBits(0x3F818000)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(FloatToBf16(FromBits(0x3F808001)), 0x3F81);  // above the tie
  EXPECT_EQ(FloatToBf16(FromBits(0x7F7FFFFF)), 0x7F80);  // max float rounds to Inf
  EXPECT_EQ(FloatToBf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(FloatToBf16(FromBits(0x00000001)), 0x0000);  // smallest subnormal rounds to 0
  // A NaN whose payload lives only in the low half must stay a NaN, not become Inf.
  const uint16_t nan = FloatToBf16(FromBits(0x7F800001));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(nan)));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(FromBits(0xFFC00000)))));
  EXPECT_EQ(FloatToBf16(FromBits(0xFFC00000)) & 0x8000, 0x8000);
  // Every bf16 value survives the round trip.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBf16(f), h);
  }
}

TEST(ConversionsTest, Fp16MatchesItsDefinition) {
  EXPECT_EQ(FloatToFp16(1.0f), 0x3C00);
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToFp16(65519.996f), 0x7BFF);
  EXPECT_EQ(FloatToFp16(65520.0f), 0x7C00);  // the tie rounds to even: Inf
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: 0
  EXPECT_EQ(FloatToFp16(std::ldexp(3.0f, -26)), 0x0001);  // 0.75 ulp rounds up
  EXPECT_EQ(FloatToFp16(-0.0f), 0x8000);
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Fp16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_EQ(h & 0x7C00u, 0x7C00u);
      continue;
    }
    ASSERT_EQ(FloatToFp16(f), h) << std::hex << h;
  }
}

// The scalar fp16 conversions must equal F16C's for every input (the vector kernels use F16C
// in their body and the scalar code in their head and tail). Checks every 2^32 / 4099-th float
// plus every float near fp16's rounding boundaries.
__attribute__((target("f16c,avx"))) uint16_t F16cFromFloat(float f) {
  return static_cast<uint16_t>(_mm_extract_epi16(
      _mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), 0));
}
__attribute__((target("f16c,avx"))) float F16cToFloat(uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

TEST(ConversionsTest, Fp16MatchesF16c) {
  if (!IsaSupported(CpuKernelIsa::kAvx2)) GTEST_SKIP() << "no F16C on this CPU";
  auto check = [](uint32_t u) {
    const float f = FromBits(u);
    ASSERT_EQ(FloatToFp16(f), F16cFromFloat(f)) << std::hex << u;
  };
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 4099) check(static_cast<uint32_t>(u));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = Fp16ToFloat(static_cast<uint16_t>(h));
    const float hw = F16cToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(Bits(f), Bits(hw)) << std::hex << h;
    if (std::isnan(f)) continue;
    const uint32_t u = Bits(f);
    for (uint32_t d = 0; d < 8; ++d) {
      for (uint32_t boundary : {u, u + 0x1000u, u + 0x0FFFu, u + 0x1001u, u - 1u}) {
        check(boundary + d - 4);
      }
    }
  }
}

// The tables' bulk conversions (ConvertFromFp32/ConvertToFp32) agree with the scalar
// definitions element for element on every ISA, for every length (vector body and tail) and
// for the values that round specially: ties, overflow to Inf, subnormals, NaN.
TEST(ConversionsTest, BulkConversionsMatchTheScalarDefinitionsOnEveryIsa) {
  std::mt19937 rng(7);
  std::vector<float> src(1000003);
  std::uniform_real_distribution<float> uniform(-70000.0f, 70000.0f);
  for (float& x : src) x = uniform(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 30);
  const uint32_t special[] = {0x3F808000, 0x3F818000, 0x7F7FFFFF, 0xFF800000, 0x00000001,
                              0x7F800001, 0xFFC00000, 0x477FF000, 0x33000000, 0x80000000};
  for (size_t i = 0; i < std::size(special); ++i) src[i * 97] = FromBits(special[i]);
  for (CpuKernelIsa isa : SupportedCpuKernelIsas()) {
    const KernelTable& k = KernelsFor(isa);
    for (Elem type : {Elem::kBf16, Elem::kFp16}) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, src.size() - 1}) {
        std::vector<uint16_t> half(n + 1, 0xABCD);
        k.from_fp32(src.data() + 1, type, half.data(), n);  // unaligned source
        for (size_t i = 0; i < n; ++i) {
          const uint16_t want =
              type == Elem::kBf16 ? FloatToBf16(src[i + 1]) : FloatToFp16(src[i + 1]);
          ASSERT_EQ(half[i], want)
              << k.name << " " << static_cast<int>(type) << " n " << n << " i " << i;
        }
        ASSERT_EQ(half[n], 0xABCD) << "wrote past the end";
        std::vector<float> back(n + 1, -1.0f);
        k.to_fp32(half.data(), type, back.data(), n);
        for (size_t i = 0; i < n; ++i) {
          const float want = type == Elem::kBf16 ? Bf16ToFloat(half[i]) : Fp16ToFloat(half[i]);
          ASSERT_TRUE(std::memcmp(&back[i], &want, 4) == 0 ||
                      (std::isnan(back[i]) && std::isnan(want)))
              << k.name << " n " << n << " i " << i;
        }
        ASSERT_EQ(back[n], -1.0f);
      }
    }
  }
}

// accumulate is the plain loop's fp32 additions, bit for bit, on every ISA and length.
TEST(ConversionsTest, AccumulateMatchesThePlainLoopOnEveryIsa) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1e3f);
  std::vector<float> x(4099), acc0(4099);
  for (float& v : x) v = normal(rng);
  for (float& v : acc0) v = normal(rng) * 1e-3f;
  x[5] = INFINITY;
  for (CpuKernelIsa isa : SupportedCpuKernelIsas()) {
    const KernelTable& k = KernelsFor(isa);
    for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{17}, x.size() - 2}) {
      std::vector<float> acc(acc0);
      k.accumulate(acc.data(), x.data() + 1, n);  // unaligned source
      for (size_t i = 0; i < acc.size(); ++i) {
        const float want = i < n ? acc0[i] + x[i + 1] : acc0[i];
        ASSERT_EQ(std::memcmp(&acc[i], &want, 4), 0) << k.name << " n " << n << " i " << i;
      }
    }
  }
}

}  // namespace
}  // namespace zinf::cpu_optim
