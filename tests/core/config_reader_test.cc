#include "core/config_reader.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace zinf {
namespace {

using nlohmann::json;

struct AioOptions {
  int64_t queue_depth = 32;
  uint64_t block_size = 1 << 20;
  bool single_submit = false;
  std::string device = "none";
  double ratio = 1.0;
};

Status ReadAio(const json& j, AioOptions* o) {
  ConfigReader r(j, "aio");
  r.Int("queue_depth", &o->queue_depth, 1, 4096)
      .Bytes("block_size", &o->block_size, 4096, 64 << 20)
      .Bool("single_submit", &o->single_submit)
      .Enum("device", &o->device, {"none", "cpu", "nvme"})
      .Double("ratio", &o->ratio, 0.0, 1.0);
  return r.Finish();
}

TEST(ConfigReaderTest, ReadsValuesAndKeepsDefaults) {
  AioOptions o;
  ASSERT_TRUE(ReadAio(json{{"queue_depth", 8}, {"block_size", "2MiB"}}, &o).ok());
  EXPECT_EQ(o.queue_depth, 8);
  EXPECT_EQ(o.block_size, 2u << 20);
  EXPECT_FALSE(o.single_submit);  // default kept
  EXPECT_EQ(o.device, "none");
}

TEST(ConfigReaderTest, AcceptsIntegralFloats) {
  AioOptions o;
  ASSERT_TRUE(ReadAio(json{{"block_size", 1048576.0}, {"queue_depth", 1e1}}, &o).ok());
  EXPECT_EQ(o.block_size, 1u << 20);
  EXPECT_EQ(o.queue_depth, 10);
}

TEST(ConfigReaderTest, UnknownKeyIsAnError) {
  AioOptions o;
  Status s = ReadAio(json{{"queue_dept", 8}}, &o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'aio.queue_dept' is not recognized"), std::string::npos) << s;
  EXPECT_NE(s.message().find("queue_depth"), std::string::npos) << "lists the allowed keys";
}

TEST(ConfigReaderTest, WrongTypeNamesPathAndValue) {
  AioOptions o;
  Status s = ReadAio(json{{"queue_depth", "8"}}, &o);
  EXPECT_EQ(s.message(), "config key 'aio.queue_depth' must be an integer, got \"8\" (string)");
  s = ReadAio(json{{"single_submit", 1}}, &o);
  EXPECT_EQ(s.message(), "config key 'aio.single_submit' must be true or false, got 1 (number)");
}

TEST(ConfigReaderTest, OutOfRangeSaysWhatIsAllowed) {
  AioOptions o;
  Status s = ReadAio(json{{"queue_depth", 0}}, &o);
  EXPECT_EQ(s.message(), "config key 'aio.queue_depth' must be in [1, 4096], got 0");
  EXPECT_EQ(o.queue_depth, 32) << "a rejected value leaves the default";
  s = ReadAio(json{{"ratio", 1.5}}, &o);
  EXPECT_NE(s.message().find("'aio.ratio' must be in [0, 1], got 1.5"), std::string::npos) << s;
  s = ReadAio(json{{"block_size", "12 parsecs"}}, &o);
  EXPECT_NE(s.message().find("'aio.block_size'"), std::string::npos) << s;
}

TEST(ConfigReaderTest, EnumListsChoices) {
  AioOptions o;
  Status s = ReadAio(json{{"device", "gpu"}}, &o);
  EXPECT_EQ(s.message(), "config key 'aio.device' must be one of none, cpu, nvme; got \"gpu\"");
}

TEST(ConfigReaderTest, NestedObjectsCarryTheirPath) {
  json j = json::parse(R"({"zero_optimization": {"stage": 3,
                          "offload_param": {"device": "nvme", "pin_memory": "yes"}}})");
  ConfigReader root(j, "");
  int64_t stage = 0;
  std::string device;
  bool pin = false;
  root.Object("zero_optimization", [&](ConfigReader& z) {
    z.Int("stage", &stage, 0, 3).Object("offload_param", [&](ConfigReader& p) {
      p.Enum("device", &device, {"none", "cpu", "nvme"}).Bool("pin_memory", &pin);
    });
  });
  Status s = root.Finish();
  EXPECT_EQ(s.message(),
            "config key 'zero_optimization.offload_param.pin_memory' must be true or false, "
            "got \"yes\" (string)");
}

TEST(ConfigReaderTest, NonObjectIsRejected) {
  const json array = json::array({1, 2});
  ConfigReader r(array, "aio");
  EXPECT_EQ(r.Finish().message(), "config key 'aio' must be an object, got 2 elements (array)");
}

TEST(ConfigReaderTest, ListsAndStrings) {
  json j = {{"betas", {0.9, 0.999}}, {"nvme_path", "/nvme"}, {"bad", {1}}};
  ConfigReader r(j, "optimizer.params");
  std::vector<double> betas;
  std::vector<std::string> paths;
  r.Doubles("betas", &betas, 2).Strings("nvme_path", &paths).Ignore("bad");
  ASSERT_TRUE(r.Finish().ok());
  EXPECT_EQ(betas, (std::vector<double>{0.9, 0.999}));
  EXPECT_EQ(paths, (std::vector<std::string>{"/nvme"}));
  const json one_beta = {{"betas", {0.9}}};
  ConfigReader r2(one_beta, "p");
  r2.Doubles("betas", &betas, 2);
  EXPECT_NE(r2.Finish().message().find("must be a list of 2 numbers"), std::string::npos);
}

TEST(ConfigReaderTest, ParseErrorsNameTheSource) {
  auto r = ParseJson("{\"a\": ", "ds_config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("ds_config.json is not valid JSON"), std::string::npos);
  auto missing = ReadJsonFile("/nonexistent/ds_config.json");
  EXPECT_FALSE(missing.ok());
}

// 100k levels crashed (a stack overflow copying or dumping the parsed value); the depth is
// now refused before parsing, with the source and where named.
TEST(ConfigReaderTest, DeepNestingIsRefusedNotACrash) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  auto r = ParseJson(deep, "deep.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("deep.json nests arrays and objects more than 128 levels"),
            std::string::npos)
      << r.status();
  const std::string objects = std::string(200, '{') + "}";
  EXPECT_EQ(ParseJson("{\"a\":" + objects, "c").status().code(), StatusCode::kInvalidArgument);

  // The limit itself is accepted, and brackets inside strings (escaped quotes too) do not count.
  const std::string at_limit = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_TRUE(ParseJson(at_limit, "ok").ok());
  const std::string in_string = "{\"k\": \"\\\"" + std::string(1000, '[') + "\"}";
  auto s = ParseJson(in_string, "s");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)["k"].get<std::string>(), "\"" + std::string(1000, '['));
}

// Element counts take integers and 5e8 but refuse unit strings: "500MB" would be read as
// bytes by a user and as elements by the engine.
TEST(ConfigReaderTest, ElementsRefuseByteStrings) {
  json j = {{"a", 5e8}, {"b", 200}, {"c", "500MB"}, {"d", 1.5}, {"e", -1}};
  uint64_t a = 0, b = 0, c = 7, d = 0;
  ConfigReader ok(j, "zero_optimization");
  ok.Elements("a", &a).Elements("b", &b, 1, 1000).Ignore("c").Ignore("d").Ignore("e");
  ASSERT_TRUE(ok.Finish().ok());
  EXPECT_EQ(a, 500000000u);
  EXPECT_EQ(b, 200u);

  ConfigReader strings(j, "zero_optimization");
  strings.Elements("c", &c);
  Status s = strings.Finish();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'zero_optimization.c' counts elements (parameters), not bytes"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("\"500MB\" (string)"), std::string::npos) << s;
  EXPECT_EQ(c, 7u) << "left unchanged on error";

  for (const char* key : {"d", "e"}) {
    ConfigReader bad(j, "z");
    bad.Elements(key, &d);
    EXPECT_NE(bad.Finish().message().find("non-negative whole number of elements"),
              std::string::npos)
        << key;
  }
  ConfigReader range(j, "z");
  range.Elements("b", &b, 1, 100);
  EXPECT_NE(range.Finish().message().find("must be in [1, 100] elements, got 200"),
            std::string::npos);
}

// "auto" is left to the caller, and counts as read so that Finish does not call it unknown.
TEST(ConfigReaderTest, IsAutoMarksTheKeyRead) {
  json j = {{"lr", "auto"}, {"eps", "Auto"}, {"wd", 0}};
  ConfigReader r(j, "optimizer.params");
  EXPECT_TRUE(r.IsAuto("lr"));
  EXPECT_FALSE(r.IsAuto("eps"));  // DeepSpeed and Hugging Face match "auto" exactly
  EXPECT_FALSE(r.IsAuto("wd"));
  EXPECT_FALSE(r.IsAuto("absent"));
  EXPECT_TRUE(r.Finish().ok());
}

// What a fuzzer feeds ParseJson: any bytes give a value or an error, never an exception.
TEST(ConfigReaderTest, ParseJsonNeverThrows) {
  for (std::string_view text :
       {std::string_view("\xff\xfe"), std::string_view("\"\\"), std::string_view("[1e99999]"),
        std::string_view("{\"a\" 1}"), std::string_view("\0", 1), std::string_view("]]]]")}) {
    EXPECT_NO_THROW((void)ParseJson(text, "fuzz")) << text;
  }
}

}  // namespace
}  // namespace zinf
