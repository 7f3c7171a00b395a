// The scalar reference kernels, and the scalar float <-> bf16/fp16 conversions every kernel
// uses for its unaligned head and its tail. Built without ISA flags: runs on any x86-64.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu_optim/kernels.h"

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
}  // namespace

float Bf16ToFloat(uint16_t h) { return FromBits(static_cast<uint32_t>(h) << 16); }

uint16_t FloatToBf16(float f) {
  const uint32_t u = Bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in fp32.
    const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return FromBits(Bits(mag) | sign);
  }
  if (exp == 0x1F) {
    // Inf, or NaN made quiet (what F16C's vcvtph2ps does to a signalling NaN).
    return FromBits(sign | 0x7F800000u | (mant << 13) | (mant != 0 ? 0x00400000u : 0u));
  }
  return FromBits(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t FloatToFp16(float f) {
  const uint32_t u = Bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) {  // NaN: quiet, payload truncated, as vcvtps2ph
    return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  }
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to Inf
  if (a >= 0x38800000u) {  // normal fp16: rebias the exponent, round the mantissa to even
    const uint32_t r = a - 0x38000000u;
    return static_cast<uint16_t>(sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
  }
  // Subnormal fp16 (or zero): adding 0.5 puts the value's 2^-24 units in the low mantissa
  // bits, rounded to nearest even by the FPU.
  const float shifted = FromBits(a) + 0.5f;
  return static_cast<uint16_t>(sign | (Bits(shifted) - 0x3F000000u));
}

namespace scalar {
#define ZINF_CPU_OPTIM_ISA scalar
#include "cpu_optim/kernel_impl.h"
#undef ZINF_CPU_OPTIM_ISA

namespace {
void Step(const StepCoeffs& c, const StepArrays& a, bool nt, size_t pf) {
  StepAny<ScalarVec>(c, a, nt, pf);
}
double SumSquares(const void* g, Elem type, size_t n) {
  switch (type) {
    case Elem::kFp32:
      return SumSquaresScalar<Elem::kFp32>(g, 0, n);
    case Elem::kBf16:
      return SumSquaresScalar<Elem::kBf16>(g, 0, n);
    case Elem::kFp16:
      return SumSquaresScalar<Elem::kFp16>(g, 0, n);
    case Elem::kFp64:  // refused by the callers' checks
    case Elem::kInt64:
      break;
  }
  return 0.0;
}
void Limit(const StepArrays& a, bool nt, size_t pf) { LimitAny<ScalarVec>(a, nt, pf); }
void FromFp32(const float* src, Elem to, void* dst, size_t n) {
  FromFp32Any<ScalarVec>(src, to, dst, n);
}
void ToFp32(const void* src, Elem from, float* dst, size_t n) {
  ToFp32Any<ScalarVec>(src, from, dst, n);
}
void Accumulate(float* acc, const float* x, size_t n) { AccumulateT<ScalarVec>(acc, x, n); }
}  // namespace
}  // namespace scalar

const KernelTable& ScalarKernels() {
  static const KernelTable table = {"scalar",          scalar::Step,     scalar::SumSquares,
                                    scalar::Limit,     scalar::FromFp32, scalar::ToFp32,
                                    scalar::Accumulate};
  return table;
}

}  // namespace zinf::cpu_optim
