// The compute kernels `zinf bench profile` times for `zinf plan`, each as the example trainers
// run it: the MLP's hand-written loop and the GPT's std::exp on one thread, and with oneDNN
// (where the build found it: ZINF_TOOLS_HAVE_DNNL) the GPT's linear layers, attention's small
// batched matmuls, the tanh GELU and a call's fixed cost. They print nothing.
#ifndef ZINF_TOOLS_BENCH_KERNELS_H_
#define ZINF_TOOLS_BENCH_KERNELS_H_

#include <cstdint>

#include "zinf/status.h"

namespace zinf::tools {

// The MLP example's layer, forward and backward, on one thread: GFLOP/s.
double PlainLoopGflops(bool quick);
// std::exp as the GPT's softmax and loss loops call it, on one thread: evaluations a second.
double ExpPerSecond(bool quick);

#ifdef ZINF_TOOLS_HAVE_DNNL
// A GPT linear layer of `d` -> 4 `d` at `tokens` a micro-batch, forward and backward's two
// products, on `threads` threads: GFLOP/s over the three.
StatusOr<double> OneDnnGflops(bool bf16, int threads, int64_t d, int64_t tokens, bool quick);
// Attention's batched matmuls per sequence: GFLOP/s.
StatusOr<double> OneDnnAttentionGflops(int threads, bool quick);
// The tanh GELU, forward and backward: elements a second of each.
struct GeluRates {
  double forward = 0, backward = 0;
};
StatusOr<GeluRates> OneDnnGeluRates(int threads, bool quick);
// One small oneDNN call's fixed cost, in microseconds.
StatusOr<double> OneDnnCallMicros(int threads);
// Whether oneDNN runs bf16 natively here (AVX512_BF16 or AMX).
bool HasNativeBf16();
#endif

}  // namespace zinf::tools

#endif  // ZINF_TOOLS_BENCH_KERNELS_H_
