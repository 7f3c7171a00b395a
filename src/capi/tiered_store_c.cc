// The C ABI of the tiered store (zinf_tiered_store_*), over zinf::TieredStore.
//
// Thread-safety: as TieredStore, all thread-safe.
#include <string>
#include <vector>

#include "capi/capi_internal.h"
#include "capi/completion.h"
#include "zinf/c_api.h"
#include "zinf/tiered_store.h"

namespace zinf::capi {

template <>
struct HandleTraits<zinf_tiered_store_t> {
  using Object = TieredStore;
  static constexpr HandleKind kKind = HandleKind::kTieredStore;
};

namespace {

StatusOr<Tier> ToTier(int tier, const char* arg) {
  if (tier < ZINF_TIER_DEVICE || tier > ZINF_TIER_NVME) {
    return InvalidArgument(std::string(arg) +
                           " must be ZINF_TIER_DEVICE (0), ZINF_TIER_HOST (1) or " +
                           "ZINF_TIER_NVME (2), got " + std::to_string(tier));
  }
  return static_cast<Tier>(tier);
}

StatusOr<TieredStoreOptions> ToOptions(const zinf_tiered_store_options_t* in) {
  zinf_tiered_store_options_t c;
  zinf_tiered_store_options_init(&c);
  ZINF_RETURN_IF_ERROR(ReadStruct(in, "options", "zinf_tiered_store_options_t",
                                  "zinf_tiered_store_options_init", &c));
  TieredStoreOptions o;
  o.device = c.device != nullptr ? c.device : "";
  o.device_budget_bytes = c.device_budget_bytes;
  o.host_budget_bytes = c.host_budget_bytes;
  o.pin_host = c.pin_host != 0;
  o.numa_node = c.numa_node;
  if (c.nvme_path_count > 0 && c.nvme_paths == nullptr) {
    return InvalidArgument("options->nvme_paths is NULL with nvme_path_count " +
                           std::to_string(c.nvme_path_count));
  }
  for (size_t i = 0; i < c.nvme_path_count; ++i) {
    if (c.nvme_paths[i] == nullptr) {
      return InvalidArgument("options->nvme_paths[" + std::to_string(i) + "] is NULL");
    }
    o.nvme_paths.emplace_back(c.nvme_paths[i]);
  }
  o.nvme_capacity_bytes = c.nvme_capacity_bytes;
  o.nvme_checksum = c.nvme_checksum != 0;
  o.piece_bytes = c.piece_bytes;
  o.staging_buffers = c.staging_buffers;
  o.transfer_threads = c.transfer_threads;
  return o;
}

StatusOr<Access> ToAccess(int access) {
  switch (access) {
    case ZINF_ACCESS_READ:
      return Access::kRead;
    case ZINF_ACCESS_WRITE:
      return Access::kWrite;
    case ZINF_ACCESS_OVERWRITE:
      return Access::kOverwrite;
  }
  return InvalidArgument(
      "access must be ZINF_ACCESS_READ (0), ZINF_ACCESS_WRITE (1) or ZINF_ACCESS_OVERWRITE (2), "
      "got " +
      std::to_string(access));
}

// A completion handle for a store operation's future.
zinf_completion_t* CompletionFor(std::shared_future<Status> future) {
  return NewHandle<zinf_completion_t>(std::make_shared<Completion>(std::move(future)));
}

zinf_link_stats_t ToC(const LinkStats& s) { return {s.bytes, s.busy_seconds}; }

}  // namespace
}  // namespace zinf::capi

using zinf::OkStatus;
using zinf::Status;
using zinf::StatusOr;
using zinf::TieredStore;
using zinf::capi::CheckNotNull;
using zinf::capi::Completion;
using zinf::capi::NewHandle;
using zinf::capi::Run;
using zinf::capi::ToTier;

extern "C" {

void zinf_tiered_store_options_init(zinf_tiered_store_options_t* options) {
  if (options == nullptr) return;
  const zinf::TieredStoreOptions d;
  *options = zinf_tiered_store_options_t{};
  options->struct_size = sizeof(*options);
  options->device = "host";
  options->device_budget_bytes = d.device_budget_bytes;
  options->host_budget_bytes = d.host_budget_bytes;
  options->nvme_capacity_bytes = d.nvme_capacity_bytes;
  options->piece_bytes = d.piece_bytes;
  options->pin_host = d.pin_host ? 1 : 0;
  options->numa_node = d.numa_node;
  options->nvme_checksum = d.nvme_checksum ? 1 : 0;
  options->staging_buffers = d.staging_buffers;
  options->transfer_threads = d.transfer_threads;
}

zinf_code_t zinf_tiered_store_create(const zinf_tiered_store_options_t* options,
                                     zinf_tiered_store_t** store, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(CheckNotNull(store, "store"));
    *store = nullptr;
    ZINF_ASSIGN_OR_RETURN(auto o, zinf::capi::ToOptions(options));
    ZINF_ASSIGN_OR_RETURN(std::shared_ptr<TieredStore> created, TieredStore::Create(o));
    *store = NewHandle<zinf_tiered_store_t>(std::move(created));
    return OkStatus();
  });
}

void zinf_tiered_store_destroy(zinf_tiered_store_t* store) {
  try {
    zinf::capi::TakeHandle(store).reset();
  } catch (...) {
  }
}

zinf_code_t zinf_tiered_store_create_tensor(zinf_tiered_store_t* store, const char* name,
                                            uint64_t size_bytes, zinf_tier_t home, uint64_t* tensor,
                                            char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto s, zinf_tiered_store_t, store);
    ZINF_RETURN_IF_ERROR(CheckNotNull(name, "name"));
    ZINF_RETURN_IF_ERROR(CheckNotNull(tensor, "tensor"));
    ZINF_ASSIGN_OR_RETURN(auto tier, ToTier(home, "home"));
    ZINF_ASSIGN_OR_RETURN(*tensor, s->Create(name, size_bytes, tier));
    return OkStatus();
  });
}

zinf_code_t zinf_tiered_store_free_tensor(zinf_tiered_store_t* store, uint64_t tensor,
                                          char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto s, zinf_tiered_store_t, store);
    return s->Free(tensor);
  });
}

zinf_code_t zinf_tiered_store_prefetch(zinf_tiered_store_t* store, uint64_t tensor,
                                       zinf_tier_t tier, zinf_completion_t** completion,
                                       char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    if (completion != nullptr) *completion = nullptr;
    ZINF_CAPI_GET(auto s, zinf_tiered_store_t, store);
    ZINF_ASSIGN_OR_RETURN(auto t, ToTier(tier, "tier"));
    std::shared_future<Status> future = s->Prefetch(tensor, t);
    if (completion != nullptr) *completion = zinf::capi::CompletionFor(std::move(future));
    return OkStatus();
  });
}

zinf_code_t zinf_tiered_store_acquire(zinf_tiered_store_t* store, uint64_t tensor, zinf_tier_t tier,
                                      zinf_access_t access, void** data, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto s, zinf_tiered_store_t, store);
    ZINF_RETURN_IF_ERROR(CheckNotNull(data, "data"));
    ZINF_ASSIGN_OR_RETURN(auto t, ToTier(tier, "tier"));
    ZINF_ASSIGN_OR_RETURN(auto a, zinf::capi::ToAccess(access));
    ZINF_ASSIGN_OR_RETURN(*data, s->Acquire(tensor, t, a));
    return OkStatus();
  });
}

zinf_code_t zinf_tiered_store_release(zinf_tiered_store_t* store, uint64_t tensor, zinf_tier_t tier,
                                      char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto s, zinf_tiered_store_t, store);
    ZINF_ASSIGN_OR_RETURN(auto t, ToTier(tier, "tier"));
    return s->Release(tensor, t);
  });
}

zinf_code_t zinf_tiered_store_evict(zinf_tiered_store_t* store, uint64_t tensor, zinf_tier_t tier,
                                    char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto s, zinf_tiered_store_t, store);
    ZINF_ASSIGN_OR_RETURN(auto t, ToTier(tier, "tier"));
    return s->Evict(tensor, t);
  });
}

zinf_code_t zinf_tiered_store_evict_async(zinf_tiered_store_t* store, uint64_t tensor,
                                          zinf_tier_t tier, zinf_completion_t** completion,
                                          char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    if (completion != nullptr) *completion = nullptr;
    ZINF_CAPI_GET(auto s, zinf_tiered_store_t, store);
    ZINF_ASSIGN_OR_RETURN(auto t, ToTier(tier, "tier"));
    std::shared_future<Status> future = s->EvictAsync(tensor, t);
    if (completion != nullptr) *completion = zinf::capi::CompletionFor(std::move(future));
    return OkStatus();
  });
}

zinf_code_t zinf_tiered_store_flush(zinf_tiered_store_t* store, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto s, zinf_tiered_store_t, store);
    return s->Flush();
  });
}

zinf_code_t zinf_tiered_store_set_next_use(zinf_tiered_store_t* store, uint64_t tensor,
                                           int64_t next_use, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto s, zinf_tiered_store_t, store);
    return s->SetNextUse(tensor, next_use);
  });
}

zinf_code_t zinf_tiered_store_resident_tiers(zinf_tiered_store_t* store, uint64_t tensor,
                                             uint32_t* tier_mask, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto s, zinf_tiered_store_t, store);
    ZINF_RETURN_IF_ERROR(CheckNotNull(tier_mask, "tier_mask"));
    ZINF_ASSIGN_OR_RETURN(std::vector<zinf::Tier> tiers, s->ResidentTiers(tensor));
    uint32_t mask = 0;
    for (zinf::Tier t : tiers) mask |= 1u << static_cast<int>(t);
    *tier_mask = mask;
    return OkStatus();
  });
}

zinf_code_t zinf_tiered_store_stats(zinf_tiered_store_t* store, zinf_tiered_store_stats_t* stats,
                                    char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto s, zinf_tiered_store_t, store);
    const zinf::TieredStoreStats st = s->stats();
    zinf_tiered_store_stats_t c{};
    using zinf::capi::ToC;
    c.host_to_device = ToC(st.host_to_device);
    c.device_to_host = ToC(st.device_to_host);
    c.host_to_nvme = ToC(st.host_to_nvme);
    c.nvme_to_host = ToC(st.nvme_to_host);
    for (int i = 0; i < 3; ++i) {
      c.tiers[i] = {st.tiers[i].budget_bytes, st.tiers[i].in_use_bytes, st.tiers[i].peak_bytes};
    }
    c.evictions = st.evictions;
    c.write_backs = st.write_backs;
    return zinf::capi::WriteStruct(c, "stats", "zinf_tiered_store_stats_t", stats);
  });
}

}  // extern "C"
