// LinkMeter: bytes and busy time of one link between the tiered store's tiers; LinkMeters: the
// four the store reports (TieredStoreStats). Busy time is the union of the intervals during
// which at least one transfer was on the link, so moves in flight together count once.
//
// Thread-safety: all methods are thread-safe.
#ifndef ZINF_OFFLOAD_LINK_METER_H_
#define ZINF_OFFLOAD_LINK_METER_H_

#include <chrono>
#include <cstdint>

#include "core/mutex.h"
#include "zinf/tiered_store.h"

namespace zinf {

class LinkMeter {
 public:
  // A transfer begins on the link.
  void Begin() {
    MutexLock lock(&mu_);
    if (active_++ == 0) since_ = Clock::now();
  }
  // A transfer begun with Begin ends, having moved `bytes`.
  void End(uint64_t bytes) {
    MutexLock lock(&mu_);
    stats_.bytes += bytes;
    if (--active_ == 0) stats_.busy_seconds += Seconds(Clock::now() - since_);
  }
  // What the link has done so far, counting the transfers on it now up to now.
  LinkStats stats() const {
    MutexLock lock(&mu_);
    LinkStats s = stats_;
    if (active_ > 0) s.busy_seconds += Seconds(Clock::now() - since_);
    return s;
  }

 private:
  using Clock = std::chrono::steady_clock;
  static double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

  mutable Mutex mu_;
  int active_ ZINF_GUARDED_BY(mu_) = 0;  // transfers on the link now
  Clock::time_point since_ ZINF_GUARDED_BY(mu_);
  LinkStats stats_ ZINF_GUARDED_BY(mu_);
};

// One transfer on `meter` for the scope's lifetime.
class LinkScope {
 public:
  LinkScope(LinkMeter& meter, uint64_t bytes) : meter_(meter), bytes_(bytes) { meter_.Begin(); }
  ~LinkScope() { meter_.End(bytes_); }
  LinkScope(const LinkScope&) = delete;
  LinkScope& operator=(const LinkScope&) = delete;

 private:
  LinkMeter& meter_;
  uint64_t bytes_;
};

// The store's links, named by direction: host to device, device to host, host (or host-
// addressable device memory) to NVMe, NVMe to host.
struct LinkMeters {
  LinkMeter h2d, d2h, h2n, n2h;
};

}  // namespace zinf

#endif  // ZINF_OFFLOAD_LINK_METER_H_
