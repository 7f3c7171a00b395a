// AVX2 + FMA + F16C kernels (8 floats per vector). Compiled with -mavx2 -mfma -mf16c only;
// called only when GetCpuInfo() reports all three.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "cpu_optim/kernels.h"

namespace zinf::cpu_optim::avx2 {
#define ZINF_CPU_OPTIM_ISA avx2

// The vector type kernel_impl.h runs on. bf16 rounding: add 0x7FFF plus the lowest kept bit,
// keep the high half; NaN becomes its top half with the quiet bit set (as FloatToBf16).
struct Vec {
  using T = __m256;
  static constexpr int kWidth = 8;
  static T Set1(float x) { return _mm256_set1_ps(x); }
  static T Load(const float* p) { return _mm256_loadu_ps(p); }
  template <Elem G>
  static T LoadGrad(const void* g, size_t i) {
    if constexpr (G == Elem::kFp32) {
      return _mm256_loadu_ps(static_cast<const float*>(g) + i);
    } else {
      const __m128i h =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(g) + i));
      if constexpr (G == Elem::kBf16) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      } else {
        return _mm256_cvtph_ps(h);
      }
    }
  }
  template <bool kNt>
  static void Store(float* p, T x) {
    if constexpr (kNt) {
      _mm256_stream_ps(p, x);
    } else {
      _mm256_storeu_ps(p, x);
    }
  }
  static __m128i ToBf16(T x) {
    const __m256i b = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x40));
    const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    r = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(nan), is_nan));
    // Values are <= 0xFFFF, so the unsigned saturating pack only narrows.
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  }
  template <CopyKind C, bool kNt>
  static void StoreCopy(void* c, size_t i, T x) {
    __m128i h;
    if constexpr (C == CopyKind::kBf16) {
      h = ToBf16(x);
    } else {
      h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    auto* dst = reinterpret_cast<__m128i*>(static_cast<uint16_t*>(c) + i);
    if constexpr (kNt) {
      _mm_stream_si128(dst, h);
    } else {
      _mm_storeu_si128(dst, h);
    }
  }
  static T Add(T a, T b) { return _mm256_add_ps(a, b); }
  static T Mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T Div(T a, T b) { return _mm256_div_ps(a, b); }
  static T Sqrt(T a) { return _mm256_sqrt_ps(a); }
  static T Fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T Fnma(T a, T b, T c) { return _mm256_fnmadd_ps(a, b, c); }
  static T NanTo(T x, T fallback) {
    return _mm256_blendv_ps(x, fallback, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }
  static T Sign(T a) {
    const __m256 zero = _mm256_setzero_ps();
    const __m256 pos = _mm256_and_ps(_mm256_cmp_ps(a, zero, _CMP_GT_OQ), _mm256_set1_ps(1.0f));
    const __m256 neg = _mm256_and_ps(_mm256_cmp_ps(a, zero, _CMP_LT_OQ), _mm256_set1_ps(-1.0f));
    return _mm256_or_ps(pos, neg);
  }
  static void Prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
  static void StoreFence() { _mm_sfence(); }
};

#include "cpu_optim/kernel_impl.h"

namespace {

template <Elem G>
__m256 LoadG(const void* g, size_t i) {
  return Vec::LoadGrad<G>(g, i);
}

template <Elem G>
double SumSquaresT(const void* g, size_t n) {
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                    _mm256_setzero_pd()};
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 x0 = LoadG<G>(g, i);
    const __m256 x1 = LoadG<G>(g, i + 8);
    const __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(x0));
    const __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(x0, 1));
    const __m256d d2 = _mm256_cvtps_pd(_mm256_castps256_ps128(x1));
    const __m256d d3 = _mm256_cvtps_pd(_mm256_extractf128_ps(x1, 1));
    acc[0] = _mm256_fmadd_pd(d0, d0, acc[0]);
    acc[1] = _mm256_fmadd_pd(d1, d1, acc[1]);
    acc[2] = _mm256_fmadd_pd(d2, d2, acc[2]);
    acc[3] = _mm256_fmadd_pd(d3, d3, acc[3]);
  }
  const __m256d s = _mm256_add_pd(_mm256_add_pd(acc[0], acc[1]), _mm256_add_pd(acc[2], acc[3]));
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, s);
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + SumSquaresScalar<G>(g, i, n);
}

void Step(const StepCoeffs& c, const StepArrays& a, bool nt, size_t pf) {
  StepAny<Vec>(c, a, nt, pf);
}
double SumSquares(const void* g, Elem type, size_t n) {
  switch (type) {
    case Elem::kFp32:
      return SumSquaresT<Elem::kFp32>(g, n);
    case Elem::kBf16:
      return SumSquaresT<Elem::kBf16>(g, n);
    case Elem::kFp16:
      return SumSquaresT<Elem::kFp16>(g, n);
    case Elem::kFp64:  // refused by the callers' checks
    case Elem::kInt64:
      break;
  }
  return 0.0;
}
void Limit(const StepArrays& a, bool nt, size_t pf) { LimitAny<Vec>(a, nt, pf); }

void FromFp32(const float* src, Elem to, void* dst, size_t n) { FromFp32Any<Vec>(src, to, dst, n); }
void ToFp32(const void* src, Elem from, float* dst, size_t n) { ToFp32Any<Vec>(src, from, dst, n); }
void Accumulate(float* acc, const float* x, size_t n) { AccumulateT<Vec>(acc, x, n); }

}  // namespace
#undef ZINF_CPU_OPTIM_ISA
}  // namespace zinf::cpu_optim::avx2

namespace zinf::cpu_optim {
const KernelTable& Avx2Kernels() {
  static const KernelTable table = {"avx2",         avx2::Step,   avx2::SumSquares, avx2::Limit,
                                    avx2::FromFp32, avx2::ToFp32, avx2::Accumulate};
  return table;
}
}  // namespace zinf::cpu_optim
