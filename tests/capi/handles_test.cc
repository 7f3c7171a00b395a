// The C ABI's shared machinery (src/capi/handles.cc): handle ids that are never reused, kinds
// told apart, exceptions turned into codes and messages, and the struct_size rule.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "capi/capi_internal.h"

namespace zinf::capi {
namespace {

using ::testing::HasSubstr;

struct Widget {
  int value = 0;
};

TEST(HandlesTest, LiveDestroyedAndForeignHandlesAreToldApart) {
  void* a = RegisterHandle(HandleKind::kPinnedPool, std::make_shared<Widget>(Widget{7}));
  auto got = LookupHandle(a, HandleKind::kPinnedPool, "pool");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(std::static_pointer_cast<Widget>(*got)->value, 7);

  auto wrong_kind = LookupHandle(a, HandleKind::kEngine, "engine");
  EXPECT_EQ(wrong_kind.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong_kind.status().message(),
              HasSubstr("engine is a zinf_pinned_pool_t, expected a zinf_engine_t"));

  // A call in flight keeps the object alive past the destroy.
  std::shared_ptr<void> in_flight = *got;
  std::shared_ptr<void> taken = UnregisterHandle(a, HandleKind::kPinnedPool);
  ASSERT_NE(taken, nullptr);
  taken.reset();
  EXPECT_EQ(std::static_pointer_cast<Widget>(in_flight)->value, 7);

  auto destroyed = LookupHandle(a, HandleKind::kPinnedPool, "pool");
  EXPECT_EQ(destroyed.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(destroyed.status().message(), HasSubstr("pool is a destroyed handle"));
  EXPECT_EQ(UnregisterHandle(a, HandleKind::kPinnedPool), nullptr);  // twice: nothing

  // A new handle never takes an old one's value.
  void* b = RegisterHandle(HandleKind::kPinnedPool, std::make_shared<Widget>());
  EXPECT_NE(a, b);
  EXPECT_EQ(LookupHandle(a, HandleKind::kPinnedPool, "pool").status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_NE(UnregisterHandle(b, HandleKind::kPinnedPool), nullptr);

  int local = 0;
  EXPECT_EQ(LookupHandle(&local, HandleKind::kPinnedPool, "pool").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(LookupHandle(nullptr, HandleKind::kPinnedPool, "pool").status().message(),
            "pool is NULL");
}

TEST(HandlesTest, DestroyingWhileOtherThreadsLookUpIsSafe) {
  // Readers hold the object across their "call" while the main thread destroys handles: every
  // lookup either gets a live object or a clean error, and no object dies under a reader.
  constexpr int kHandles = 200;
  std::vector<void*> handles;
  for (int i = 0; i < kHandles; ++i) {
    handles.push_back(RegisterHandle(HandleKind::kSwapStore, std::make_shared<Widget>(Widget{i})));
  }
  std::atomic<bool> stop{false};
  std::atomic<int> started{0};
  std::atomic<int64_t> hits{0}, misses{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t) {
    readers.emplace_back([&, t] {
      for (uint64_t n = t; !stop.load(); ++n) {
        const int i = static_cast<int>(n % kHandles);
        auto object = LookupHandle(handles[i], HandleKind::kSwapStore, "store");
        if (object.ok()) {
          EXPECT_EQ(std::static_pointer_cast<Widget>(*object)->value, i);
          ++hits;
        } else {
          EXPECT_EQ(object.status().code(), StatusCode::kFailedPrecondition);
          ++misses;
        }
        if (n == static_cast<uint64_t>(t)) ++started;
      }
    });
  }
  // Every reader is looking up before the first handle goes (on a loaded machine they may not
  // have been scheduled yet), and some lookup sees a destroyed one before they stop.
  while (started.load() < 3) std::this_thread::yield();
  for (int i = 0; i < kHandles; ++i) {
    EXPECT_NE(UnregisterHandle(handles[i], HandleKind::kSwapStore), nullptr);
    if (i % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  while (misses.load() == 0) std::this_thread::yield();
  stop = true;
  for (auto& r : readers) r.join();
  EXPECT_GT(hits.load(), 0);
}

TEST(HandlesTest, NoExceptionLeavesRun) {
  char* err = nullptr;
  EXPECT_EQ(capi::Run("f", &err, []() -> Status { throw std::runtime_error("boom"); }),
            ZINF_INTERNAL);
  EXPECT_STREQ(err, "f: Internal: unexpected exception: boom");
  EXPECT_EQ(capi::Run("g", &err, []() -> Status { throw std::bad_alloc(); }),
            ZINF_RESOURCE_EXHAUSTED);
  EXPECT_STREQ(err, "g: ResourceExhausted: out of memory");
  EXPECT_EQ(capi::Run("h", &err, []() -> Status { throw 42; }), ZINF_INTERNAL);
  EXPECT_THAT(err, HasSubstr("unknown type"));
  // Success leaves the message alone; a null errptr is fine.
  EXPECT_EQ(capi::Run("i", &err, [] { return OkStatus(); }), ZINF_OK);
  EXPECT_THAT(err, HasSubstr("h: Internal"));
  EXPECT_EQ(capi::Run("j", nullptr, [] { return DataLoss("x"); }), ZINF_DATA_LOSS);
  std::free(err);
}

struct Options {
  size_t struct_size = sizeof(Options);
  int a = 1;
  int b = 2;
};

TEST(HandlesTest, VersionedStructsReadWhatFitsAndRefuseTheRest) {
  Options in;
  in.a = 5;
  Options out;
  ASSERT_TRUE(ReadStruct(&in, "options", "Options", "Init", &out).ok());
  EXPECT_EQ(out.a, 5);

  // An older caller's struct (the first version had only `a`): b keeps its default.
  Options older;
  older.struct_size = offsetof(Options, b);
  older.a = 9;
  older.b = 99;
  out = Options{};
  ASSERT_TRUE(ReadStruct(&older, "options", "Options", "Init", &out, offsetof(Options, b)).ok());
  EXPECT_EQ(out.a, 9);
  EXPECT_EQ(out.b, 2);
  EXPECT_EQ(out.struct_size, sizeof(Options));

  in.struct_size = 4;
  Status s = ReadStruct(&in, "options", "Options", "Init", &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("options->struct_size is 4"));
  EXPECT_THAT(s.message(), HasSubstr("Init"));

  struct {
    Options options;
    char newer[8] = {};
  } newer;
  newer.options.struct_size = sizeof(newer);
  EXPECT_TRUE(ReadStruct(&newer.options, "options", "Options", "Init", &out).ok());
  newer.newer[7] = 1;
  EXPECT_THAT(ReadStruct(&newer.options, "options", "Options", "Init", &out).message(),
              HasSubstr("does not know"));

  Options written;
  written.struct_size = offsetof(Options, b);
  written.b = 77;
  Options value;
  value.a = 3;
  value.b = 4;
  ASSERT_TRUE(WriteStruct(value, "stats", "Options", &written, offsetof(Options, b)).ok());
  EXPECT_EQ(written.a, 3);
  EXPECT_EQ(written.b, 77);  // past the caller's struct_size: untouched
  EXPECT_EQ(written.struct_size, offsetof(Options, b));
  EXPECT_THAT(CheckOutputStruct<Options>(nullptr, "params[2]", "Options").message(),
              HasSubstr("params[2] is NULL"));
  Options zero;
  zero.struct_size = 0;
  EXPECT_THAT(CheckOutputStruct(&zero, "params[2]", "Options").message(),
              HasSubstr("params[2].struct_size is 0"));
}

}  // namespace
}  // namespace zinf::capi
