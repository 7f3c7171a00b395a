#include "core/memory_budget.h"

#include <fmt/core.h>

#include "core/log.h"
#include "core/units.h"

namespace zinf {

Status MemoryBudget::Reserve(uint64_t bytes) {
  uint64_t in_use = in_use_.load(std::memory_order_relaxed);
  for (;;) {
    if (limit_bytes_ != 0 && (bytes > limit_bytes_ || in_use > limit_bytes_ - bytes)) {
      return ResourceExhausted(
          fmt::format("{} budget exceeded: budget {}, in use {}, requested {} ({} bytes)", name_,
                      FormatBytes(limit_bytes_), FormatBytes(in_use), FormatBytes(bytes), bytes));
    }
    if (in_use_.compare_exchange_weak(in_use, in_use + bytes, std::memory_order_relaxed)) break;
  }
  const uint64_t now = in_use + bytes;
  uint64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  return OkStatus();
}

void MemoryBudget::Release(uint64_t bytes) {
  const uint64_t before = in_use_.fetch_sub(bytes, std::memory_order_relaxed);
  if (before < bytes) {
    in_use_.store(0, std::memory_order_relaxed);
    log::Error("{}: released {} bytes with only {} in use (accounting bug)", name_, bytes, before);
  }
}

}  // namespace zinf
