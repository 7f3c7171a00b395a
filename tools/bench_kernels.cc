// See tools/bench_kernels.h.
#include "tools/bench_kernels.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "tools/bench_util.h"

#ifdef ZINF_TOOLS_HAVE_DNNL
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace zinf::tools {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The seconds one call of `call` takes: the median over `reps` repetitions of `calls` calls.
template <typename Call>
double MedianSecondsPerCall(int reps, int calls, Call&& call) {
  std::vector<double> runs;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    for (int c = 0; c < calls; ++c) call();
    runs.push_back(Since(t0) / calls);
  }
  return Median(runs);
}

}  // namespace

// The MLP example's layer (examples/mlp/train_mlp.cc) on one thread: forward
// y[b][j] = sum_k w[j][k] x[b][k] with eight partial sums, backward gw[j][k] += dy x[k] and
// gx[k] += dy w[j][k] row by row, as it writes them. GFLOP/s over the 6 B W^2 FLOPs of the
// pair: what hand-written loops get, the backward's passes over the weight and its gradient
// included.
double PlainLoopGflops(bool quick) {
  const int batch = 16, in = quick ? 512 : 1024, out = in;
  const size_t nx = static_cast<size_t>(batch) * in, nw = static_cast<size_t>(in) * out;
  std::vector<float> x(nx, 0.5f), w(nw, 0.25f), y(static_cast<size_t>(batch) * out), gw(nw), gx(nx),
      dy(static_cast<size_t>(batch) * out, 1e-3f);
  auto layer = [&] {
    for (int b = 0; b < batch; ++b) {
      const float* xb = x.data() + static_cast<size_t>(b) * in;
      for (int j = 0; j < out; ++j) {
        const float* wj = w.data() + static_cast<size_t>(j) * in;
        float s[8] = {};
        int k = 0;
        for (; k + 8 <= in; k += 8)
          for (int u = 0; u < 8; ++u) s[u] += wj[k + u] * xb[k + u];
        float total = 0;
        for (int u = 0; u < 8; ++u) total += s[u];
        for (; k < in; ++k) total += wj[k] * xb[k];
        y[static_cast<size_t>(b) * out + j] = total;
      }
    }
    std::fill(gx.begin(), gx.end(), 0.0f);
    for (int b = 0; b < batch; ++b) {
      const float* xb = x.data() + static_cast<size_t>(b) * in;
      float* gxb = gx.data() + static_cast<size_t>(b) * in;
      for (int j = 0; j < out; ++j) {
        const float d = dy[static_cast<size_t>(b) * out + j];
        float* gwj = gw.data() + static_cast<size_t>(j) * in;
        const float* wj = w.data() + static_cast<size_t>(j) * in;
        for (int k = 0; k < in; ++k) {
          gwj[k] += d * xb[k];
          gxb[k] += d * wj[k];
        }
      }
    }
  };
  layer();
  const double seconds = MedianSecondsPerCall(quick ? 7 : 9, quick ? 6 : 8, layer);
  volatile float sink = y[0] + gw[0] + gx[0];
  (void)sink;
  return 6.0 * batch * in * out / seconds / 1e9;
}

// std::exp over a row as the GPT's causal softmax and cross-entropy loops call it (each
// value's exponential, then its sum: the calls do not wait on each other), on one thread:
// evaluations per second.
double ExpPerSecond(bool quick) {
  std::vector<float> row(4096);
  for (size_t i = 0; i < row.size(); ++i) row[i] = -static_cast<float>(i % 64) / 16.0f;
  float total = 0;
  const double seconds = MedianSecondsPerCall(5, quick ? 50 : 500, [&] {
    // exp(v - 1) keeps every value in (e^-2, 1]: the same work each call.
    float sum = 0;
    for (float& v : row) {
      v = std::exp(v - 1.0f);
      sum += v;
    }
    total += sum;
  });
  volatile float sink = total;
  (void)sink;
  return static_cast<double>(row.size()) / seconds;
}

#ifdef ZINF_TOOLS_HAVE_DNNL
// A GPT linear layer of d_model -> 4 d_model as examples/gpt runs it on oneDNN, `tokens` rows a
// micro-batch, its weights stored [4d, d]: forward Y = X W^T, and backward's two products
// dX = dY W and dW += dY^T X; fp32 or bf16 inputs with fp32 output, on `threads` OpenMP
// threads. GFLOP/s over the three (the plan prices forward and backward FLOPs at one rate).
// Small d_model, and few tokens a micro-batch, run far below the peak, hence a row per both.
StatusOr<double> OneDnnGflops(bool bf16, int threads, int64_t d, int64_t tokens, bool quick) {
  try {
    omp_set_num_threads(threads);
    const int64_t t = tokens, k = d, n = 4 * d;
    dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(engine);
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const dt in = bf16 ? dt::bf16 : dt::f32;
    const dnnl::memory::desc x({t, k}, in, tag::ab), w_t({k, n}, in, tag::ba),
        y({t, n}, dt::f32, tag::ab), dy({t, n}, in, tag::ab), w({n, k}, in, tag::ab),
        dx({t, k}, dt::f32, tag::ab), dy_t({n, t}, in, tag::ba), x_again({t, k}, in, tag::ab),
        dw({n, k}, dt::f32, tag::ab);
    dnnl::primitive_attr accumulate;
    dnnl::post_ops sum;
    sum.append_sum(1.0f);
    accumulate.set_post_ops(sum);
    struct Product {
      dnnl::matmul primitive;
      dnnl::memory::desc a, b, c;
    };
    const Product products[] = {
        {dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(x, w_t, y), engine)), x, w_t,
         y},
        {dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(dy, w, dx), engine)), dy, w,
         dx},
        {dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(dy_t, x_again, dw),
                                                   accumulate, engine)),
         dy_t, x_again, dw}};
    // A training step's matmuls each find their operands cold (another layer's weights, other
    // activations): the calls rotate through operand sets four times the size of L2.
    const size_t set_bytes = 3 * (x.get_size() + w.get_size() + y.get_size() + dw.get_size());
    const size_t sets = std::max<size_t>(1, (8 << 20) / set_bytes + 1);
    std::vector<std::vector<std::unordered_map<int, dnnl::memory>>> operands(sets);
    for (size_t i = 0; i < sets; ++i) {
      for (const Product& p : products) {
        dnnl::memory a(p.a, engine), b(p.b, engine), c(p.c, engine);
        for (dnnl::memory* m : {&a, &b, &c}) {
          std::memset(m->get_data_handle(), 0, m->get_desc().get_size());
        }
        operands[i].push_back({{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
      }
    }
    size_t next = 0;
    auto run = [&] {
      const auto& set = operands[next++ % sets];
      for (size_t p = 0; p < set.size(); ++p) products[p].primitive.execute(stream, set[p]);
      stream.wait();
    };
    for (size_t i = 0; i < sets; ++i) run();
    // About 50 ms a repetition, 5 ms with --quick.
    const double flops = 3 * 2.0 * t * k * n;
    const int calls = static_cast<int>(std::clamp((quick ? 5e8 : 5e9) / flops, 1.0, 1000.0));
    return flops / MedianSecondsPerCall(quick ? 7 : 9, calls, run) / 1e9;
  } catch (const dnnl::error& e) {
    return Unavailable(fmt::format("oneDNN {} matmul: {}", bf16 ? "bf16" : "fp32", e.what()));
  }
}

StatusOr<double> OneDnnAttentionGflops(int threads, bool quick) {
  try {
    omp_set_num_threads(threads);
    const int64_t h = 4, t = 64, dh = 32, d = h * dh;
    dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(engine);
    using dt = dnnl::memory::data_type;
    using Dims = dnnl::memory::dims;
    // [h, rows, cols] views by strides, as the trainer's Batched() and Transposed() make them.
    const dnnl::memory::desc heads3d({h, t, dh}, dt::f32, Dims{dh, 3 * d, 1});
    const dnnl::memory::desc heads3d_t({h, dh, t}, dt::f32, Dims{dh, 1, 3 * d});
    const dnnl::memory::desc heads({h, t, dh}, dt::f32, Dims{dh, d, 1});
    const dnnl::memory::desc scores({h, t, t}, dt::f32, Dims{t * t, t, 1});
    const dnnl::memory::desc scores_t({h, t, t}, dt::f32, Dims{t * t, 1, t});
    // Each call runs over the micro-batch's 8 sequences, as the trainer's loops do.
    const int64_t seqs = 8;
    std::vector<float> qkv(seqs * t * 3 * d), dqkv(qkv.size()), y(seqs * t * d),
        p(seqs * h * t * t), dp(p.size());
    struct Call {
      dnnl::memory::desc a, b, c;
      float *pa, *pb, *pc;
      int64_t sa, sb, sc;  // one sequence's offset in each
    };
    const int64_t q = 3 * t * d, o = t * d, s = h * t * t;
    const std::vector<Call> calls = {
        {heads3d, heads3d_t, scores, qkv.data(), qkv.data() + d, p.data(), q, q, s},   // S = Q K^T
        {scores, heads3d, heads, p.data(), qkv.data() + 2 * d, y.data(), s, q, o},     // Y = P V
        {heads, heads3d_t, scores, y.data(), qkv.data() + 2 * d, dp.data(), o, q, s},  // dP
        {scores_t, heads, heads3d, p.data(), y.data(), dqkv.data() + 2 * d, s, o, q},  // dV
        {scores, heads3d, heads3d, dp.data(), qkv.data() + d, dqkv.data(), s, q, q},   // dQ
        {scores_t, heads3d, heads3d, dp.data(), qkv.data(), dqkv.data() + d, s, q, q}};  // dK
    std::vector<std::pair<dnnl::matmul, std::vector<std::unordered_map<int, dnnl::memory>>>> prims;
    for (const Call& c : calls) {
      auto& [mm, args] = prims.emplace_back(
          dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(c.a, c.b, c.c), engine)),
          std::vector<std::unordered_map<int, dnnl::memory>>{});
      for (int64_t b = 0; b < seqs; ++b) {
        args.push_back({{DNNL_ARG_SRC, {c.a, engine, c.pa + b * c.sa}},
                        {DNNL_ARG_WEIGHTS, {c.b, engine, c.pb + b * c.sb}},
                        {DNNL_ARG_DST, {c.c, engine, c.pc + b * c.sc}}});
      }
    }
    const double seconds = MedianSecondsPerCall(quick ? 7 : 9, quick ? 6 : 60, [&] {
      for (auto& [mm, args] : prims) {
        for (auto& a : args) mm.execute(stream, a);
      }
      stream.wait();
    });
    return seqs * 6 * 2.0 * h * t * t * dh / seconds / 1e9;
  } catch (const dnnl::error& e) {
    return Unavailable(fmt::format("oneDNN attention matmul: {}", e.what()));
  }
}

// oneDNN's tanh GELU (the GPT's MLP activation) over the demo's 512 x 512 activations,
// forward and backward, on `threads` threads: elements per second of each. Its arithmetic,
// not memory, sets the pace.
StatusOr<GeluRates> OneDnnGeluRates(int threads, bool quick) {
  try {
    omp_set_num_threads(threads);
    const int64_t n = 512 * 512;
    dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(engine);
    const auto algorithm = dnnl::algorithm::eltwise_gelu_tanh;
    const dnnl::memory::desc md({n}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::a);
    const dnnl::eltwise_forward::primitive_desc forward_pd(
        {dnnl::prop_kind::forward_training, algorithm, md, 0.0f, 0.0f}, engine);
    dnnl::eltwise_forward forward(forward_pd);
    dnnl::eltwise_backward backward({{algorithm, md, md, 0.0f, 0.0f}, engine, forward_pd});
    std::vector<float> x(n), y(n), dy(n, 1e-3f), dx(n);
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 97) / 24.0f - 2.0f;
    dnnl::memory mx(md, engine, x.data()), my(md, engine, y.data()), mdy(md, engine, dy.data()),
        mdx(md, engine, dx.data());
    auto time = [&](auto&& call) {
      return static_cast<double>(n) / MedianSecondsPerCall(quick ? 5 : 9, quick ? 5 : 40, [&] {
               call();
               stream.wait();
             });
    };
    GeluRates rates;
    rates.forward = time([&] {
      forward.execute(stream, {{DNNL_ARG_SRC, mx}, {DNNL_ARG_DST, my}});
    });
    rates.backward = time([&] {
      backward.execute(stream,
                       {{DNNL_ARG_SRC, mx}, {DNNL_ARG_DIFF_DST, mdy}, {DNNL_ARG_DIFF_SRC, mdx}});
    });
    return rates;
  } catch (const dnnl::error& e) {
    return Unavailable(fmt::format("oneDNN GELU: {}", e.what()));
  }
}

// The fixed cost of one oneDNN primitive call on `threads` threads as a trainer makes it (a
// 16 x 16 x 16 matmul, whose arithmetic is nothing, its memory descriptors and objects made
// for the call from the tensors' pointers, dimensions and strides): what a model of small
// layers pays per kernel. Microseconds.
StatusOr<double> OneDnnCallMicros(int threads) {
  try {
    omp_set_num_threads(threads);
    dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(engine);
    using dt = dnnl::memory::data_type;
    const dnnl::memory::dims dims = {16, 16}, strides = {16, 1};
    dnnl::matmul mm(dnnl::matmul::primitive_desc(
        dnnl::matmul::desc({dims, dt::f32, strides}, {dims, dt::f32, strides},
                           {dims, dt::f32, strides}),
        engine));
    std::vector<float> a(256), b(256), c(256);
    std::vector<double> runs;
    for (int i = 0; i < 300; ++i) {
      const auto t0 = Clock::now();
      std::unordered_map<int, dnnl::memory> args;
      for (auto [arg, data] :
           {std::pair{DNNL_ARG_SRC, a.data()}, std::pair{DNNL_ARG_WEIGHTS, b.data()},
            std::pair{DNNL_ARG_DST, c.data()}}) {
        args.emplace(arg, dnnl::memory({dims, dt::f32, strides}, engine, data));
      }
      mm.execute(stream, args);
      stream.wait();
      if (i >= 50) runs.push_back(Since(t0));
    }
    return Median(runs) * 1e6;
  } catch (const dnnl::error& e) {
    return Unavailable(fmt::format("oneDNN call: {}", e.what()));
  }
}

bool HasNativeBf16() {
  return static_cast<unsigned>(dnnl::get_effective_cpu_isa()) >=
         static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
}
#endif

}  // namespace zinf::tools
