// Floats to and from a file of their bytes: how a forked rank hands the values it ended with to
// the parent test that compares them.
//
// Thread-safety: plain functions.
#ifndef ZINF_TESTS_TESTING_FLOAT_FILE_H_
#define ZINF_TESTS_TESTING_FLOAT_FILE_H_

#include <cstdio>
#include <string>
#include <vector>

#include "zinf/status.h"

namespace zinf::testing {

inline Status WriteFloats(const std::string& path, const std::vector<float>& v) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return IoError("cannot create " + path);
  const bool written = std::fwrite(v.data(), 4, v.size(), f) == v.size();
  return std::fclose(f) == 0 && written ? OkStatus() : IoError("cannot write " + path);
}

// Empty when the file is missing.
inline std::vector<float> ReadFloats(const std::string& path) {
  std::vector<float> v;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return v;
  float x;
  while (std::fread(&x, 4, 1, f) == 1) v.push_back(x);
  std::fclose(f);
  return v;
}

}  // namespace zinf::testing

#endif  // ZINF_TESTS_TESTING_FLOAT_FILE_H_
