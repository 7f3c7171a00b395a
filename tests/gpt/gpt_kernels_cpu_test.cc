// The CPU backend's matmuls in bf16 (examples/gpt/gpt_kernels_cpu.cc): against the exact
// product of the bf16-rounded inputs (what bf16 x bf16 with fp32 accumulation computes, up to
// fp32 summation error), against the fp32 path within the bound that rounding the inputs
// allows, with weights handed over directly in bf16, and Parameters() converting or passing
// tensors through. Every view the model uses is covered: a weight transposed, both backward
// products, and the strided, batched attention heads. Where the CPU has no native bf16 (neither
// AVX512_BF16 nor AMX) the bf16 tests skip with the backend's reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "examples/gpt/gpt_kernels.h"
#include "tests/gpt/gpt_test_values.h"
#include "zinf/dtype.h"

namespace gpt {
namespace {

using testing::RoundToBf16;
using testing::Values;

using zinf::StatusCode;

// 2^-24: the unit roundoff of fp32.
constexpr double kFp32Unit = 1.0 / (1 << 24);
// 2^-8: how far a product of two bf16-rounded values (each within 2^-9 of itself, round to
// nearest with 8 significant bits) may move, relative to the product.
constexpr double kBf16ProductUnit = 1.0 / (1 << 8);

std::unique_ptr<GptKernels> Kernels(ElementType matmul_type, std::string* skip_reason) {
  auto kernels = CreateCpuKernels(0, matmul_type);
  if (!kernels.ok()) {
    EXPECT_EQ(kernels.status().code(), StatusCode::kUnavailable) << kernels.status();
    *skip_reason = kernels.status().ToString();
    return nullptr;
  }
  return std::move(kernels).value();
}

#define KERNELS_OR_SKIP(var, type)                              \
  std::string var##_skip;                                       \
  std::unique_ptr<GptKernels> var = Kernels(type, &var##_skip); \
  if (var == nullptr) GTEST_SKIP() << var##_skip

// Element (b, r, c) of a view over host memory, as a float.
float At(const View& v, int64_t b, int64_t r, int64_t c) {
  const int64_t i = b * v.batch_stride() + r * v.row_stride() + c * v.col_stride();
  if (v.dtype == ElementType::kFp32) return static_cast<const float*>(v.data)[i];
  float f;
  zinf::ConvertToFp32(static_cast<const uint16_t*>(v.data) + i, ElementType::kBf16, &f, 1);
  return f;
}

// One matmul of the model's kinds, with its operands in host memory.
struct Case {
  std::string name;
  View a, b, c;
  const float* bias = nullptr;
  float scale = 1.0f;
  bool accumulate = false;
};

// What c must hold after the case runs with both operands rounded to bf16 (`round`) or not:
// the exact (double) value, and sum |scale a_ik b_kj| + |bias| + |old c|, the size that
// rounding errors are relative to.
void Reference(const Case& m, const std::vector<float>& c_before, bool round,
               std::vector<double>* exact, std::vector<double>* size) {
  const int64_t batch = m.c.batch(), rows = m.c.rows(), cols = m.c.cols(), k = m.a.cols();
  exact->assign(batch * rows * cols, 0);
  size->assign(exact->size(), 0);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < cols; ++j) {
        double sum = 0, abs_sum = 0;
        for (int64_t i = 0; i < k; ++i) {
          float x = At(m.a, b, r, i), y = At(m.b, b, i, j);
          if (round) x = RoundToBf16(x), y = RoundToBf16(y);
          sum += double(x) * y;
          abs_sum += std::fabs(double(x) * y);
        }
        const int64_t o = b * m.c.batch_stride() + r * m.c.row_stride() + j;
        const size_t e = (b * rows + r) * cols + j;
        (*exact)[e] = m.scale * sum;
        (*size)[e] = std::fabs(m.scale) * abs_sum;
        if (m.bias != nullptr) {
          (*exact)[e] += m.bias[j];
          (*size)[e] += std::fabs(m.bias[j]);
        }
        if (m.accumulate) {
          (*exact)[e] += c_before[o];
          (*size)[e] += std::fabs(c_before[o]);
        }
      }
    }
  }
}

// The memory c covers, from its first element to its last, before a matmul writes it.
std::vector<float> Before(const View& c) {
  const float* first = static_cast<const float*>(c.data);
  const int64_t extent =
      (c.batch() - 1) * c.batch_stride() + (c.rows() - 1) * c.row_stride() + c.cols();
  return std::vector<float>(first, first + extent);
}

// c's elements in [batch][row][col] order.
std::vector<float> Gather(const View& c) {
  std::vector<float> out;
  for (int64_t b = 0; b < c.batch(); ++b) {
    for (int64_t r = 0; r < c.rows(); ++r) {
      for (int64_t j = 0; j < c.cols(); ++j) out.push_back(At(c, b, r, j));
    }
  }
  return out;
}

// Host memory for the cases: activations, a weight, a gradient, a bias and q/k/v heads, with
// awkward sizes so that every blocking has a tail.
class MatmulCases {
 public:
  static constexpr int64_t kRows = 37, kIn = 50, kOut = 29;  // N, d_in, d_out
  static constexpr int64_t kHeads = 3, kT = 11, kHeadDim = 8, kD = kHeads * kHeadDim;

  MatmulCases()
      : x_(Values(kRows * kIn, 1)),
        w_(Values(kOut * kIn, 2)),
        dy_(Values(kRows * kOut, 3)),
        bias_(Values(kOut, 4)),
        qkv_(Values(kT * 3 * kD, 5)),
        out_(kRows * std::max(kIn, kOut) + kOut * kIn + kHeads * kT * kT, 0.0f) {}

  // The cases, with c pointing into this object's output memory (reset by Reset()).
  std::vector<Case> Cases() {
    float* y = out_.data();                       // [kRows, kOut] or [kRows, kIn]
    float* dw = y + kRows * std::max(kIn, kOut);  // [kOut, kIn]
    float* scores = dw + kOut * kIn;              // [kHeads, kT, kT]
    auto heads = [&](const float* at) {
      return Batched(at, kHeads, kT, kHeadDim, kHeadDim, 3 * kD);
    };
    return {
        {"forward y = x W^T + bias", Matrix(x_.data(), kRows, kIn),
         Transposed(Matrix(w_.data(), kOut, kIn)), Matrix(y, kRows, kOut), bias_.data()},
        {"backward dx = dy W", Matrix(dy_.data(), kRows, kOut), Matrix(w_.data(), kOut, kIn),
         Matrix(y, kRows, kIn)},
        {"backward dW += dy^T x", Transposed(Matrix(dy_.data(), kRows, kOut)),
         Matrix(x_.data(), kRows, kIn), Matrix(dw, kOut, kIn), nullptr, 1.0f, true},
        {"attention scores q k^T / sqrt(head_dim)", heads(qkv_.data()),
         Transposed(heads(qkv_.data() + kD)), Batched(scores, kHeads, kT, kT, kT * kT, kT), nullptr,
         0.35f},
    };
  }
  // Output memory filled with values that the accumulating case adds to.
  void Reset() {
    const std::vector<float> v = Values(out_.size(), 6);
    std::copy(v.begin(), v.end(), out_.begin());  // in place: the cases point into out_
  }
  const std::vector<float>& w() const { return w_; }

 private:
  std::vector<float> x_, w_, dy_, bias_, qkv_, out_;
};

// bf16 x bf16 with fp32 accumulation: exactly the product of the rounded inputs, up to fp32
// summation (at most (k + 3) units of fp32 roundoff of the absolute sum in any order, plus
// the scale, bias and accumulation roundings); and not the unrounded product, which differs
// by up to 2^-8 of it. Fails if an operand skipped its rounding or products were summed in
// bf16.
TEST(GptKernelsCpuTest, Bf16MatmulIsTheExactProductOfRoundedInputs) {
  KERNELS_OR_SKIP(kernels, ElementType::kBf16);
  EXPECT_EQ(kernels->matmul_type(), ElementType::kBf16);
  MatmulCases data;
  for (const Case& m : data.Cases()) {
    SCOPED_TRACE(m.name);
    data.Reset();
    std::vector<double> exact, size, unrounded, unused;
    const std::vector<float> c_before = Before(m.c);
    Reference(m, c_before, /*round=*/true, &exact, &size);
    Reference(m, c_before, /*round=*/false, &unrounded, &unused);
    kernels->Matmul(m.a, m.b, m.c, m.bias, m.scale, m.accumulate);
    ASSERT_TRUE(kernels->Synchronize().ok());
    const std::vector<float> got = Gather(m.c);
    const double tolerance = (m.a.cols() + 3) * kFp32Unit;
    double worst = 0, distinguishable = 0;
    for (size_t e = 0; e < got.size(); ++e) {
      worst = std::max(worst, std::fabs(got[e] - exact[e]) / size[e]);
      distinguishable = std::max(distinguishable, std::fabs(unrounded[e] - exact[e]) / size[e]);
    }
    EXPECT_LE(worst, tolerance);
    EXPECT_GT(distinguishable, 10 * tolerance) << "the data must tell bf16 inputs from fp32";
  }
}

// Against the fp32 path, element by element: within 2^-8 of sum |a||b| (rounding the inputs)
// plus both paths' fp32 summation errors. This is the tolerance a caller of the bf16 path
// can rely on.
TEST(GptKernelsCpuTest, Bf16MatmulFollowsTheFp32PathWithinTheRoundingBound) {
  KERNELS_OR_SKIP(bf16, ElementType::kBf16);
  KERNELS_OR_SKIP(fp32, ElementType::kFp32);
  MatmulCases data;
  for (size_t i = 0; i < data.Cases().size(); ++i) {
    std::vector<float> got[2];
    std::vector<double> exact, size;
    for (int path = 0; path < 2; ++path) {
      const Case m = data.Cases()[i];
      data.Reset();
      const std::vector<float> c_before = Before(m.c);
      Reference(m, c_before, /*round=*/false, &exact, &size);
      GptKernels& k = path == 0 ? *bf16 : *fp32;
      k.Matmul(m.a, m.b, m.c, m.bias, m.scale, m.accumulate);
      ASSERT_TRUE(k.Synchronize().ok());
      got[path] = Gather(m.c);
    }
    SCOPED_TRACE(data.Cases()[i].name);
    const double k = data.Cases()[i].a.cols();
    const double tolerance = kBf16ProductUnit + 2 * (k + 3) * kFp32Unit;
    double worst = 0;
    for (size_t e = 0; e < got[0].size(); ++e) {
      worst = std::max(worst, std::fabs(double(got[0][e]) - got[1][e]) / size[e]);
    }
    EXPECT_LE(worst, tolerance);
    EXPECT_GT(worst, 0) << "the bf16 path rounds";
  }
}

// A weight handed over in bf16 (as Parameters() and, later, the engine hand them out) gives
// bitwise what the same values in fp32 give, in either matmul type.
TEST(GptKernelsCpuTest, Bf16WeightsArePassedDirectly) {
  for (ElementType type : {ElementType::kBf16, ElementType::kFp32}) {
    SCOPED_TRACE(std::string(zinf::ElementTypeName(type)));
    KERNELS_OR_SKIP(kernels, type);
    constexpr int64_t kRows = 21, kIn = 40, kOut = 24;
    const std::vector<float> x = Values(kRows * kIn, 7);
    std::vector<float> w = Values(kOut * kIn, 8);
    for (float& v : w) v = RoundToBf16(v);  // representable: widening it back is exact
    std::vector<uint16_t> w_bf16(w.size());
    zinf::ConvertFromFp32(w.data(), ElementType::kBf16, w_bf16.data(), w.size());
    std::vector<float> from_fp32(kRows * kOut), from_bf16(kRows * kOut);
    kernels->Matmul(Matrix(x.data(), kRows, kIn), Transposed(Matrix(w.data(), kOut, kIn)),
                    Matrix(from_fp32.data(), kRows, kOut));
    const Tensor weight{w_bf16.data(), ElementType::kBf16};
    kernels->Matmul(Matrix(x.data(), kRows, kIn), Transposed(Matrix(weight, kOut, kIn)),
                    Matrix(from_bf16.data(), kRows, kOut));
    ASSERT_TRUE(kernels->Synchronize().ok());
    EXPECT_EQ(std::memcmp(from_fp32.data(), from_bf16.data(), from_fp32.size() * 4), 0);
  }
}

// Parameters(): a tensor already of the wanted type is the fetched memory itself; the others
// are converted (fp32 to bf16 rounding to nearest even as the engine does, bf16 to fp32
// exactly) into the slot's buffer.
TEST(GptKernelsCpuTest, ParametersConvertOrPassThrough) {
  KERNELS_OR_SKIP(kernels, ElementType::kBf16);
  const std::vector<float> w = Values(300000, 9), bias = Values(64, 10);  // w: several chunks
  std::vector<uint16_t> g_bf16(64);
  const std::vector<float> g = Values(64, 11);
  zinf::ConvertFromFp32(g.data(), ElementType::kBf16, g_bf16.data(), g.size());
  const std::vector<Tensor> fetched = {{w.data(), ElementType::kFp32},
                                       {bias.data(), ElementType::kFp32},
                                       {g_bf16.data(), ElementType::kBf16}};
  const std::vector<int64_t> numel = {300000, 64, 64};
  auto out = kernels->Parameters(Slot::kBlock, fetched, numel,
                                 {ElementType::kBf16, ElementType::kFp32, ElementType::kFp32},
                                 /*ready=*/nullptr);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 3u);
  EXPECT_EQ((*out)[0].dtype, ElementType::kBf16);
  std::vector<uint16_t> want(w.size());
  zinf::ConvertFromFp32(w.data(), ElementType::kBf16, want.data(), w.size());
  EXPECT_EQ(std::memcmp((*out)[0].data, want.data(), want.size() * 2), 0);
  EXPECT_EQ((*out)[1].data, bias.data()) << "already fp32: used in place";
  EXPECT_EQ((*out)[1].dtype, ElementType::kFp32);
  EXPECT_EQ((*out)[2].dtype, ElementType::kFp32);
  std::vector<float> widened(64);
  zinf::ConvertToFp32(g_bf16.data(), ElementType::kBf16, widened.data(), 64);
  EXPECT_EQ(std::memcmp((*out)[2].data, widened.data(), 64 * 4), 0);

  // Bad arguments are errors, not crashes.
  auto mismatched =
      kernels->Parameters(Slot::kBlock, fetched, {1, 2}, {ElementType::kFp32}, nullptr);
  EXPECT_EQ(mismatched.status().code(), StatusCode::kInvalidArgument) << mismatched.status();
  auto fp16 = kernels->Parameters(Slot::kLnF, {{bias.data(), ElementType::kFp32}}, {64},
                                  {ElementType::kFp16}, nullptr);
  EXPECT_EQ(fp16.status().code(), StatusCode::kInvalidArgument) << fp16.status();
  EXPECT_NE(fp16.status().message().find("fp16"), std::string::npos) << fp16.status();
}

TEST(GptKernelsCpuTest, Fp16MatmulsAreRefused) {
  auto kernels = CreateCpuKernels(0, ElementType::kFp16);
  EXPECT_EQ(kernels.status().code(), StatusCode::kInvalidArgument) << kernels.status();
}

}  // namespace
}  // namespace gpt
