// See Note [Gradient buckets] in gradient_buckets.h.
#include "zero/gradient_buckets.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>

#include "comm/communicator.h"

namespace zinf {

StatusOr<std::unique_ptr<GradientBuckets>> GradientBuckets::Create(TieredStore* store,
                                                                   Device* device,
                                                                   Communicator* comm,
                                                                   uint64_t bucket_elements,
                                                                   GradientSink* sink) {
  if (device == nullptr) {
    return FailedPrecondition("gradient buckets need a tiered store with a device tier");
  }
  const bool host_addressable = device->host_addressable();
  std::unique_ptr<GradientBuckets> buckets(
      new GradientBuckets(store, device, host_addressable, comm, bucket_elements, sink));
  if (!host_addressable) {
    ZINF_ASSIGN_OR_RETURN(buckets->copy_, device->CreateStream());
  }
  return buckets;
}

GradientBuckets::GradientBuckets(TieredStore* store, Device* device, bool host_addressable,
                                 Communicator* comm, uint64_t bucket_elements, GradientSink* sink)
    : store_(store),
      device_(device),
      host_addressable_(host_addressable),
      comm_(comm),
      world_(comm->world_size()),
      slice_elements_(SliceCapacity(bucket_elements, comm->world_size(), 0)),
      sink_(sink) {}

GradientBuckets::~GradientBuckets() {
  for (Bucket& bucket : buckets_) {
    if (bucket.work != nullptr) (void)bucket.work->Wait();
    DropReduced(bucket);
  }
  if (copy_ != nullptr) (void)copy_->Synchronize();
  // What never reached the sink is dropped with the batch (the sink's owner is going too).
  for (InFlight& entry : in_flight_) {
    if (entry.landed.valid()) entry.landed.wait();  // its event must outlive the move
    if (entry.tensor != 0) Free(entry.tensor, entry.pinned);
  }
}

void GradientBuckets::Free(TensorId tensor, bool pinned) {
  if (pinned) store_->Release(tensor, Tier::kDevice).IgnoreError();
  store_->Free(tensor).IgnoreError();
}

void GradientBuckets::DropReduced(Bucket& bucket) {
  if (bucket.received == 0) return;
  if (bucket.reduced != nullptr) store_->Release(bucket.received, Tier::kDevice).IgnoreError();
  store_->Free(bucket.received).IgnoreError();
  bucket.received = 0;
  bucket.reduced = nullptr;
}

Status GradientBuckets::RetireAfter(Stream& stream, InFlight entry) {
  if (!spare_events_.empty()) {
    entry.copied = std::move(spare_events_.back());
    spare_events_.pop_back();
  } else {
    StatusOr<std::unique_ptr<Event>> created = device_->CreateEvent();
    if (!created.ok()) {
      (void)stream.Synchronize();
      if (entry.tensor != 0) Free(entry.tensor, entry.pinned);
      return created.status();
    }
    entry.copied = std::move(created).value();
  }
  Status recorded = stream.Record(*entry.copied);
  if (recorded.ok() && world_ == 1) {
    // The store may move the gradient once it is ours alone and backward has written it.
    recorded = store_->Release(entry.tensor, Tier::kDevice);
    entry.pinned = !recorded.ok();
    if (recorded.ok())
      entry.landed = store_->Prefetch(entry.tensor, Tier::kHost, entry.copied.get());
  }
  in_flight_.push_back(std::move(entry));
  ZINF_RETURN_IF_ERROR(recorded);
  return Retire(kMaxInFlight);
}

Status GradientBuckets::HandOverLanded(const InFlight& entry) {
  ZINF_ASSIGN_OR_RETURN(void* landed, store_->Acquire(entry.tensor, Tier::kHost, Access::kRead));
  Status sunk =
      HandOver(entry.flat_offset, static_cast<const float*>(landed), entry.size, entry.name);
  Status released = store_->Release(entry.tensor, Tier::kHost);
  return sunk.ok() ? released : sunk;
}

Status GradientBuckets::Retire(size_t keep) {
  Status first;
  while (!in_flight_.empty()) {
    InFlight& oldest = in_flight_.front();
    const bool wait = in_flight_.size() > keep;
    Status copied;
    if (oldest.landed.valid()) {
      if (!wait && oldest.landed.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
        break;
      }
      // Each gradient's move is waited for once, found done or not (Note [Transfer counters]).
      store_->transfer_counters().CountWait();
      copied = oldest.landed.get();
      if (copied.ok()) copied = HandOverLanded(oldest);
    } else if (wait) {
      copied = oldest.copied->Synchronize();
    } else {
      StatusOr<bool> done = oldest.copied->Query();
      if (done.ok() && !*done) break;
      copied = done.status();
    }
    if (first.ok()) first = std::move(copied);
    if (oldest.tensor != 0) Free(oldest.tensor, oldest.pinned);
    spare_events_.push_back(std::move(oldest.copied));
    in_flight_.pop_front();
  }
  return first;
}

Status GradientBuckets::Reserve(Bucket& bucket, uint64_t capacity) {
  if (bucket.capacity >= capacity) return OkStatus();
  DropReduced(bucket);  // left by a failed reduction
  bucket = Bucket();
  // Every byte is written before it is read: nothing to zero.
  ZINF_ASSIGN_OR_RETURN(
      bucket.send, StoreArray::Create(store_, fmt::format("gradient bucket {}", created_++),
                                      capacity * world_ * 4, Tier::kDevice, Access::kOverwrite));
  bucket.capacity = capacity;
  return OkStatus();
}

Status GradientBuckets::CopyOnDevice(float* dst, const float* src, uint64_t count) {
  if (host_addressable_) {
    std::memcpy(dst, src, count * sizeof(float));
    // The stream's copy, made by the CPU (Note [Transfer counters] in offload/tiered_store.cc).
    store_->transfer_counters().CountCopy(CopyKind::kDeviceToDevice, count * sizeof(float));
    return OkStatus();
  }
  return copy_->Copy(dst, src, count * sizeof(float), CopyKind::kDeviceToDevice);
}

Status GradientBuckets::ZeroOnDevice(float* dst, uint64_t count) {
  if (host_addressable_) {
    std::memset(dst, 0, count * sizeof(float));
    // The stream's memset, made by the CPU (Note [Transfer counters]).
    store_->transfer_counters().CountDeviceSet(count * sizeof(float));
    return OkStatus();
  }
  return copy_->Memset(dst, 0, count * sizeof(float));
}

Status GradientBuckets::HandOver(uint64_t flat_offset, const float* reduced, uint64_t size,
                                 const std::string& name) {
  if (!sink_error_.ok()) return sink_error_;
  Status sunk = sink_->Add(flat_offset, reduced, size);
  if (!sunk.ok())
    sink_error_ = std::move(sunk).WithContext(fmt::format("the gradient of '{}'", name));
  return sink_error_;
}

Status GradientBuckets::Add(const float* grad, uint64_t shard_size, uint64_t flat_offset,
                            const std::string& name, Event* ready, TensorId tensor,
                            uint64_t padding) {
  if (shard_size == 0 || !sink_error_.ok()) {
    if (tensor != 0) {
      // Whatever produces the gradient may still be writing it: its memory goes back after.
      if (ready != nullptr && shard_size > 0) ready->Synchronize().IgnoreError();
      Free(tensor);
    }
    return sink_error_;
  }
  if (host_addressable_) {
    if (ready != nullptr) ZINF_RETURN_IF_ERROR(ready->Synchronize());
    if (world_ == 1) {  // the gradient is its own reduced shard, at hand
      Status sunk = HandOver(flat_offset, grad, shard_size, name);
      if (tensor != 0) Free(tensor);
      return sunk;
    }
  }
  if (world_ == 1) {    // nothing to reduce: the gradient comes down, then goes to the sink
    if (tensor == 0) {  // the caller's own memory, which the store cannot move
      ZINF_RETURN_IF_ERROR(Retire(0));  // the sink takes gradients in the order added
      if (ready != nullptr) ZINF_RETURN_IF_ERROR(ready->Synchronize());
      ZINF_ASSIGN_OR_RETURN(StoreArray landed,
                            StoreArray::Scratch(store_, name + " (gradient)", shard_size * 4,
                                                Tier::kHost, Access::kOverwrite));
      ZINF_RETURN_IF_ERROR(
          copy_->Copy(landed.data(), grad, shard_size * sizeof(float), CopyKind::kDeviceToHost));
      ZINF_RETURN_IF_ERROR(copy_->Synchronize());
      return HandOver(flat_offset, landed.as<float>(), shard_size, name);
    }
    if (ready != nullptr) ZINF_RETURN_IF_ERROR(copy_->Wait(*ready));
    return RetireAfter(
        *copy_, {.tensor = tensor, .flat_offset = flat_offset, .size = shard_size, .name = name});
  }
  Bucket* bucket = &buckets_[filling_];
  if (bucket->used > 0 && bucket->used + shard_size > slice_elements_) {
    ZINF_RETURN_IF_ERROR(Start(*bucket));
    filling_ ^= 1;
    bucket = &buckets_[filling_];
    ZINF_RETURN_IF_ERROR(Complete(*bucket));  // reduced before the one just started
  }
  if (bucket->used == 0) {
    ZINF_RETURN_IF_ERROR(Reserve(*bucket, std::max(slice_elements_, shard_size)));
  }
  // Where the device is not host-addressable the copies run on a stream while the caller
  // goes on (backward computes the next module meanwhile); the gradient is freed once they
  // have, or before the call returns when the caller keeps it.
  if (ready != nullptr && !host_addressable_) ZINF_RETURN_IF_ERROR(copy_->Wait(*ready));
  // Each rank's slice of the parameter's own elements; its padding (the last rank's, or more
  // for a parameter with fewer elements than ranks) is zeros whatever `grad` holds there.
  float* send = bucket->send.as<float>();
  const uint64_t own = world_ * shard_size - padding;
  for (int r = 0; r < world_; ++r) {
    float* slice = send + r * bucket->capacity + bucket->used;
    const uint64_t first = r * shard_size;
    const uint64_t copied = own > first ? std::min(shard_size, own - first) : 0;
    if (copied > 0) ZINF_RETURN_IF_ERROR(CopyOnDevice(slice, grad + first, copied));
    if (copied < shard_size) {
      ZINF_RETURN_IF_ERROR(ZeroOnDevice(slice + copied, shard_size - copied));
    }
  }
  if (host_addressable_) {
    if (tensor != 0) Free(tensor);
  } else if (tensor != 0) {
    ZINF_RETURN_IF_ERROR(RetireAfter(*copy_, {.tensor = tensor}));
  } else {
    ZINF_RETURN_IF_ERROR(copy_->Synchronize());  // the caller's `grad` may go now
  }
  bucket->pieces.push_back({flat_offset, shard_size, bucket->used, name});
  bucket->used += shard_size;
  return OkStatus();
}

Status GradientBuckets::Start(Bucket& bucket) {
  // Reduce-scatter wants rank r's slice at r * used: close the gaps of a partly filled bucket.
  // Slices move towards the front in rank order, so none overwrites one not yet moved; a
  // slice that overlaps its own new place moves in pieces no longer than the distance, front
  // first, as a memmove would.
  float* send = bucket.send.as<float>();
  if (bucket.used < bucket.capacity) {
    for (int r = 1; r < world_; ++r) {
      float* dst = send + r * bucket.used;
      const float* src = send + r * bucket.capacity;
      if (host_addressable_) {
        std::memmove(dst, src, bucket.used * sizeof(float));
        store_->transfer_counters().CountCopy(CopyKind::kDeviceToDevice,
                                              bucket.used * sizeof(float));
        continue;
      }
      const uint64_t step = static_cast<uint64_t>(src - dst);
      for (uint64_t done = 0; done < bucket.used; done += step) {
        ZINF_RETURN_IF_ERROR(
            CopyOnDevice(dst + done, src + done, std::min(step, bucket.used - done)));
      }
    }
  }
  if (!host_addressable_) {
    ZINF_RETURN_IF_ERROR(copy_->Synchronize());
    ZINF_RETURN_IF_ERROR(Retire(0));  // every packing copy has run
  }
  // The reduced slice, in a scratch tensor of its own size: that is all that comes down.
  ZINF_ASSIGN_OR_RETURN(bucket.received, store_->CreateScratch("gradient bucket (reduced)",
                                                               bucket.used * 4, Tier::kDevice));
  StatusOr<void*> reduced = store_->Acquire(bucket.received, Tier::kDevice, Access::kOverwrite);
  if (!reduced.ok()) {
    DropReduced(bucket);
    return reduced.status();
  }
  bucket.reduced = static_cast<float*>(*reduced);
  bucket.work = comm_->ReduceScatterAsync(send, bucket.reduced, bucket.used, ElementType::kFp32,
                                          ReduceOp::kSum);
  ++reductions_;
  return OkStatus();
}

Status GradientBuckets::Complete(Bucket& bucket) {
  if (bucket.pieces.empty()) return OkStatus();
  if (bucket.work != nullptr) {
    Status reduced = std::exchange(bucket.work, nullptr)->Wait();
    if (!reduced.ok()) {
      const std::string what =
          bucket.pieces.size() == 1
              ? fmt::format("reducing the gradient of '{}'", bucket.pieces.front().name)
              : fmt::format("reducing the gradients of '{}' ... '{}' ({} in one bucket)",
                            bucket.pieces.front().name, bucket.pieces.back().name,
                            bucket.pieces.size());
      return std::move(reduced).WithContext(what);
    }
  }
  const float* reduced = bucket.reduced;  // where the host may read it, it stays
  Tier pinned = Tier::kDevice;
  if (!host_addressable_) {  // only this rank's slice crosses the link, moved by the store
    ZINF_RETURN_IF_ERROR(store_->Release(bucket.received, Tier::kDevice));
    bucket.reduced = nullptr;
    ZINF_ASSIGN_OR_RETURN(void* landed,
                          store_->Acquire(bucket.received, Tier::kHost, Access::kRead));
    reduced = static_cast<const float*>(landed);
    pinned = Tier::kHost;
  }
  Status sunk;
  for (const Piece& piece : bucket.pieces) {
    sunk = HandOver(piece.flat_offset, reduced + piece.at, piece.size, piece.name);
    if (!sunk.ok()) break;
  }
  if (pinned == Tier::kHost) store_->Release(bucket.received, Tier::kHost).IgnoreError();
  DropReduced(bucket);
  bucket.pieces.clear();
  bucket.used = 0;
  return sunk;
}

Status GradientBuckets::Finish() {
  ZINF_RETURN_IF_ERROR(Retire(0));  // one rank's gradients on their way down
  ZINF_RETURN_IF_ERROR(sink_error_);
  Bucket& filling = buckets_[filling_];
  if (filling.used > 0) ZINF_RETURN_IF_ERROR(Start(filling));
  // The other bucket was started first: its additions come first.
  ZINF_RETURN_IF_ERROR(Complete(buckets_[filling_ ^ 1]));
  return Complete(filling);
}

}  // namespace zinf
