// The C handle registry and the helpers of capi_internal.h. See Note [C handles] and
// Note [Versioned structs] there.
//
// Thread-safety: the registry is guarded by a shared mutex: lookups share it, registering and
// unregistering take it alone.
#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <unordered_map>

#include "capi/capi_internal.h"
#include "core/log.h"

namespace zinf::capi {
namespace {

constexpr int kIdShift = 4;

struct Entry {
  HandleKind kind;
  std::shared_ptr<void> object;
};

class Registry {
 public:
  void* Register(HandleKind kind, std::shared_ptr<void> object) {
    std::unique_lock lock(mu_);
    const uint64_t id = next_id_++;
    entries_.emplace(id, Entry{kind, std::move(object)});
    return reinterpret_cast<void*>(static_cast<uintptr_t>(id << kIdShift));
  }

  StatusOr<std::shared_ptr<void>> Lookup(const void* handle, HandleKind kind, const char* arg) {
    if (handle == nullptr) return InvalidArgument(std::string(arg) + " is NULL");
    const auto value = reinterpret_cast<uintptr_t>(handle);
    const uint64_t id = value >> kIdShift;
    std::shared_lock lock(mu_);
    if ((value & ((uintptr_t{1} << kIdShift) - 1)) != 0 || id >= next_id_) {
      return InvalidArgument(std::string(arg) + " is not a zinf handle (expected a " +
                             HandleKindName(kind) + ")");
    }
    auto it = entries_.find(id);
    if (it == entries_.end()) {
      return FailedPrecondition(std::string(arg) + " is a destroyed handle (expected a live " +
                                HandleKindName(kind) + ")");
    }
    if (it->second.kind != kind) {
      return InvalidArgument(std::string(arg) + " is a " + HandleKindName(it->second.kind) +
                             ", expected a " + HandleKindName(kind));
    }
    return it->second.object;
  }

  std::shared_ptr<void> Unregister(const void* handle, HandleKind kind) {
    // Checked as a lookup would, so that the log says what was wrong with the handle.
    auto live = Lookup(handle, kind, "handle");
    if (!live.ok()) {
      if (handle != nullptr) log::Warn("destroying a {}: {}", HandleKindName(kind), live.status());
      return nullptr;
    }
    std::unique_lock lock(mu_);
    auto it = entries_.find(reinterpret_cast<uintptr_t>(handle) >> kIdShift);
    if (it == entries_.end()) return nullptr;  // destroyed by another thread meanwhile
    std::shared_ptr<void> object = std::move(it->second.object);
    entries_.erase(it);
    return object;
  }

 private:
  std::shared_mutex mu_;
  uint64_t next_id_ = 1;                         // guarded by mu_
  std::unordered_map<uint64_t, Entry> entries_;  // guarded by mu_
};

// Never destroyed: see Note [C handles].
Registry& GetRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

}  // namespace

const char* HandleKindName(HandleKind kind) {
  switch (kind) {
    case HandleKind::kCompletion:
      return "zinf_completion_t";
    case HandleKind::kTieredStore:
      return "zinf_tiered_store_t";
    case HandleKind::kPinnedPool:
      return "zinf_pinned_pool_t";
    case HandleKind::kSwapStore:
      return "zinf_swap_store_t";
    case HandleKind::kCpuOptimizer:
      return "zinf_cpu_optimizer_t";
    case HandleKind::kEngine:
      return "zinf_engine_t";
  }
  return "zinf handle";
}

void* RegisterHandle(HandleKind kind, std::shared_ptr<void> object) {
  return GetRegistry().Register(kind, std::move(object));
}

StatusOr<std::shared_ptr<void>> LookupHandle(const void* handle, HandleKind kind, const char* arg) {
  return GetRegistry().Lookup(handle, kind, arg);
}

std::shared_ptr<void> UnregisterHandle(const void* handle, HandleKind kind) {
  return GetRegistry().Unregister(handle, kind);
}

Status StatusFromCurrentException() noexcept {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("out of memory");
  } catch (const std::exception& e) {
    return Internal(std::string("unexpected exception: ") + e.what());
  } catch (...) {
    return Internal("unexpected exception of unknown type");
  }
}

char* MallocString(const std::string& s) noexcept {
  char* copy = static_cast<char*>(std::malloc(s.size() + 1));
  if (copy != nullptr) std::memcpy(copy, s.c_str(), s.size() + 1);
  return copy;
}

zinf_code_t Report(const char* function, const Status& status, char** errptr) noexcept {
  const auto code = static_cast<zinf_code_t>(status.code());
  if (status.ok() || errptr == nullptr) return code;
  std::free(*errptr);
  *errptr = nullptr;
  // Built with malloc and memcpy: a std::string could throw, here of all places.
  const char* parts[] = {function, ": ", zinf_code_name(code), ": ", status.message().c_str()};
  size_t size = 1;
  for (const char* p : parts) size += std::strlen(p);
  char* message = static_cast<char*>(std::malloc(size));
  if (message == nullptr) return code;
  char* end = message;
  for (const char* p : parts) {
    const size_t n = std::strlen(p);
    std::memcpy(end, p, n);
    end += n;
  }
  *end = '\0';
  *errptr = message;
  return code;
}

const char* MemberOf(const char* arg) {
  const size_t n = std::strlen(arg);
  return n > 0 && arg[n - 1] == ']' ? "." : "->";
}

Status CheckNotNull(const void* pointer, const char* arg) {
  if (pointer == nullptr) return InvalidArgument(std::string(arg) + " is NULL");
  return OkStatus();
}

Status CheckStructSize(size_t struct_size, size_t min_size, size_t known_size, const void* base,
                       const char* arg, const char* type_name, const char* init_function) {
  if (struct_size < min_size || struct_size > known_size + kMaxStructGrowth) {
    return InvalidArgument(std::string(arg) + MemberOf(arg) + "struct_size is " +
                           std::to_string(struct_size) + "; expected sizeof(" + type_name + ") (" +
                           std::to_string(known_size) + " in this library): initialise it with " +
                           init_function);
  }
  const auto* bytes = static_cast<const unsigned char*>(base);
  for (size_t i = known_size; i < struct_size; ++i) {
    if (bytes[i] != 0) {
      return InvalidArgument(std::string(arg) + " is a " + type_name + " of " +
                             std::to_string(struct_size) +
                             " bytes from a newer zinf, with fields " + "set that this library (" +
                             std::to_string(known_size) + " bytes) does not know");
    }
  }
  return OkStatus();
}

}  // namespace zinf::capi
