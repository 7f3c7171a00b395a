// Runs the real `zinf bench pcie --host` on small sizes: behind a modelled link its figures are
// the model's (never faster, and close to it: Note [Host link model] in
// offload/host/host_device.cc), the link comes from --link-gbps or ZINF_HOST_LINK_GBPS, and bad
// arguments fail with a message naming them.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/tools/run_zinf.h"

namespace {

using zinf::testing::RunZinf;
using zinf::testing::ZinfRun;

using zinf::testing::JsonOutput;

TEST(ZinfBenchPcieTest, HostFiguresMatchTheModelledLink) {
  const nlohmann::json j =
      JsonOutput(RunZinf("bench pcie --host --link-gbps 1 --size 4MiB --reps 1 --json"));
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["gpu"], false);
  EXPECT_DOUBLE_EQ(j["link_GBps"].get<double>(), 1.0);
  ASSERT_EQ(j["rows"].size(), 1u) << "one row per size: host buffers are all alike";
  const nlohmann::json& row = j["rows"][0];
  EXPECT_EQ(row["memory"], "host");
  EXPECT_DOUBLE_EQ(row["model_GBps"].get<double>(), 1.0);
#ifdef ZINF_SLOW_BUILD
  GTEST_SKIP() << "a sanitizer build's memcpy is slower than the modelled link";
#endif
  // One engine per direction: each way at the link's rate, both ways at twice it. Never
  // faster than modelled; the lower bound leaves room for a loaded machine.
  for (const char* key : {"h2d_GBps", "d2h_GBps"}) {
    EXPECT_LE(row[key].get<double>(), 1.0 / 0.95) << key;
    EXPECT_GE(row[key].get<double>(), 0.75) << key;
  }
  EXPECT_LE(row["bidirectional_GBps"].get<double>(), 2.0 / 0.95);
  EXPECT_GE(row["bidirectional_GBps"].get<double>(), 1.5);
}

TEST(ZinfBenchPcieTest, LinkFromTheEnvironment) {
  const char* saved = std::getenv("ZINF_HOST_LINK_GBPS");
  const std::string saved_value = saved != nullptr ? saved : "";
  setenv("ZINF_HOST_LINK_GBPS", "2.5", 1);
  const ZinfRun ok = RunZinf("bench pcie --host --size 1MiB --reps 1 --json");
  setenv("ZINF_HOST_LINK_GBPS", "fast", 1);
  const ZinfRun bad = RunZinf("bench pcie --host --size 1MiB --reps 1");
  if (saved != nullptr) {
    setenv("ZINF_HOST_LINK_GBPS", saved_value.c_str(), 1);
  } else {
    unsetenv("ZINF_HOST_LINK_GBPS");
  }
  const nlohmann::json j = JsonOutput(ok);
  ASSERT_FALSE(j.is_null());
  EXPECT_DOUBLE_EQ(j["link_GBps"].get<double>(), 2.5);
  EXPECT_NE(j["device"].get<std::string>().find("link 2.50 GB/s"), std::string::npos);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("ZINF_HOST_LINK_GBPS"), std::string::npos) << bad.output;
}

TEST(ZinfBenchPcieTest, BadLinkArguments) {
  ZinfRun r = RunZinf("bench pcie --host --link-gbps -1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--link-gbps"), std::string::npos) << r.output;
  r = RunZinf("bench pcie --link-gbps 1");
  EXPECT_NE(r.exit_code, 0) << "--link-gbps without --host";
  EXPECT_NE(r.output.find("--host"), std::string::npos) << r.output;
}

}  // namespace
