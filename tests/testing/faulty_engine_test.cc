// Fault injection through FaultyEngine under a SwapStore: EIO, ENOSPC, short and torn writes
// and corrupt reads surface as errors naming the tensor, file and offset; a failed write
// leaves a sticky error that later writes and allocations report; no acknowledged write is
// lost.
#include "tests/testing/faulty_engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nvme/swap_store.h"
#include "tests/nvme/nvme_test_util.h"

namespace zinf {
namespace {

using ::testing::HasSubstr;
using testing_util::RandomBytes;
using testing_util::ScratchDir;

struct Fixture {
  ScratchDir dir;
  FaultyEngine* faulty = nullptr;
  std::unique_ptr<SwapStore> store;

  Status Open(bool checksum, IoBackend backend = IoBackend::kIoUring) {
    SwapStoreOptions o;
    o.paths = {dir.Sub("a"), dir.Sub("b")};
    o.capacity_bytes = 16 << 20;
    o.stripe_bytes = 64 * 1024;
    o.checksum = checksum;
    o.aio.backend = backend;
    o.aio.block_size = 64 * 1024;
    auto base = CreateIoEngine(o.aio);
    if (!base.ok()) return base.status();
    auto wrapper = std::make_unique<FaultyEngine>(std::move(*base));
    faulty = wrapper.get();
    auto s = SwapStore::Open(o, std::move(wrapper));
    if (!s.ok()) return s.status();
    store = std::move(*s);
    return OkStatus();
  }
};

struct Tensor {
  SwapExtent extent;
  std::vector<uint8_t> data;
};

std::vector<Tensor> WriteTensors(SwapStore& store, int n, uint64_t seed,
                                 std::vector<Status>* results) {
  std::vector<Tensor> tensors;
  for (int i = 0; i < n; ++i) {
    const uint64_t size = 50000 + 7919 * static_cast<uint64_t>(i);
    auto e = store.Allocate(size, "layer" + std::to_string(i) + ".weight");
    EXPECT_TRUE(e.ok()) << e.status();
    tensors.push_back({*e, RandomBytes(size, seed + static_cast<uint64_t>(i))});
  }
  results->assign(tensors.size(), OkStatus());
  IoWaiter waiter;
  for (size_t i = 0; i < tensors.size(); ++i) {
    waiter.Add();
    store.WriteAsync(tensors[i].extent, tensors[i].data.data(), [&, i](Status s) {
      (*results)[i] = s;
      waiter.Done(std::move(s));
    });
  }
  waiter.Wait().IgnoreError();
  return tensors;
}

class WriteFault : public ::testing::TestWithParam<std::tuple<Fault, IoBackend>> {};

TEST_P(WriteFault, SurfacesWithContextIsStickyAndLosesNoAcknowledgedWrite) {
  const auto [fault, backend] = GetParam();
  Fixture f;
  ASSERT_TRUE(f.Open(/*checksum=*/true, backend).ok());
  f.faulty->Arm(IoOp::kWrite, 5, fault);
  std::vector<Status> results;
  auto tensors = WriteTensors(*f.store, 12, 100, &results);
  ASSERT_EQ(f.faulty->injected(), 1);

  int failed = 0;
  int refused = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::vector<uint8_t> back(tensors[i].data.size());
    Status r = f.store->Read(tensors[i].extent, back.data());
    const std::string name = "layer" + std::to_string(i) + ".weight";
    if (results[i].ok()) {
      // Acknowledged: must read back intact, sticky error or not.
      ASSERT_TRUE(r.ok()) << "acknowledged tensor " << i << ": " << r;
      ASSERT_EQ(back, tensors[i].data) << "acknowledged tensor " << i << " lost";
    } else if (results[i].message().find("refuses writes after a failed write") !=
               std::string::npos) {
      // Submitted after the failure: refused up front, nothing was written.
      ++refused;
      EXPECT_EQ(r.code(), StatusCode::kFailedPrecondition) << r;
      EXPECT_THAT(r.message(), HasSubstr("never written"));
    } else {
      ++failed;
      EXPECT_THAT(results[i].message(), HasSubstr("writing tensor '" + name + "'"));
      EXPECT_THAT(results[i].message(), HasSubstr("zinf-swap-rank0-"));
      EXPECT_THAT(results[i].message(), HasSubstr("at offset"));
      if (fault == Fault::kEnospc || fault == Fault::kShortWrite) {
        EXPECT_EQ(results[i].code(), StatusCode::kResourceExhausted) << results[i];
      } else {
        EXPECT_EQ(results[i].code(), StatusCode::kIoError) << results[i];
      }
      EXPECT_EQ(r.code(), StatusCode::kDataLoss) << r;
      EXPECT_THAT(r.message(), HasSubstr("write failed"));
    }
  }
  EXPECT_EQ(failed, 1);
  EXPECT_LT(refused, static_cast<int>(tensors.size()) - 1);

  // Sticky: every later write and allocation reports the failure.
  Status sticky = f.store->status();
  EXPECT_FALSE(sticky.ok());
  std::vector<uint8_t> more(4096, 1);
  Status w = f.store->Write(tensors[0].extent, more.data());
  EXPECT_EQ(w.code(), sticky.code());
  EXPECT_THAT(w.message(), HasSubstr("refuses writes after a failed write"));
  EXPECT_THAT(w.message(), HasSubstr(sticky.message()));
  auto a = f.store->Allocate(4096, "later");
  EXPECT_EQ(a.status().code(), sticky.code());
  EXPECT_THAT(a.status().message(), HasSubstr(sticky.message()));
  // The rejected rewrite did not disturb the acknowledged copy.
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!results[i].ok()) continue;
    std::vector<uint8_t> back(tensors[i].data.size());
    ASSERT_TRUE(f.store->Read(tensors[i].extent, back.data()).ok());
    ASSERT_EQ(back, tensors[i].data);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Faults, WriteFault,
    ::testing::Combine(::testing::Values(Fault::kEio, Fault::kEnospc, Fault::kShortWrite),
                       ::testing::Values(IoBackend::kIoUring, IoBackend::kPosix)));

TEST(FaultyEngine, TornWriteIsCaughtByTheChecksumNamingFileOffsetAndTensor) {
  Fixture f;
  ASSERT_TRUE(f.Open(/*checksum=*/true).ok());
  std::vector<Status> results;
  auto tensors = WriteTensors(*f.store, 2, 7, &results);  // old contents on disk first
  ASSERT_TRUE(results[0].ok() && results[1].ok());
  // Rewrite tensor 1 with new data; the device keeps only part of it but says it succeeded.
  auto fresh = RandomBytes(tensors[1].data.size(), 999);
  f.faulty->Arm(IoOp::kWrite, 0, Fault::kTornWrite);
  ASSERT_TRUE(f.store->Write(tensors[1].extent, fresh.data()).ok());
  std::vector<uint8_t> back(fresh.size());
  Status r = f.store->Read(tensors[1].extent, back.data());
  EXPECT_EQ(r.code(), StatusCode::kDataLoss) << r;
  EXPECT_THAT(r.message(), HasSubstr("'layer1.weight'"));
  EXPECT_THAT(r.message(), HasSubstr("checksum mismatch"));
  EXPECT_THAT(r.message(), HasSubstr("zinf-swap-rank0-"));
  EXPECT_THAT(r.message(), HasSubstr("at offset"));
}

TEST(FaultyEngine, CorruptReadIsDataLossWithChecksumAndSilentWithout) {
  for (bool checksum : {true, false}) {
    Fixture f;
    ASSERT_TRUE(f.Open(checksum).ok());
    std::vector<Status> results;
    auto tensors = WriteTensors(*f.store, 1, 3, &results);
    ASSERT_TRUE(results[0].ok());
    f.faulty->Arm(IoOp::kRead, 0, Fault::kCorruptRead);
    std::vector<uint8_t> back(tensors[0].data.size());
    Status r = f.store->Read(tensors[0].extent, back.data());
    if (checksum) {
      EXPECT_EQ(r.code(), StatusCode::kDataLoss) << r;
      EXPECT_THAT(r.message(), HasSubstr("'layer0.weight'"));
    } else {
      // Without checksums nothing can notice: the reason checksum exists.
      EXPECT_TRUE(r.ok());
      EXPECT_NE(back, tensors[0].data);
    }
  }
}

// Each piece is checked as its own request lands and the piece split off as an unaligned tail
// once all have (Note [Checksums beside the I/O]): corruption in any request is caught.
TEST(FaultyEngine, CorruptionInAnyRequestOfAManyPieceReadIsCaught) {
  Fixture f;
  ASSERT_TRUE(f.Open(/*checksum=*/true).ok());
  const uint64_t size = 3 * 64 * 1024 + 5000;  // three whole pieces and a piece of 4096 + 904
  auto e = f.store->Allocate(size, "big");
  ASSERT_TRUE(e.ok()) << e.status();
  const std::vector<uint8_t> data = RandomBytes(size, 5);
  ASSERT_TRUE(f.store->Write(*e, data.data()).ok());
  std::vector<uint8_t> back(size);
  for (int request = 0; request < 5; ++request) {
    f.faulty->Arm(IoOp::kRead, request, Fault::kCorruptRead);
    Status r = f.store->Read(*e, back.data());
    EXPECT_EQ(r.code(), StatusCode::kDataLoss) << "request " << request << ": " << r;
    EXPECT_THAT(r.message(), HasSubstr("'big'"));
  }
  EXPECT_EQ(f.faulty->injected(), 5);
  ASSERT_TRUE(f.store->Read(*e, back.data()).ok());
  EXPECT_EQ(back, data);
}

TEST(FaultyEngine, ReadErrorIsReportedAndNotSticky) {
  Fixture f;
  ASSERT_TRUE(f.Open(false).ok());
  std::vector<Status> results;
  auto tensors = WriteTensors(*f.store, 1, 3, &results);
  f.faulty->Arm(IoOp::kRead, 0, Fault::kEio);
  std::vector<uint8_t> back(tensors[0].data.size());
  Status r = f.store->Read(tensors[0].extent, back.data());
  EXPECT_EQ(r.code(), StatusCode::kIoError);
  EXPECT_THAT(r.message(), HasSubstr("reading tensor 'layer0.weight'"));
  EXPECT_THAT(r.message(), HasSubstr("Input/output error"));
  EXPECT_TRUE(f.store->status().ok());
  ASSERT_TRUE(f.store->Read(tensors[0].extent, back.data()).ok());
  EXPECT_EQ(back, tensors[0].data);
}

}  // namespace
}  // namespace zinf
