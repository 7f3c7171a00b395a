// The one definition of the optimizer kernels, instantiated once per instruction set.
//
// A kernel translation unit defines a vector type `Vec` (see kernels_avx2.cc for the members
// it needs) inside namespace zinf::cpu_optim::ZINF_CPU_OPTIM_ISA, then includes this file in
// that same namespace. Every template here therefore gets a distinct name per ISA, so the
// linker can never hand an AVX-512 instantiation to the scalar path (an ODR trap when the same
// inline template is compiled with different -m flags).
//
// See Note [Bitwise identical kernels]: the main loop runs Vec, the unaligned head and the tail
// run ScalarVec, and both evaluate exactly the same IEEE operations in the same order (no
// reassociation; fused multiply-add exactly where written; TUs built with -ffp-contract=off).
//
// Deliberately no standard-library includes beyond <cstddef>/<cstdint>: an inline library
// function emitted out of line under ISA flags could be picked by the linker for other TUs.
#ifndef ZINF_CPU_OPTIM_ISA
#error "define ZINF_CPU_OPTIM_ISA and include inside namespace zinf::cpu_optim::ZINF_CPU_OPTIM_ISA"
#endif

// Note [Bitwise identical kernels]
// The scalar reference, AVX2 and AVX-512 kernels produce the same bits for every element,
// NaN payloads aside. sqrt, division, multiplication, addition and fma are correctly rounded
// IEEE operations on every path; the only thing that could differ is which operations are
// used, and that is fixed by writing each formula once (UpdateOne below) against an abstract
// vector type. The bf16 and fp16 conversions are exact integer recipes (bf16) or F16C's
// documented rounding (fp16), reproduced by FloatToBf16/FloatToFp16. Tests compare every
// kernel against the scalar one element by element.

struct ScalarVec {
  using T = float;
  static constexpr int kWidth = 1;
  static T Set1(float x) { return x; }
  static T Load(const float* p) { return *p; }
  template <Elem G>
  static T LoadGrad(const void* g, size_t i) {
    if constexpr (G == Elem::kFp32) {
      return static_cast<const float*>(g)[i];
    } else if constexpr (G == Elem::kBf16) {
      return Bf16ToFloat(static_cast<const uint16_t*>(g)[i]);
    } else {
      return Fp16ToFloat(static_cast<const uint16_t*>(g)[i]);
    }
  }
  template <bool kNt>
  static void Store(float* p, T x) {
    *p = x;
  }
  template <CopyKind C, bool kNt>
  static void StoreCopy(void* c, size_t i, T x) {
    static_cast<uint16_t*>(c)[i] = C == CopyKind::kBf16 ? FloatToBf16(x) : FloatToFp16(x);
  }
  static T Add(T a, T b) { return a + b; }
  static T Mul(T a, T b) { return a * b; }
  static T Div(T a, T b) { return a / b; }
  static T Sqrt(T a) { return __builtin_sqrtf(a); }
  static T Fma(T a, T b, T c) { return __builtin_fmaf(a, b, c); }    // a*b + c, one rounding
  static T Fnma(T a, T b, T c) { return __builtin_fmaf(-a, b, c); }  // c - a*b, one rounding
  static T NanTo(T x, T fallback) { return x != x ? fallback : x; }  // fallback where x is NaN
  static T Sign(T a) { return a > 0.0f ? 1.0f : (a < 0.0f ? -1.0f : 0.0f); }
  static void Prefetch(const void*) {}
  static void StoreFence() {}
};

template <class V>
struct Consts {
  using T = typename V::T;
  explicit Consts(const StepCoeffs& c)
      : grad_scale(V::Set1(c.grad_scale)),
        beta1(V::Set1(c.beta1)),
        omb1(V::Set1(c.one_minus_beta1)),
        beta2(V::Set1(c.beta2)),
        omb2(V::Set1(c.one_minus_beta2)),
        eps(V::Set1(c.eps)),
        bc2_sqrt(V::Set1(c.bc2_sqrt)),
        inv_bc2_sqrt(V::Set1(c.inv_bc2_sqrt)),
        neg_step(V::Set1(c.neg_step_size)),
        decay(V::Set1(c.param_decay)),
        l2(V::Set1(c.l2)),
        has_l2(c.has_l2) {}
  T grad_scale, beta1, omb1, beta2, omb2, eps, bc2_sqrt, inv_bc2_sqrt, neg_step, decay, l2;
  bool has_l2;
};

// Note [Division by a constant]
// x / c for a c fixed over the step (torch's sqrt(v) / bias_correction2_sqrt), in the same
// bits but with a multiply and two fused multiply-adds instead of a division, which is the
// slowest instruction of the step (AdamW's other division, by a per-element denominator,
// stays). With y = RN(1/c), q = RN(x*y) is within an ulp of x/c, so the remainder x - c*q is
// exact in one fma, and RN(q + remainder*y) is RN(x/c) (Markstein's theorem, for round to
// nearest without overflow or underflow: here x = sqrt(v) is 0 or at least 2^-75 and c is in
// (0, 1]). An infinite x gives an infinite q and a NaN remainder: NanTo keeps q there, and a
// NaN x stays NaN. DivisionByConstantTest checks the identity over every exponent.
template <class V>
inline typename V::T DivByConst(typename V::T x, typename V::T c, typename V::T inv_c) {
  using T = typename V::T;
  const T q = V::Mul(x, inv_c);
  const T remainder = V::Fnma(q, c, x);
  return V::NanTo(V::Fma(remainder, inv_c, q), q);
}

// One step for one vector of elements, in torch's order of operations (see the public header
// for the formulas; the comments name the torch op each line mirrors).
template <Kind K, class V>
inline void UpdateOne(const Consts<V>& c, typename V::T g, typename V::T& p, typename V::T& s0,
                      typename V::T& s1) {
  using T = typename V::T;
  g = V::Mul(g, c.grad_scale);
  if constexpr (K == Kind::kAdamW || K == Kind::kAdam) {
    if constexpr (K == Kind::kAdamW) {
      p = V::Mul(p, c.decay);  // param.mul_(1 - lr*wd)
    } else {
      if (c.has_l2) g = V::Fma(p, c.l2, g);  // grad.add(param, alpha=wd)
    }
    s0 = V::Fma(g, c.omb1, V::Mul(s0, c.beta1));  // m.mul_(b1).add_(g, alpha=1-b1)
    s1 = V::Add(V::Mul(s1, c.beta2), V::Mul(V::Mul(c.omb2, g), g));  // v.mul_(b2).addcmul_
    T denom = V::Add(DivByConst<V>(V::Sqrt(s1), c.bc2_sqrt, c.inv_bc2_sqrt),
                     c.eps);                               // sqrt(v)/bc2_sqrt + eps
    p = V::Add(p, V::Mul(c.neg_step, V::Div(s0, denom)));  // addcdiv_
  } else if constexpr (K == Kind::kAdagrad) {
    if (c.has_l2) g = V::Fma(p, c.l2, g);
    s0 = V::Add(s0, V::Mul(g, g));  // sum.addcmul_(g, g, value=1)
    T denom = V::Add(V::Sqrt(s0), c.eps);
    p = V::Add(p, V::Mul(c.neg_step, V::Div(g, denom)));  // addcdiv_(g, std, value=-clr)
  } else {                                                // Lion
    p = V::Mul(p, c.decay);
    T update = V::Fma(g, c.omb1, V::Mul(s0, c.beta1));
    p = V::Fma(V::Sign(update), c.neg_step, p);  // p.add_(sign(update), alpha=-lr)
    s0 = V::Fma(g, c.omb2, V::Mul(s0, c.beta2));
  }
}

constexpr bool HasState1(Kind k) { return k == Kind::kAdamW || k == Kind::kAdam; }

// The arrays as restrict-qualified locals: without them the compiler must assume a store
// through params may change the StepArrays the pointers are read from, and reloads them after
// every store. Next to streaming stores those reloads cut the limit kernel's bandwidth by more
// than ten times on the development machine.
struct Ptrs {
  float* __restrict p;
  const void* __restrict g;
  float* __restrict s0;
  float* __restrict s1;
  void* __restrict copy;
};

inline Ptrs MakePtrs(const StepArrays& a) {
  return Ptrs{a.params, a.grads, a.state0, a.state1, a.copy};
}

template <Kind K, Elem G, CopyKind C, bool kNt, class V>
inline void UpdateAt(const Consts<V>& c, const Ptrs& a, size_t i) {
  using T = typename V::T;
  T g = V::template LoadGrad<G>(a.g, i);
  T p = V::Load(a.p + i);
  T s0 = V::Load(a.s0 + i);
  T s1 = s0;
  if constexpr (HasState1(K)) s1 = V::Load(a.s1 + i);
  UpdateOne<K, V>(c, g, p, s0, s1);
  V::template Store<kNt>(a.p + i, p);
  V::template Store<kNt>(a.s0 + i, s0);
  if constexpr (HasState1(K)) V::template Store<kNt>(a.s1 + i, s1);
  if constexpr (C != CopyKind::kNone) V::template StoreCopy<C, kNt>(a.copy, i, p);
}

inline size_t ElemBytes(Elem e) { return e == Elem::kFp32 ? 4 : 2; }

// Elements before params reaches a 64-byte boundary, and whether every output array reaches
// its streaming alignment at that same element.
inline bool StreamingHead(const StepArrays& a, bool two_states, size_t* head) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(a.params);
  if (p % 4 != 0) return false;
  *head = ((64 - p % 64) % 64) / 4;
  auto aligned = [&](const void* q, size_t elem_bytes, size_t align) {
    return (reinterpret_cast<uintptr_t>(q) + *head * elem_bytes) % align == 0;
  };
  if (!aligned(a.state0, 4, 64)) return false;
  if (two_states && !aligned(a.state1, 4, 64)) return false;
  if (a.copy != nullptr && !aligned(a.copy, 2, 32)) return false;
  return true;
}

// Elements per main-loop iteration: one 64-byte line of every fp32 array.
constexpr size_t kLineElems = 16;

template <Kind K, Elem G, CopyKind C, bool kNt, class V>
void StepLoop(const StepCoeffs& coeffs, const StepArrays& a, size_t prefetch_bytes) {
  const size_t n = a.count;
  size_t head = 0;
  if constexpr (kNt) {
    if (!StreamingHead(a, HasState1(K), &head)) {
      StepLoop<K, G, C, false, V>(coeffs, a, prefetch_bytes);
      return;
    }
  }
  if (head > n) head = n;
  const Consts<ScalarVec> cs(coeffs);
  const Consts<V> cv(coeffs);
  const Ptrs ptr = MakePtrs(a);
  size_t i = 0;
  for (; i < head; ++i) UpdateAt<K, G, C, false, ScalarVec>(cs, ptr, i);
  const size_t gbytes = ElemBytes(G);
  const char* pf_p = reinterpret_cast<const char*>(ptr.p) + prefetch_bytes;
  const char* pf_s0 = reinterpret_cast<const char*>(ptr.s0) + prefetch_bytes;
  const char* pf_s1 = reinterpret_cast<const char*>(ptr.s1) + prefetch_bytes;
  const char* pf_g = static_cast<const char*>(ptr.g) + prefetch_bytes / 4 * gbytes;
  for (; i + kLineElems <= n; i += kLineElems) {
    if (prefetch_bytes != 0) {
      // Prefetch addresses may run past the arrays' ends: prefetches never fault.
      V::Prefetch(pf_p + i * 4);
      V::Prefetch(pf_s0 + i * 4);
      if constexpr (HasState1(K)) V::Prefetch(pf_s1 + i * 4);
      V::Prefetch(pf_g + i * gbytes);
    }
    // One vector at a time, each loaded, updated and stored before the next: measured faster
    // than loading a whole line first (0.96 against 0.84 of the limit, AVX2, 64M params).
#pragma GCC unroll 16
    for (size_t j = 0; j < kLineElems; j += V::kWidth) UpdateAt<K, G, C, kNt, V>(cv, ptr, i + j);
  }
  for (; i < n; ++i) UpdateAt<K, G, C, false, ScalarVec>(cs, ptr, i);
  if constexpr (kNt) V::StoreFence();  // streaming stores are weakly ordered
}

template <Kind K, Elem G, CopyKind C, class V>
void StepNt(const StepCoeffs& c, const StepArrays& a, bool nt, size_t pf) {
  if (nt) {
    StepLoop<K, G, C, true, V>(c, a, pf);
  } else {
    StepLoop<K, G, C, false, V>(c, a, pf);
  }
}

template <Kind K, Elem G, class V>
void StepCopy(const StepCoeffs& c, const StepArrays& a, bool nt, size_t pf) {
  if (a.copy == nullptr) {
    StepNt<K, G, CopyKind::kNone, V>(c, a, nt, pf);
  } else if (a.copy_type == Elem::kFp16) {
    StepNt<K, G, CopyKind::kFp16, V>(c, a, nt, pf);
  } else {
    StepNt<K, G, CopyKind::kBf16, V>(c, a, nt, pf);
  }
}

template <Kind K, class V>
void StepGrad(const StepCoeffs& c, const StepArrays& a, bool nt, size_t pf) {
  switch (a.grad_type) {
    case Elem::kFp32:
      StepCopy<K, Elem::kFp32, V>(c, a, nt, pf);
      break;
    case Elem::kBf16:
      StepCopy<K, Elem::kBf16, V>(c, a, nt, pf);
      break;
    case Elem::kFp16:
      StepCopy<K, Elem::kFp16, V>(c, a, nt, pf);
      break;
    case Elem::kFp64:  // refused by the callers' checks
    case Elem::kInt64:
      break;
  }
}

template <class V>
void StepAny(const StepCoeffs& c, const StepArrays& a, bool nt, size_t pf) {
  switch (c.kind) {
    case Kind::kAdamW:
      StepGrad<Kind::kAdamW, V>(c, a, nt, pf);
      break;
    case Kind::kAdam:
      StepGrad<Kind::kAdam, V>(c, a, nt, pf);
      break;
    case Kind::kAdagrad:
      StepGrad<Kind::kAdagrad, V>(c, a, nt, pf);
      break;
    case Kind::kLion:
      StepGrad<Kind::kLion, V>(c, a, nt, pf);
      break;
  }
}

// ---- The bandwidth limit: same bytes, minimal arithmetic ----

template <Elem G, CopyKind C, bool kTwo, bool kNt, class V>
inline void LimitAt(const Ptrs& a, size_t i) {
  using T = typename V::T;
  T g = V::template LoadGrad<G>(a.g, i);
  T p = V::Load(a.p + i);
  T s0 = V::Load(a.s0 + i);
  T s1 = s0;
  if constexpr (kTwo) s1 = V::Load(a.s1 + i);
  p = V::Add(p, g);
  V::template Store<kNt>(a.p + i, p);
  V::template Store<kNt>(a.s0 + i, V::Add(s0, g));
  if constexpr (kTwo) V::template Store<kNt>(a.s1 + i, V::Add(s1, g));
  if constexpr (C != CopyKind::kNone) V::template StoreCopy<C, kNt>(a.copy, i, p);
}

template <Elem G, CopyKind C, bool kTwo, bool kNt, class V>
void LimitLoop(const StepArrays& a, size_t prefetch_bytes) {
  const size_t n = a.count;
  size_t head = 0;
  if constexpr (kNt) {
    if (!StreamingHead(a, kTwo, &head)) {
      LimitLoop<G, C, kTwo, false, V>(a, prefetch_bytes);
      return;
    }
  }
  if (head > n) head = n;
  const Ptrs ptr = MakePtrs(a);
  size_t i = 0;
  for (; i < head; ++i) LimitAt<G, C, kTwo, false, ScalarVec>(ptr, i);
  const size_t gbytes = ElemBytes(G);
  const char* pf_p = reinterpret_cast<const char*>(ptr.p) + prefetch_bytes;
  const char* pf_s0 = reinterpret_cast<const char*>(ptr.s0) + prefetch_bytes;
  const char* pf_s1 = reinterpret_cast<const char*>(ptr.s1) + prefetch_bytes;
  const char* pf_g = static_cast<const char*>(ptr.g) + prefetch_bytes / 4 * gbytes;
  for (; i + kLineElems <= n; i += kLineElems) {
    if (prefetch_bytes != 0) {
      V::Prefetch(pf_p + i * 4);
      V::Prefetch(pf_s0 + i * 4);
      if constexpr (kTwo) V::Prefetch(pf_s1 + i * 4);
      V::Prefetch(pf_g + i * gbytes);
    }
#pragma GCC unroll 16
    for (size_t j = 0; j < kLineElems; j += V::kWidth) LimitAt<G, C, kTwo, kNt, V>(ptr, i + j);
  }
  for (; i < n; ++i) LimitAt<G, C, kTwo, false, ScalarVec>(ptr, i);
  if constexpr (kNt) V::StoreFence();
}

template <Elem G, CopyKind C, bool kTwo, class V>
void LimitNt(const StepArrays& a, bool nt, size_t pf) {
  if (nt) {
    LimitLoop<G, C, kTwo, true, V>(a, pf);
  } else {
    LimitLoop<G, C, kTwo, false, V>(a, pf);
  }
}

template <Elem G, bool kTwo, class V>
void LimitCopy(const StepArrays& a, bool nt, size_t pf) {
  if (a.copy == nullptr) {
    LimitNt<G, CopyKind::kNone, kTwo, V>(a, nt, pf);
  } else {
    // Both copy formats move 2 bytes per element; bf16's integer rounding is the cheaper.
    LimitNt<G, CopyKind::kBf16, kTwo, V>(a, nt, pf);
  }
}

template <class V>
void LimitAny(const StepArrays& a, bool nt, size_t pf) {
  const bool two = a.state1 != nullptr;
  switch (a.grad_type) {
    case Elem::kFp32:
      two ? LimitCopy<Elem::kFp32, true, V>(a, nt, pf)
          : LimitCopy<Elem::kFp32, false, V>(a, nt, pf);
      break;
    case Elem::kBf16:
      two ? LimitCopy<Elem::kBf16, true, V>(a, nt, pf)
          : LimitCopy<Elem::kBf16, false, V>(a, nt, pf);
      break;
    case Elem::kFp16:
      two ? LimitCopy<Elem::kFp16, true, V>(a, nt, pf)
          : LimitCopy<Elem::kFp16, false, V>(a, nt, pf);
      break;
    case Elem::kFp64:  // refused by the callers' checks
    case Elem::kInt64:
      break;
  }
}

// ---- Conversions between fp32 and the 16-bit formats (vector body, scalar tail) ----

template <class V, CopyKind C>
void FromFp32T(const float* src, void* dst, size_t n) {
  size_t i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) {
    V::template StoreCopy<C, false>(dst, i, V::Load(src + i));
  }
  for (; i < n; ++i) ScalarVec::StoreCopy<C, false>(dst, i, src[i]);
}

template <class V, Elem G>
void ToFp32T(const void* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) {
    V::template Store<false>(dst + i, V::template LoadGrad<G>(src, i));
  }
  for (; i < n; ++i) dst[i] = ScalarVec::LoadGrad<G>(src, i);
}

// `to` and `from` are kBf16 or kFp16.
template <class V>
void FromFp32Any(const float* src, Elem to, void* dst, size_t n) {
  to == Elem::kFp16 ? FromFp32T<V, CopyKind::kFp16>(src, dst, n)
                    : FromFp32T<V, CopyKind::kBf16>(src, dst, n);
}

template <class V>
void ToFp32Any(const void* src, Elem from, float* dst, size_t n) {
  from == Elem::kFp16 ? ToFp32T<V, Elem::kFp16>(src, dst, n) : ToFp32T<V, Elem::kBf16>(src, dst, n);
}

template <class V>
void AccumulateT(float* acc, const float* x, size_t n) {
  size_t i = 0;
  for (; i + V::kWidth <= n; i += V::kWidth) {
    V::template Store<false>(acc + i, V::Add(V::Load(acc + i), V::Load(x + i)));
  }
  for (; i < n; ++i) acc[i] += x[i];
}

// ---- Scalar sum of squares (the reference, and the tails of the vector sums) ----

template <Elem G>
inline double SumSquaresScalar(const void* g, size_t begin, size_t end) {
  double s = 0.0;
  for (size_t i = begin; i < end; ++i) {
    const double x = ScalarVec::LoadGrad<G>(g, i);
    s = __builtin_fma(x, x, s);
  }
  return s;
}
