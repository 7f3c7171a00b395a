// StoreArray: a byte array the engine keeps in one tier of the tiered store, acquired there
// (pinned, addressable) for as long as the object lives: the flat shard's fp32 master,
// gradient accumulators and optimizer state in the host tier, the gradient buckets in the
// device tier. Everything the engine holds is a tensor of the store, under its budgets.
//
// Thread-safety: a value; the store is thread-safe.
#ifndef ZINF_ZERO_STORE_ARRAY_H_
#define ZINF_ZERO_STORE_ARRAY_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "zinf/status.h"
#include "zinf/tiered_store.h"

namespace zinf {

class StoreArray {
 public:
  StoreArray() = default;
  StoreArray(StoreArray&& other) noexcept { *this = std::move(other); }
  StoreArray& operator=(StoreArray&& other) noexcept {
    if (this != &other) {
      Reset();
      store_ = std::exchange(other.store_, nullptr);
      id_ = std::exchange(other.id_, 0);
      tier_ = other.tier_;
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  ~StoreArray() { Reset(); }

  // `bytes` in `store`'s tier `tier`, named `name` in its errors: zeros, or with kOverwrite
  // whatever the memory held (for a caller that writes before it reads).
  static StatusOr<StoreArray> Create(TieredStore* store, const std::string& name, uint64_t bytes,
                                     Tier tier = Tier::kHost, Access access = Access::kWrite) {
    return Make(store, store->Create(name, bytes, tier), bytes, tier, access);
  }
  // Create for an array made and dropped over and over (a staging buffer of every batch): a
  // scratch tensor of the store, whose memory the next such array of its size reuses.
  static StatusOr<StoreArray> Scratch(TieredStore* store, std::string_view name, uint64_t bytes,
                                      Tier tier = Tier::kHost, Access access = Access::kWrite) {
    return Make(store, store->CreateScratch(name, bytes, tier), bytes, tier, access);
  }

  TensorId id() const { return id_; }
  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  uint64_t size_bytes() const { return bytes_; }
  bool empty() const { return data_ == nullptr; }

  void Reset() {
    if (store_ == nullptr) return;
    if (data_ != nullptr) store_->Release(id_, tier_).IgnoreError();
    store_->Free(id_).IgnoreError();
    store_ = nullptr;
    data_ = nullptr;
    bytes_ = 0;
  }

 private:
  static StatusOr<StoreArray> Make(TieredStore* store, StatusOr<TensorId> created, uint64_t bytes,
                                   Tier tier, Access access) {
    StoreArray a;
    ZINF_ASSIGN_OR_RETURN(a.id_, std::move(created));
    a.store_ = store;
    a.tier_ = tier;
    ZINF_ASSIGN_OR_RETURN(a.data_, store->Acquire(a.id_, tier, access));
    a.bytes_ = bytes;
    return a;
  }

  TieredStore* store_ = nullptr;
  TensorId id_ = 0;
  Tier tier_ = Tier::kHost;
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace zinf

#endif  // ZINF_ZERO_STORE_ARRAY_H_
