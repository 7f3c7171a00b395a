// AVX-512 kernels (16 floats per vector, one 64-byte line of each fp32 array). Compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c; called only when GetCpuInfo()
// reports them. bf16 uses the same integer rounding as the other kernels rather than
// VCVTNEPS2BF16, which flushes subnormals and so would not match the reference.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "cpu_optim/kernels.h"

namespace zinf::cpu_optim::avx512 {
#define ZINF_CPU_OPTIM_ISA avx512

struct Vec {
  using T = __m512;
  static constexpr int kWidth = 16;
  static T Set1(float x) { return _mm512_set1_ps(x); }
  static T Load(const float* p) { return _mm512_loadu_ps(p); }
  template <Elem G>
  static T LoadGrad(const void* g, size_t i) {
    if constexpr (G == Elem::kFp32) {
      return _mm512_loadu_ps(static_cast<const float*>(g) + i);
    } else {
      const __m256i h =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(g) + i));
      if constexpr (G == Elem::kBf16) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      } else {
        return _mm512_cvtph_ps(h);
      }
    }
  }
  template <bool kNt>
  static void Store(float* p, T x) {
    if constexpr (kNt) {
      _mm512_stream_ps(p, x);
    } else {
      _mm512_storeu_ps(p, x);
    }
  }
  static __m256i ToBf16(T x) {
    const __m512i b = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
    const __m512i nan = _mm512_or_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
    const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, r, nan));
  }
  template <CopyKind C, bool kNt>
  static void StoreCopy(void* c, size_t i, T x) {
    __m256i h;
    if constexpr (C == CopyKind::kBf16) {
      h = ToBf16(x);
    } else {
      h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    auto* dst = reinterpret_cast<__m256i*>(static_cast<uint16_t*>(c) + i);
    if constexpr (kNt) {
      _mm256_stream_si256(dst, h);
    } else {
      _mm256_storeu_si256(dst, h);
    }
  }
  static T Add(T a, T b) { return _mm512_add_ps(a, b); }
  static T Mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T Div(T a, T b) { return _mm512_div_ps(a, b); }
  static T Sqrt(T a) { return _mm512_sqrt_ps(a); }
  static T Fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T Fnma(T a, T b, T c) { return _mm512_fnmadd_ps(a, b, c); }
  static T NanTo(T x, T fallback) {
    return _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), fallback);
  }
  static T Sign(T a) {
    const __m512 zero = _mm512_setzero_ps();
    const __mmask16 pos = _mm512_cmp_ps_mask(a, zero, _CMP_GT_OQ);
    const __mmask16 neg = _mm512_cmp_ps_mask(a, zero, _CMP_LT_OQ);
    return _mm512_mask_mov_ps(_mm512_maskz_mov_ps(pos, _mm512_set1_ps(1.0f)), neg,
                              _mm512_set1_ps(-1.0f));
  }
  static void Prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
  static void StoreFence() { _mm_sfence(); }
};

#include "cpu_optim/kernel_impl.h"

namespace {

template <Elem G>
double SumSquaresT(const void* g, size_t n) {
  __m512d acc[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(),
                    _mm512_setzero_pd()};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 x0 = Vec::LoadGrad<G>(g, i);
    const __m512 x1 = Vec::LoadGrad<G>(g, i + 16);
    const __m512d d0 = _mm512_cvtps_pd(_mm512_castps512_ps256(x0));
    const __m512d d1 =
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x0), 1)));
    const __m512d d2 = _mm512_cvtps_pd(_mm512_castps512_ps256(x1));
    const __m512d d3 =
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x1), 1)));
    acc[0] = _mm512_fmadd_pd(d0, d0, acc[0]);
    acc[1] = _mm512_fmadd_pd(d1, d1, acc[1]);
    acc[2] = _mm512_fmadd_pd(d2, d2, acc[2]);
    acc[3] = _mm512_fmadd_pd(d3, d3, acc[3]);
  }
  const __m512d s = _mm512_add_pd(_mm512_add_pd(acc[0], acc[1]), _mm512_add_pd(acc[2], acc[3]));
  alignas(64) double lanes[8];
  _mm512_store_pd(lanes, s);
  double total = 0.0;
  for (int k = 0; k < 8; ++k) total += lanes[k];
  return total + SumSquaresScalar<G>(g, i, n);
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
}  // namespace zinf::cpu_optim::avx512

namespace zinf::cpu_optim {
const KernelTable& Avx512Kernels() {
  static const KernelTable table = {"avx512",          avx512::Step,     avx512::SumSquares,
                                    avx512::Limit,     avx512::FromFp32, avx512::ToFp32,
                                    avx512::Accumulate};
  return table;
}
}  // namespace zinf::cpu_optim
