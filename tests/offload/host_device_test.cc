// The device conformance suite on HostDevice, plus what is specific to it.
#include "tests/offload/device_conformance.h"

namespace zinf::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(
    Host, DeviceConformanceTest,
    ::testing::Values(DeviceFactory{
        "host", [](uint64_t budget) { return CreateHostDevice({.memory_budget_bytes = budget}); }}),
    [](const auto& info) { return info.param.name; });

TEST(HostDeviceTest, ZeroBudgetIsRejected) {
  auto device = CreateHostDevice({.memory_budget_bytes = 0});
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(device.status().message(), "host device memory_budget_bytes must be > 0, got 0");
}

TEST(HostDeviceTest, NameShowsBudget) {
  auto device = CreateHostDevice({.memory_budget_bytes = 1 << 30, .ordinal = 1});
  ASSERT_TRUE(device.ok());
  EXPECT_EQ((*device)->name(), "host:1 (budget 1.00 GiB)");
  EXPECT_EQ((*device)->kind(), DeviceKind::kHost);
}

TEST(HostDeviceTest, StreamDestructorDrainsQueuedWork) {
  auto device = CreateHostDevice({.memory_budget_bytes = 1 << 20});
  ASSERT_TRUE(device.ok());
  int ran = 0;
  {
    auto stream = (*device)->CreateStream();
    ASSERT_TRUE(stream.ok());
    for (int i = 0; i < 10; ++i) {
      ASSERT_TRUE((*stream)
                      ->HostFunc([&ran] {
                        ++ran;
                        return OkStatus();
                      })
                      .ok());
    }
  }
  EXPECT_EQ(ran, 10);
}

// A producer stream, a consumer stream and an event between them, on one host device.
class ProducerConsumerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = CreateHostDevice({.memory_budget_bytes = 1 << 20});
    ASSERT_TRUE(d.ok());
    device = std::move(*d);
    auto p = device->CreateStream();
    auto c = device->CreateStream();
    auto e = device->CreateEvent();
    ASSERT_TRUE(p.ok() && c.ok() && e.ok());
    producer = std::move(*p);
    consumer = std::move(*c);
    event = std::move(*e);
  }
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> producer, consumer;
  std::unique_ptr<Event> event;
};

TEST_F(ProducerConsumerTest, ErrorTravelsThroughEventToWaiter) {
  ASSERT_TRUE(producer->HostFunc([] { return DataLoss("crc mismatch in chunk 3"); }).ok());
  producer->Record(*event).IgnoreError();
  ASSERT_TRUE(consumer->Wait(*event).ok());
  bool consumed = false;
  // Queued (and then skipped), or refused at once if the wait already inherited the error.
  Status queued = consumer->HostFunc([&] {
    consumed = true;
    return OkStatus();
  });
  EXPECT_TRUE(queued.ok() || queued.code() == StatusCode::kDataLoss) << queued;
  Status s = consumer->Synchronize();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << "a waiter must not consume bad data silently";
  EXPECT_FALSE(consumed);
}

TEST_F(ProducerConsumerTest, RecordAfterStreamErrorStillReleasesWaiters) {
  // The order that once hung: the producer has already failed when Record() is called.
  ASSERT_TRUE(producer->HostFunc([] { return IoError("EIO on chunk 7"); }).ok());
  ASSERT_EQ(producer->Synchronize().code(), StatusCode::kIoError);
  EXPECT_EQ(producer->Record(*event).code(), StatusCode::kIoError) << "sticky error reported";
  ASSERT_TRUE(consumer->Wait(*event).ok());
  EXPECT_EQ(consumer->Synchronize().code(), StatusCode::kIoError) << "and inherited, no hang";
  EXPECT_EQ(event->Synchronize().code(), StatusCode::kIoError);
}

}  // namespace
}  // namespace zinf::testing
