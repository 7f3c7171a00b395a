// What the EngineConfig tests share: the keys a config's warnings name, a config's error.
#ifndef ZINF_TESTS_ZERO_ENGINE_CONFIG_TESTING_H_
#define ZINF_TESTS_ZERO_ENGINE_CONFIG_TESTING_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/engine.h"

namespace zinf::testing {

// The key each warning names ("config key 'a.b' = ..."), sorted.
inline std::vector<std::string> WarnedKeys(const EngineConfig& c) {
  std::vector<std::string> keys;
  for (const std::string& w : c.warnings) {
    const size_t begin = w.find('\'') + 1, end = w.find('\'', begin);
    keys.push_back(w.substr(begin, end - begin));
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

inline std::string ErrorOf(std::string_view json, const TrainerValues& trainer = {}) {
  StatusOr<EngineConfig> c = EngineConfig::FromJson(json, trainer);
  EXPECT_FALSE(c.ok()) << json;
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status();
  return std::string(c.status().message());
}

}  // namespace zinf::testing

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

#endif  // ZINF_TESTS_ZERO_ENGINE_CONFIG_TESTING_H_
