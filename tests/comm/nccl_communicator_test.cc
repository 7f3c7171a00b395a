// The NCCL backend on one GPU (world size 1; more ranks need more GPUs). Without a GPU, or in
// a build without NCCL, it must refuse with Unavailable and say why; the collectives then skip.
// NCCL is loaded on first use: where it loads, from the loader's path, it is 2.14 or later
// (ncclCommInitRankConfig), and where it does not the refusal names it.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "comm/communicator.h"
#include "comm/tcp_store.h"
#include "zinf/device.h"
#ifdef ZINF_HAVE_NCCL
#include "offload/cuda/nccl_library.h"
#endif

namespace zinf {
namespace {

using namespace std::chrono_literals;

TEST(NcclCommunicatorTest, CollectivesOnOneGpuOrAClearRefusal) {
  auto store = TcpStore::Create({.port = 0, .is_server = true, .timeout = 10000ms});
  ASSERT_TRUE(store.ok()) << store.status();
  auto comm = CreateNcclCommunicator(**store, {.rank = 0, .world_size = 1, .timeout = 30000ms});
  if (!comm.ok()) {
    ASSERT_EQ(comm.status().code(), StatusCode::kUnavailable) << comm.status();
    EXPECT_FALSE(comm.status().message().empty());
    GTEST_SKIP() << comm.status().message();
  }
  auto device = CreateCudaDevice({});
  ASSERT_TRUE(device.ok()) << device.status();
  auto stream = (*device)->CreateStream();
  auto host = (*device)->AllocateHost(1024 * 8);
  auto a = (*device)->Allocate(1024 * 8);
  auto b = (*device)->Allocate(1024 * 8);
  ASSERT_TRUE(stream.ok() && host.ok() && a.ok() && b.ok());
  std::vector<float> values(1024);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.5f * i;
  std::memcpy(host->data(), values.data(), 4096);
  ASSERT_TRUE((*stream)->Copy(a->data(), host->data(), 4096, CopyKind::kHostToDevice).ok());
  ASSERT_TRUE((*stream)->Synchronize().ok());
  Communicator& c = **comm;
  EXPECT_EQ(c.backend(), "nccl");
  ASSERT_TRUE(c.AllReduce(a->data(), 1024, ElementType::kFp32, ReduceOp::kSum).ok());
  ASSERT_TRUE(c.AllGather(a->data(), b->data(), 1024, ElementType::kFp32).ok());
  ASSERT_TRUE(c.Broadcast(b->data(), 1024, ElementType::kFp32, 0).ok());
  ASSERT_TRUE(c.Barrier().ok());
  ASSERT_TRUE((*stream)->Copy(host->data(), b->data(), 4096, CopyKind::kDeviceToHost).ok());
  ASSERT_TRUE((*stream)->Synchronize().ok());
  EXPECT_EQ(std::memcmp(host->data(), values.data(), 4096), 0) << "one rank: sums are copies";
  EXPECT_EQ(c.Broadcast(b->data(), 1, ElementType::kFp32, 1).code(), StatusCode::kInvalidArgument);
}

#ifdef ZINF_HAVE_NCCL
TEST(NcclLibraryTest, LoadsTheProcessNcclOrSaysWhy) {
  auto nccl = LoadNccl();
  if (!nccl.ok()) {
    ASSERT_EQ(nccl.status().code(), StatusCode::kUnavailable) << nccl.status();
    EXPECT_NE(nccl.status().message().find("libnccl.so.2"), std::string::npos) << nccl.status();
    GTEST_SKIP() << nccl.status().message();
  }
  int version = 0;
  ASSERT_EQ((*nccl)->GetVersion(&version), ncclSuccess);
  EXPECT_GE(version, 21400);
  EXPECT_STRNE((*nccl)->GetErrorString(ncclInvalidArgument), "");
  EXPECT_EQ(*LoadNccl(), *nccl) << "loaded once";
}
#endif

TEST(NcclCommunicatorTest, BadRankIsInvalid) {
  auto store = TcpStore::Create({.port = 0, .is_server = true, .timeout = 1000ms});
  ASSERT_TRUE(store.ok());
  auto comm = CreateNcclCommunicator(**store, {.rank = 3, .world_size = 2});
  EXPECT_EQ(comm.status().code(), StatusCode::kInvalidArgument) << comm.status();
}

}  // namespace
}  // namespace zinf
