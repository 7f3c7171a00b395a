// See Note [Gradient buckets] in gradient_buckets.h.
#include "zero/gradient_buckets.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <utility>

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
    if (bucket.landed.valid()) bucket.landed.wait();  // the store's copy reads and writes ours
    DropReduced(bucket);
  }
  // What never reached the sink is dropped with the batch (the sink's owner is going too).
  if (copy_ != nullptr) (void)copy_->Synchronize();
  for (InFlight& entry : in_flight_) Free(entry.tensor);
}

void GradientBuckets::Free(TensorId tensor) {
  store_->Release(tensor, Tier::kDevice).IgnoreError();
  store_->Free(tensor).IgnoreError();
}

void GradientBuckets::DropReduced(Bucket& bucket) {
  if (bucket.received == 0) return;
  if (bucket.reduced != nullptr) store_->Release(bucket.received, Tier::kDevice).IgnoreError();
  store_->Free(bucket.received).IgnoreError();
  bucket.received = 0;
  bucket.reduced = nullptr;
}

StatusOr<std::unique_ptr<Event>> GradientBuckets::TakeEvent() {
  if (spare_events_.empty()) return device_->CreateEvent();
  std::unique_ptr<Event> event = std::move(spare_events_.back());
  spare_events_.pop_back();
  return event;
}

Status GradientBuckets::RetireAfter(Stream& stream, TensorId tensor, uint64_t bytes) {
  StatusOr<std::unique_ptr<Event>> copied = TakeEvent();
  Status recorded = copied.ok() ? stream.Record(**copied) : copied.status();
  if (!recorded.ok()) {
    (void)stream.Synchronize();
    Free(tensor);
    return recorded;
  }
  in_flight_.push_back({std::move(copied).value(), tensor, bytes});
  in_flight_bytes_ += bytes;
  return Retire(std::max<uint64_t>(slice_elements_ * world_ * sizeof(float), bytes));
}

Status GradientBuckets::Retire(uint64_t keep_bytes) {
  Status first;
  while (!in_flight_.empty()) {
    InFlight& oldest = in_flight_.front();
    Status copied;
    if (in_flight_bytes_ > keep_bytes) {
      copied = oldest.copied->Synchronize();
    } else {  // asked, not waited for (Note [Transfer counters] counts no wait)
      StatusOr<bool> done = oldest.copied->Query();
      if (done.ok() && !*done) break;
      copied = done.status();
    }
    if (first.ok()) first = std::move(copied);
    Free(oldest.tensor);
    in_flight_bytes_ -= oldest.bytes;
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
  if (world_ == 1) {  // the bucket's copy down lands here (Start)
    ZINF_ASSIGN_OR_RETURN(
        bucket.landing,
        StoreArray::Create(store_, fmt::format("gradient bucket {} (landed)", created_ - 1),
                           capacity * 4, Tier::kHost, Access::kOverwrite));
  }
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
  // Each slice fills from its end (Note [Gradient buckets]).
  const uint64_t at = bucket->capacity - bucket->used - shard_size;
  for (int r = 0; r < world_; ++r) {
    float* slice = send + r * bucket->capacity + at;
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
    ZINF_RETURN_IF_ERROR(RetireAfter(*copy_, tensor, world_ * shard_size * sizeof(float)));
  } else {
    ZINF_RETURN_IF_ERROR(copy_->Synchronize());  // the caller's `grad` may go now
  }
  bucket->pieces.push_back({flat_offset, shard_size, at, name});
  bucket->used += shard_size;
  return OkStatus();
}

Status GradientBuckets::Start(Bucket& bucket) {
  float* send = bucket.send.as<float>();
  if (world_ == 1) {  // nothing to reduce: the bucket comes down whole, after its packing
    const uint64_t begin = bucket.capacity - bucket.used;
    AskForLanding(bucket);
    ZINF_ASSIGN_OR_RETURN(bucket.packed, TakeEvent());
    ZINF_RETURN_IF_ERROR(copy_->Record(*bucket.packed));
    bucket.landed = store_->CopyDownAsync(
        bucket.send.id(), begin * sizeof(float), bucket.used * sizeof(float),
        bucket.direct != nullptr ? bucket.direct : bucket.landing.as<float>() + begin,
        bucket.packed.get());
    return OkStatus();
  }
  // Reduce-scatter wants rank r's slice at r * used: each slice's filled end moves to the
  // front. Slices move towards the front in rank order, so none overwrites one not yet moved;
  // a slice that overlaps its own new place moves in pieces no longer than the distance, front
  // first, as a memmove would.
  const uint64_t tail = bucket.capacity - bucket.used;
  if (tail > 0) {
    for (int r = 0; r < world_; ++r) {
      float* dst = send + r * bucket.used;
      const float* src = send + r * bucket.capacity + tail;
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
  if (!host_addressable_) {  // the collective reads what the packing wrote: its thread waits
    ZINF_ASSIGN_OR_RETURN(bucket.packed, TakeEvent());
    ZINF_RETURN_IF_ERROR(copy_->Record(*bucket.packed));
  }
  AskForLanding(bucket);
  if (bucket.direct != nullptr && host_addressable_) {  // reduced into the accumulators
    bucket.reduced = bucket.direct;
    bucket.work = comm_->ReduceScatterAsync(send, bucket.reduced, bucket.used, ElementType::kFp32,
                                            ReduceOp::kSum);
    ++reductions_;
    return OkStatus();
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
                                          ReduceOp::kSum, bucket.packed.get());
  ++reductions_;
  return OkStatus();
}

void GradientBuckets::AskForLanding(Bucket& bucket) {
  bucket.flat_first = bucket.pieces.back().flat_offset;
  bucket.direct = nullptr;
  if (!sink_error_.ok() || !InFlatOrder(bucket)) return;
  // The other bucket's gradients have not reached the sink yet: where they are of the same
  // parameters (an earlier micro-batch's), the sink's word on what its accumulators hold is
  // not yet true, and these must be added after them.
  const Bucket& other = &bucket == &buckets_[0] ? buckets_[1] : buckets_[0];
  const uint64_t last = bucket.flat_first + bucket.used;
  for (const Piece& piece : other.pieces) {
    if (piece.flat_offset < last && piece.flat_offset + piece.size > bucket.flat_first) return;
  }
  bucket.direct = sink_->LandingFor(bucket.flat_first, bucket.used);
}

Status GradientBuckets::Landed(Bucket& bucket) {
  if (!sink_error_.ok()) return sink_error_;
  Status landed = sink_->Landed(bucket.flat_first, bucket.used);
  if (!landed.ok()) {
    sink_error_ = std::move(landed).WithContext(fmt::format(
        "the gradients of '{}' ... '{}'", bucket.pieces.front().name, bucket.pieces.back().name));
  }
  return sink_error_;
}

bool GradientBuckets::InFlatOrder(const Bucket& bucket) {
  for (size_t i = 1; i < bucket.pieces.size(); ++i) {
    const Piece& before = bucket.pieces[i - 1];
    const Piece& piece = bucket.pieces[i];
    if (piece.flat_offset + piece.size != before.flat_offset) return false;
  }
  return true;
}

Status GradientBuckets::WaitLanded(Bucket& bucket) {
  if (!bucket.landed.valid()) {  // its Start failed, and said why
    return FailedPrecondition(
        "a gradient bucket's copy down never started: an earlier error stopped it");
  }
  store_->transfer_counters().CountWait();  // Note [Transfer counters]: the store's future
  Status landed = std::exchange(bucket.landed, {}).get();
  spare_events_.push_back(std::move(bucket.packed));
  ZINF_RETURN_IF_ERROR(landed);
  return Retire(in_flight_bytes_);  // packed before the copy down: done, freed with no wait
}

Status GradientBuckets::Complete(Bucket& bucket) {
  if (bucket.pieces.empty()) return OkStatus();
  Status done = world_ == 1 ? WaitLanded(bucket) : WaitReduced(bucket);
  if (done.ok()) done = bucket.direct != nullptr ? Landed(bucket) : HandOverPieces(bucket);
  DropReduced(bucket);
  bucket.reduced = nullptr;
  bucket.direct = nullptr;
  bucket.pieces.clear();
  bucket.used = 0;
  return done;
}

Status GradientBuckets::WaitReduced(Bucket& bucket) {
  if (bucket.work != nullptr) {
    Status reduced = std::exchange(bucket.work, nullptr)->Wait();
    if (bucket.packed != nullptr) spare_events_.push_back(std::move(bucket.packed));
    if (!reduced.ok()) {
      const std::string what =
          bucket.pieces.size() == 1
              ? fmt::format("reducing the gradient of '{}'", bucket.pieces.front().name)
              : fmt::format("reducing the gradients of '{}' ... '{}' ({} in one bucket)",
                            bucket.pieces.front().name, bucket.pieces.back().name,
                            bucket.pieces.size());
      return std::move(reduced).WithContext(what);
    }
    ZINF_RETURN_IF_ERROR(Retire(in_flight_bytes_));  // packed before it: freed with no wait
  }
  if (bucket.direct == nullptr || host_addressable_) return OkStatus();
  // Into the accumulators: the store copies the reduced slice down (the collective wrote them
  // itself where the host addresses device memory).
  store_->transfer_counters().CountWait();  // Note [Transfer counters]: the store's future
  return store_->CopyDownAsync(bucket.received, 0, bucket.used * sizeof(float), bucket.direct)
      .get();
}

Status GradientBuckets::HandOverPieces(Bucket& bucket) {
  // Each piece sits where its part of the (rank's slice of the) bucket did: with one rank in
  // the landing array, with several in the reduced slice, less the unfilled head.
  const float* from = nullptr;
  Tier pinned = Tier::kDevice;
  if (world_ == 1) {
    from = bucket.landing.as<float>();
  } else if (host_addressable_) {
    from = bucket.reduced - (bucket.capacity - bucket.used);
  } else {  // only this rank's slice crosses the link, moved by the store
    ZINF_RETURN_IF_ERROR(store_->Release(bucket.received, Tier::kDevice));
    bucket.reduced = nullptr;
    ZINF_ASSIGN_OR_RETURN(void* landed,
                          store_->Acquire(bucket.received, Tier::kHost, Access::kRead));
    from = static_cast<const float*>(landed) - (bucket.capacity - bucket.used);
    pinned = Tier::kHost;
  }
  Status sunk;
  for (const Piece& piece : bucket.pieces) {
    sunk = HandOver(piece.flat_offset, from + piece.at, piece.size, piece.name);
    if (!sunk.ok()) break;
  }
  if (pinned == Tier::kHost) store_->Release(bucket.received, Tier::kHost).IgnoreError();
  return sunk;
}

Status GradientBuckets::Finish() {
  Bucket& filling = buckets_[filling_];
  Status done = sink_error_;
  if (done.ok() && filling.used > 0) done = Start(filling);
  // The other bucket was started first: its additions come first.
  if (done.ok()) done = Complete(buckets_[filling_ ^ 1]);
  if (done.ok()) done = Complete(filling);
  if (!done.ok()) {
    // A collective waits for its bucket's packing, so a failed one may leave packing copies
    // running, reading gradients their caller frees once this returns: let them finish.
    if (copy_ != nullptr) (void)copy_->Synchronize();
    return done;
  }
  return Retire(0);  // every packing has run by now: frees what is left, with no wait
}

}  // namespace zinf
