// A C++ program using an installed zinf: every public header (each must compile from the
// installed include directory alone), the C++ API of the tiered store and the CPU optimizer,
// and the C ABI from C++. Prints "consumer_cxx: ok" on success. Its CMake target sets no C++
// standard: the C++20 it needs comes from zinf::zinf, or this does not compile.
#include <zinf/c_api.h>
#include <zinf/cpu_info.h>
#include <zinf/cpu_optimizer.h>
#include <zinf/device.h>
#include <zinf/engine.h>
#include <zinf/export.h>
#include <zinf/host_memory.h>
#include <zinf/status.h>
#include <zinf/tiered_store.h>

#include <cstring>
#include <iostream>
#include <vector>

static_assert(__cplusplus >= 202002L,
              "zinf's public C++ headers need C++20: zinf::zinf must carry cxx_std_20");

namespace {

int Fail(const zinf::Status& status) {
  std::cerr << "consumer_cxx: " << status << "\n";
  return 1;
}

}  // namespace

int main() {
  zinf::TieredStoreOptions options;
  options.device = "host";
  options.device_budget_bytes = 1 << 20;
  options.host_budget_bytes = 1 << 20;
  options.pin_host = false;
  auto store = zinf::TieredStore::Create(options);
  if (!store.ok()) return Fail(store.status());
  auto id = (*store)->Create("w", 4096, zinf::Tier::kHost);
  if (!id.ok()) return Fail(id.status());
  auto host = (*store)->Acquire(*id, zinf::Tier::kHost, zinf::Access::kWrite);
  if (!host.ok()) return Fail(host.status());
  std::memset(*host, 7, 4096);
  if (auto s = (*store)->Release(*id, zinf::Tier::kHost); !s.ok()) return Fail(s);
  if (auto s = (*store)->Prefetch(*id, zinf::Tier::kDevice).get(); !s.ok()) return Fail(s);
  auto device = (*store)->Acquire(*id, zinf::Tier::kDevice, zinf::Access::kRead);
  if (!device.ok()) return Fail(device.status());
  if (static_cast<const unsigned char*>(*device)[4095] != 7) return Fail(zinf::Internal("bytes"));
  if (auto s = (*store)->Release(*id, zinf::Tier::kDevice); !s.ok()) return Fail(s);

  auto optimizer = zinf::CpuOptimizer::Create({.threads = 1});
  if (!optimizer.ok()) return Fail(optimizer.status());
  auto group =
      (*optimizer)->AddParamGroup(zinf::OptimizerHyperParams::Defaults(zinf::OptimizerType::kLion));
  if (!group.ok()) return Fail(group.status());
  std::vector<float> p(64, 1.0f), g(64, 0.5f), m(64, 0.0f);
  zinf::OptimizerSpan span;
  span.params = p.data();
  span.grads = g.data();
  span.state0 = m.data();
  span.count = p.size();
  auto step = (*optimizer)->Step(*group, span);
  if (!step.ok()) return Fail(step.status());
  if (!(p[0] < 1.0f)) return Fail(zinf::Internal("Lion did not move the parameters"));

  // Errors come back as values, named.
  zinf::Status bad = (*store)->Free(12345);
  if (bad.ok()) return Fail(zinf::Internal("freeing an unknown tensor succeeded"));

  // The C ABI from C++.
  char* err = nullptr;
  zinf_cpu_optimizer_t* c_optimizer = nullptr;
  if (zinf_cpu_optimizer_create(nullptr, &c_optimizer, &err) != ZINF_INVALID_ARGUMENT) {
    return Fail(zinf::Internal("NULL options accepted"));
  }
  zinf_free(err);

  std::cout << "consumer_cxx: ok (zinf " << zinf_version() << ", "
            << zinf::GetCpuInfo().logical_cpus << " CPUs)\n";
  return 0;
}
