// A byte budget shared by allocators: device memory, pinned pools, staging buffers.
//
// Reserve() either takes the bytes or fails with ResourceExhausted naming the budget, what is
// in use and what was asked; the budget is never exceeded, even under concurrent callers.
//
// Thread-safe (lock-free).
#ifndef ZINF_CORE_MEMORY_BUDGET_H_
#define ZINF_CORE_MEMORY_BUDGET_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "zinf/status.h"

namespace zinf {

class MemoryBudget {
 public:
  // `name` appears in errors: "host:0 memory". A limit of 0 means unlimited.
  MemoryBudget(std::string name, uint64_t limit_bytes)
      : name_(std::move(name)), limit_bytes_(limit_bytes) {}

  Status Reserve(uint64_t bytes);
  void Release(uint64_t bytes);

  const std::string& name() const { return name_; }
  uint64_t limit_bytes() const { return limit_bytes_; }
  uint64_t in_use_bytes() const { return in_use_.load(std::memory_order_relaxed); }
  uint64_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }
  void ResetPeak() { peak_.store(in_use_bytes(), std::memory_order_relaxed); }

 private:
  const std::string name_;
  const uint64_t limit_bytes_;
  std::atomic<uint64_t> in_use_{0};
  std::atomic<uint64_t> peak_{0};
};

}  // namespace zinf

#endif  // ZINF_CORE_MEMORY_BUDGET_H_
