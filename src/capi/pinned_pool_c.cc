// The C ABI of the pinned host pool (zinf_pinned_pool_*), over zinf::MemoryPool: C gets
// malloc-style pointers, and the PoolBlock that owns each lives here, found by its address.
//
// Thread-safety: all calls are thread-safe (MemoryPool is; the block table has its own mutex).
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>

#include "capi/capi_internal.h"
#include "offload/memory_pool.h"
#include "zinf/c_api.h"

namespace zinf::capi {
namespace {

class PinnedPool {
 public:
  explicit PinnedPool(std::unique_ptr<MemoryPool> pool) : pool_(std::move(pool)) {}

  StatusOr<void*> Allocate(uint64_t size_bytes) {
    ZINF_ASSIGN_OR_RETURN(PoolBlock block, pool_->Allocate(size_bytes));
    void* data = block.data();
    std::lock_guard lock(mu_);
    blocks_.emplace(data, std::move(block));
    return data;
  }

  Status Free(void* data) {
    PoolBlock block;  // returned to the pool outside mu_
    std::lock_guard lock(mu_);
    auto it = blocks_.find(data);
    if (it == blocks_.end()) {
      return InvalidArgument("data " + PointerString(data) + " is not a live block of " +
                             pool_->name());
    }
    block = std::move(it->second);
    blocks_.erase(it);
    return OkStatus();
  }

  MemoryPool& pool() { return *pool_; }

 private:
  static std::string PointerString(const void* p) {
    char text[32];
    std::snprintf(text, sizeof(text), "%p", p);
    return text;
  }

  // Declared before blocks_, so destroyed after them: a block must not outlive its pool.
  std::unique_ptr<MemoryPool> pool_;
  std::mutex mu_;
  std::unordered_map<void*, PoolBlock> blocks_;  // guarded by mu_
};

}  // namespace

template <>
struct HandleTraits<zinf_pinned_pool_t> {
  using Object = PinnedPool;
  static constexpr HandleKind kKind = HandleKind::kPinnedPool;
};

}  // namespace zinf::capi

using zinf::OkStatus;
using zinf::Status;
using zinf::capi::CheckNotNull;
using zinf::capi::Run;

extern "C" {

void zinf_pinned_pool_options_init(zinf_pinned_pool_options_t* options) {
  if (options == nullptr) return;
  const zinf::PinnedPoolOptions d;
  *options = zinf_pinned_pool_options_t{};
  options->struct_size = sizeof(*options);
  options->budget_bytes = d.budget_bytes;
  options->arena_bytes = d.arena_bytes;
  options->alignment = d.alignment;
  options->name = nullptr;
  options->preallocate = d.preallocate ? 1 : 0;
  options->pinned = d.pinned ? 1 : 0;
  options->numa_node = d.numa_node;
}

zinf_code_t zinf_pinned_pool_create(const zinf_pinned_pool_options_t* options,
                                    zinf_pinned_pool_t** pool, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_RETURN_IF_ERROR(CheckNotNull(pool, "pool"));
    *pool = nullptr;
    zinf_pinned_pool_options_t c;
    zinf_pinned_pool_options_init(&c);
    ZINF_RETURN_IF_ERROR(zinf::capi::ReadStruct(options, "options", "zinf_pinned_pool_options_t",
                                                "zinf_pinned_pool_options_init", &c));
    zinf::PinnedPoolOptions o;
    o.budget_bytes = c.budget_bytes;
    o.arena_bytes = c.arena_bytes;
    o.alignment = c.alignment;
    o.preallocate = c.preallocate != 0;
    o.pinned = c.pinned != 0;
    o.numa_node = c.numa_node;
    if (c.name != nullptr) o.name = c.name;
    ZINF_ASSIGN_OR_RETURN(auto created, zinf::MemoryPool::CreatePinned(o));
    *pool = zinf::capi::NewHandle<zinf_pinned_pool_t>(
        std::make_shared<zinf::capi::PinnedPool>(std::move(created)));
    return OkStatus();
  });
}

void zinf_pinned_pool_destroy(zinf_pinned_pool_t* pool) {
  try {
    zinf::capi::TakeHandle(pool).reset();
  } catch (...) {
  }
}

zinf_code_t zinf_pinned_pool_alloc(zinf_pinned_pool_t* pool, uint64_t size_bytes, void** data,
                                   char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto p, zinf_pinned_pool_t, pool);
    ZINF_RETURN_IF_ERROR(CheckNotNull(data, "data"));
    ZINF_ASSIGN_OR_RETURN(*data, p->Allocate(size_bytes));
    return OkStatus();
  });
}

zinf_code_t zinf_pinned_pool_free(zinf_pinned_pool_t* pool, void* data, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto p, zinf_pinned_pool_t, pool);
    if (data == nullptr) return OkStatus();
    return p->Free(data);
  });
}

zinf_code_t zinf_pinned_pool_trim(zinf_pinned_pool_t* pool, uint64_t* released_bytes,
                                  char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto p, zinf_pinned_pool_t, pool);
    const uint64_t released = p->pool().Trim();
    if (released_bytes != nullptr) *released_bytes = released;
    return OkStatus();
  });
}

zinf_code_t zinf_pinned_pool_stats(zinf_pinned_pool_t* pool, zinf_pool_stats_t* stats,
                                   char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto p, zinf_pinned_pool_t, pool);
    const zinf::MemoryPoolStats s = p->pool().stats();
    zinf_pool_stats_t c{};
    c.budget_bytes = s.budget_bytes;
    c.arena_bytes = s.arena_bytes;
    c.in_use_bytes = s.in_use_bytes;
    c.peak_in_use_bytes = s.peak_in_use_bytes;
    c.free_bytes = s.free_bytes;
    c.largest_free_bytes = s.largest_free_bytes;
    c.arenas = s.arenas;
    c.blocks = s.blocks;
    c.fragmentation = s.fragmentation;
    return zinf::capi::WriteStruct(c, "stats", "zinf_pool_stats_t", stats);
  });
}

zinf_code_t zinf_pinned_pool_reset_peak(zinf_pinned_pool_t* pool, char** errptr) {
  return Run(__func__, errptr, [&]() -> Status {
    ZINF_CAPI_GET(auto p, zinf_pinned_pool_t, pool);
    p->pool().ResetPeak();
    return OkStatus();
  });
}

}  // extern "C"
