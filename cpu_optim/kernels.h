// The optimizer kernels' internal interface: one KernelTable per instruction set, each defined
// in its own translation unit compiled with that ISA's flags (kernels_scalar.cc,
// kernels_avx2.cc, kernels_avx512.cc). dispatch.cc picks one at run time.
//
// Every table computes the same fp32 operations in the same order (kernel_impl.h is the one
// definition, instantiated per ISA), so all kernels give bitwise identical updates.
// Only GradSumSquares may differ between ISAs in the last bits (lane order of the sum).
//
// Kernels are single-threaded and pure functions of their arguments: safe to call
// concurrently on disjoint arrays.
#ifndef ZINF_CPU_OPTIM_KERNELS_H_
#define ZINF_CPU_OPTIM_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "zinf/dtype.h"

namespace zinf::cpu_optim {

// Element formats (values match zinf::ElementType).
// The library's element types; the kernels take fp32, bf16 and fp16 (callers check).
using Elem = ElementType;
// The parameter copy a kernel writes.
enum class CopyKind : int { kNone = 0, kBf16 = 1, kFp16 = 2 };
// Optimizer formulas (values match zinf::OptimizerType).
enum class Kind : int { kAdamW = 0, kAdam = 1, kAdagrad = 2, kLion = 3 };

// The fp32 scalars of one step, computed once per step in double (as torch does) and rounded.
struct StepCoeffs {
  Kind kind = Kind::kAdamW;
  float grad_scale = 1.0f;
  float beta1 = 0.0f;            // Adam/AdamW/Lion
  float one_minus_beta1 = 0.0f;  // Adam/AdamW/Lion
  float beta2 = 0.0f;            // Adam/AdamW/Lion
  float one_minus_beta2 = 0.0f;  // Adam/AdamW/Lion
  float eps = 0.0f;              // Adam/AdamW/Adagrad
  float bc2_sqrt = 1.0f;         // sqrt(1 - beta2^t), Adam/AdamW
  float inv_bc2_sqrt = 1.0f;     // 1 / bc2_sqrt, rounded once (Note [Division by a constant])
  float neg_step_size = 0.0f;    // -lr/(1 - beta1^t) (Adam/AdamW), -clr (Adagrad), -lr (Lion)
  float param_decay = 1.0f;      // 1 - lr*wd (AdamW, Lion)
  float l2 = 0.0f;               // L2 weight decay added to the gradient (Adam, Adagrad)
  bool has_l2 = false;           // torch skips the add when weight_decay == 0
};

struct StepArrays {
  float* params = nullptr;
  const void* grads = nullptr;
  float* state0 = nullptr;
  float* state1 = nullptr;
  void* copy = nullptr;  // null: no copy
  size_t count = 0;
  Elem grad_type = Elem::kFp32;
  Elem copy_type = Elem::kBf16;
};

struct KernelTable {
  const char* name;
  // Updates arrays.count elements. `non_temporal` asks for streaming stores; the kernel falls
  // back to cached stores when the output arrays' alignments differ modulo 64 bytes.
  void (*step)(const StepCoeffs& coeffs, const StepArrays& arrays, bool non_temporal,
               size_t prefetch_bytes);
  // Sum of g*g in double over `count` gradients; Inf or NaN when any gradient is not finite.
  double (*grad_sum_squares)(const void* grads, Elem type, size_t count);
  // The bandwidth limit: an in-place read-modify-write over the same arrays and bytes as
  // `step` (params, state0, state1 when set: read and written; grads read; copy written),
  // with the least arithmetic that still touches every byte. Values are overwritten.
  void (*limit)(const StepArrays& arrays, bool non_temporal, size_t prefetch_bytes);
  // `count` fp32 values into `to` (kBf16 or kFp16), rounded as the parameter copies are, and
  // back from `from`: the same bits on every ISA.
  void (*from_fp32)(const float* src, Elem to, void* dst, size_t count);
  void (*to_fp32)(const void* src, Elem from, float* dst, size_t count);
  // acc[i] += x[i] for `count` fp32 values: the same bits on every ISA.
  void (*accumulate)(float* acc, const float* x, size_t count);
};

const KernelTable& ScalarKernels();
const KernelTable& Avx2Kernels();    // needs AVX2, FMA, F16C
const KernelTable& Avx512Kernels();  // needs AVX-512 F, BW, VL, DQ, F16C, FMA

// Scalar conversions (exact definitions the vector kernels reproduce bit for bit).
float Bf16ToFloat(uint16_t h);
uint16_t FloatToBf16(float f);  // round to nearest even; NaN stays NaN (quiet)
float Fp16ToFloat(uint16_t h);
uint16_t FloatToFp16(float f);  // round to nearest even, as F16C with _MM_FROUND_TO_NEAREST_INT

}  // namespace zinf::cpu_optim

#endif  // ZINF_CPU_OPTIM_KERNELS_H_
