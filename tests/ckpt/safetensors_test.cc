// src/ckpt/safetensors: F32, BF16 and F16 tensors read back as fp32, and every way a file can
// be truncated or corrupt (header length past the end, offsets out of range, bad JSON,
// unknown dtypes, sizes that disagree with shapes, overlapping tensors) refused with the file
// and the tensor named.
#include "ckpt/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/testing/temp_dir.h"

namespace zinf::ckpt {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

// A safetensors file's bytes: the header's length (u64, little endian), the header, the data.
std::string Build(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

class SafetensorsTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& bytes) {
    const std::string path = (dir_ / "t.safetensors").string();
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    return path;
  }
  // Opening the file must fail with `code` and a message holding `message` and the path.
  void ExpectRefused(const std::string& bytes, StatusCode code, const std::string& message) {
    const std::string path = Write(bytes);
    auto r = SafetensorsReader::Open(path);
    ASSERT_FALSE(r.ok()) << "accepted: " << message;
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(message));
    EXPECT_THAT(r.status().message(), HasSubstr(path));
  }

  testing::TempDir tmp_{"zinf-safetensors"};
  const fs::path dir_ = tmp_.path();
};

TEST_F(SafetensorsTest, ReadsF32Bf16AndF16AsFp32) {
  const std::vector<float> f32 = {1.5f, -2.25f, 0.0f, 3.0e-3f, 7.0f, -1.0f};
  // 1.5, -2.0, 0.5 in bf16 and in fp16.
  const std::vector<uint16_t> bf16 = {0x3fc0, 0xc000, 0x3f00};
  const std::vector<uint16_t> f16 = {0x3e00, 0xc000, 0x3800};
  const std::string header =
      R"({"__metadata__": {"format": "pt"},
          "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
          "b": {"dtype": "BF16", "shape": [3], "data_offsets": [24, 30]},
          "c": {"dtype": "F16", "shape": [3], "data_offsets": [30, 36]},
          "s": {"dtype": "F32", "shape": [], "data_offsets": [36, 40]}})";
  const std::vector<float> scalar = {42.0f};
  auto r = SafetensorsReader::Open(
      Write(Build(header, Bytes(f32) + Bytes(bf16) + Bytes(f16) + Bytes(scalar))));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->tensors().size(), 4u);
  EXPECT_EQ(r->tensors()[0].name, "a");  // the header's order
  EXPECT_EQ(r->tensors()[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(r->tensors()[3].numel, 1u);
  EXPECT_EQ(r->Find("nope"), nullptr);

  std::vector<float> out(6);
  ASSERT_TRUE(r->ReadFp32(*r->Find("a"), out.data()).ok());
  EXPECT_EQ(out, f32);
  out.assign(3, 0);
  ASSERT_TRUE(r->ReadFp32(*r->Find("b"), out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{1.5f, -2.0f, 0.5f}));
  out.assign(3, 0);
  ASSERT_TRUE(r->ReadFp32(*r->Find("c"), out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{1.5f, -2.0f, 0.5f}));
  out.assign(2, 0);
  ASSERT_TRUE(r->ReadFp32(*r->Find("a"), 3, 2, out.data()).ok());  // a range
  EXPECT_EQ(out, (std::vector<float>{3.0e-3f, 7.0f}));
  ASSERT_TRUE(r->ReadFp32(*r->Find("s"), out.data()).ok());
  EXPECT_EQ(out[0], 42.0f);
  const Status past = r->ReadFp32(*r->Find("b"), 2, 2, out.data());
  EXPECT_EQ(past.code(), StatusCode::kInvalidArgument) << past;
}

TEST_F(SafetensorsTest, ReadsIntegerTensorsAsBytesNotAsValues) {
  const std::vector<int64_t> counts = {7, -1};
  const std::vector<uint8_t> mask = {1, 0, 1};
  const std::string header =
      R"({"n": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]},
          "m": {"dtype": "BOOL", "shape": [3], "data_offsets": [16, 19]}})";
  auto r = SafetensorsReader::Open(Write(Build(header, Bytes(counts) + Bytes(mask))));
  ASSERT_TRUE(r.ok()) << r.status();
  const SafetensorsTensor& n = *r->Find("n");
  EXPECT_FALSE(n.is_float);
  EXPECT_EQ(n.type, "I64");
  EXPECT_EQ(n.element_bytes, 8u);
  std::vector<int64_t> got(2);
  ASSERT_TRUE(r->ReadBytes(n, got.data()).ok());
  EXPECT_EQ(got, counts);
  std::vector<uint8_t> got_mask(3);
  ASSERT_TRUE(r->ReadBytes(*r->Find("m"), got_mask.data()).ok());
  EXPECT_EQ(got_mask, mask);
  std::vector<float> values(2);
  const Status as_floats = r->ReadFp32(n, values.data());
  EXPECT_EQ(as_floats.code(), StatusCode::kInvalidArgument) << as_floats;
  EXPECT_THAT(as_floats.message(), HasSubstr("tensor 'n' is I64; values are read from F32"));
}

TEST_F(SafetensorsTest, TruncatedFilesAreDataLoss) {
  ExpectRefused("abc", StatusCode::kDataLoss, "3 bytes is too short");
  const std::string header = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
  const std::string good = Build(header, std::string(8, '\0'));
  // The header cut short: its length now runs past the end of the file.
  ExpectRefused(good.substr(0, 20), StatusCode::kDataLoss,
                "the header length " + std::to_string(header.size()) + " goes past the end");
  // A header length no file has.
  std::string huge = good;
  const uint64_t n = 1ull << 62;
  std::memcpy(huge.data(), &n, 8);
  ExpectRefused(huge, StatusCode::kDataLoss, "goes past the end of the file");
  // The data cut short: the tensor's offsets run past it.
  ExpectRefused(good.substr(0, good.size() - 4), StatusCode::kDataLoss,
                "tensor 'a': data_offsets [0, 8) are not within the 4 bytes of data");
}

TEST_F(SafetensorsTest, CorruptHeadersAreRefusedNamingTheTensor) {
  const std::string data(16, '\0');
  struct Case {
    std::string header;
    StatusCode code;
    std::string message;
  };
  const Case cases[] = {
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})", StatusCode::kDataLoss,
       "the header is not valid JSON"},
      {R"([1, 2])", StatusCode::kDataLoss, "the header is not a JSON object"},
      {R"({"a": 3})", StatusCode::kDataLoss, "tensor 'a': not a JSON object"},
      {R"({"a": {"shape": [2], "data_offsets": [0, 8]}})", StatusCode::kDataLoss,
       "tensor 'a': no string \"dtype\""},
      {R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", StatusCode::kDataLoss,
       "tensor 'a': shape has -2 (number), not a non-negative integer"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", StatusCode::kDataLoss,
       "tensor 'a': no \"data_offsets\" pair"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", StatusCode::kDataLoss,
       "tensor 'a': data_offsets [8, 0) are not within the 16 bytes of data"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 24]}})", StatusCode::kDataLoss,
       "tensor 'a': data_offsets [8, 24) are not within the 16 bytes of data"},
      {R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", StatusCode::kDataLoss,
       "tensor 'a': shape [3] of F32 needs 12 bytes, data_offsets span 8"},
      {R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})",
       StatusCode::kDataLoss, "overflows 64 bits"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
       StatusCode::kDataLoss, "tensors 'a' and 'b' overlap"},
      {R"({"a": {"dtype": "U32", "shape": [2], "data_offsets": [0, 8]}})",
       StatusCode::kInvalidArgument, "tensor 'a' has dtype 'U32', which zinf does not read"},
      {R"({"a": {"dtype": "I64", "shape": [3], "data_offsets": [0, 16]}})", StatusCode::kDataLoss,
       "tensor 'a': shape [3] of I64 needs 24 bytes, data_offsets span 16"},
      {R"({"a": {"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}})",
       StatusCode::kInvalidArgument, "has dtype 'F33', which safetensors does not define"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    ExpectRefused(Build(c.header, data), c.code, c.message);
  }
}

TEST_F(SafetensorsTest, ADeeplyNestedHeaderIsRefusedNotACrash) {
  // 50,000 nested brackets in 100 KB: nlohmann's recursive destruction of such a value
  // overflowed the stack of whoever loaded the file.
  const std::string header = R"({"a": )" + std::string(50000, '[') + std::string(50000, ']') + "}";
  ExpectRefused(Build(header, ""), StatusCode::kDataLoss,
                "nests arrays and objects more than 128 levels deep");
}

TEST_F(SafetensorsTest, ATensorNamedTwiceIsRefused) {
  // The format forbids it, and a JSON parser keeps one of the two silently.
  ExpectRefused(Build(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                          "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                      std::string(8, '\0')),
                StatusCode::kDataLoss, "names the key 'a' twice");
}

TEST_F(SafetensorsTest, ManyTensorsParseInLinearTime) {
  // An ordered JSON map looked every key up linearly: 40k tensors took 5 s, 300k over 30 s.
  // Four times the tensors must cost well under 16 times the time (the quadratic ratio); the
  // fastest of three runs of each, so that a busy machine does not decide.
  auto header_of = [](int n) {
    std::string h = "{";
    for (int i = 0; i < n; ++i) {
      h += (i ? ",\"t" : "\"t") + std::to_string(i) + R"(": {"dtype": "F32", "shape": [1], )" +
           R"("data_offsets": [)" + std::to_string(4 * i) + ", " + std::to_string(4 * i + 4) + "]}";
    }
    return h + "}";
  };
  auto fastest_parse_s = [&](int n) {
    const std::string header = header_of(n);
    double best = 1e9;
    for (int rep = 0; rep < 3; ++rep) {
      const auto start = std::chrono::steady_clock::now();
      auto tensors = ParseSafetensorsHeader(header, 4 * uint64_t(n), "many");
      best = std::min(
          best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      EXPECT_TRUE(tensors.ok()) << tensors.status();
      if (tensors.ok()) {
        EXPECT_EQ(tensors->size(), size_t(n));
        // In file order, whatever the names sort as.
        EXPECT_EQ(tensors->back().name, "t" + std::to_string(n - 1));
      }
    }
    return best;
  };
  const double small = fastest_parse_s(20000), large = fastest_parse_s(80000);
  EXPECT_LT(large / small, 8.0) << small << " s for 20k tensors, " << large << " s for 80k";
}

TEST_F(SafetensorsTest, ParseHeaderSurvivesMutations) {
  // Every single-byte change of a valid header parses or fails with a Status, never a crash.
  const std::string header =
      R"({"__metadata__": {"k": "v"}, "w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}})";
  for (size_t i = 0; i < header.size(); ++i) {
    for (char c : {'\0', '"', '[', '9', '-', '}'}) {
      std::string mutated = header;
      mutated[i] = c;
      auto r = ParseSafetensorsHeader(mutated, 8, "mutated");
      if (!r.ok()) {
        EXPECT_NE(r.status().code(), StatusCode::kInternal) << r.status();
      }
    }
  }
}

}  // namespace
}  // namespace zinf::ckpt
