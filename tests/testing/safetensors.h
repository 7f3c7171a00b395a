// Reads and writes safetensors files for the tests that check zinf's exports and imports and
// the PyTorch references.
// safetensors: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the data.
#ifndef ZINF_TESTS_TESTING_SAFETENSORS_H_
#define ZINF_TESTS_TESTING_SAFETENSORS_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace zinf::testing {

struct Tensor {
  std::string dtype;  // "F32", "BF16", "I32"...
  std::vector<int64_t> shape;
  std::vector<char> bytes;

  template <typename T>
  std::vector<T> values() const {
    std::vector<T> out(bytes.size() / sizeof(T));
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }
};

struct SafeTensors {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
  size_t header_bytes = 0;  // the JSON header's length, padding included
};

inline SafeTensors ReadSafeTensors(const std::string& path) {
  SafeTensors out;
  std::ifstream in(path, std::ios::binary);
  uint64_t header_size = 0;
  in.read(reinterpret_cast<char*>(&header_size), 8);
  std::string header(header_size, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_size));
  EXPECT_TRUE(in.good() && header_size > 0) << "cannot read " << path;
  if (!in.good()) return out;
  out.header_bytes = header_size;
  std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const nlohmann::json json = nlohmann::json::parse(header);
  for (const auto& [name, entry] : json.items()) {
    if (name == "__metadata__") {
      out.metadata = entry.get<std::map<std::string, std::string>>();
      continue;
    }
    const auto offsets = entry["data_offsets"].get<std::vector<size_t>>();
    out.tensors[name] = {entry["dtype"], entry["shape"].get<std::vector<int64_t>>(),
                         std::vector<char>(data.begin() + offsets[0], data.begin() + offsets[1])};
  }
  return out;
}

// Writes `tensors` (name, Tensor) in the given order, data back to back.
inline void WriteSafeTensors(const std::string& path,
                             const std::vector<std::pair<std::string, Tensor>>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::string data;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", t.dtype},
                    {"shape", t.shape},
                    {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data.append(t.bytes.begin(), t.bytes.end());
  }
  const std::string text = header.dump();
  const uint64_t n = text.size();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << text << data;
  EXPECT_TRUE(out.good()) << "cannot write " << path;
}

// An F32 tensor of `values`.
inline Tensor F32Tensor(const std::vector<float>& values, std::vector<int64_t> shape) {
  Tensor t{"F32", std::move(shape), std::vector<char>(values.size() * 4)};
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

}  // namespace zinf::testing

#endif  // ZINF_TESTS_TESTING_SAFETENSORS_H_
