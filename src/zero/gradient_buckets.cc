// See Note [Gradient buckets] in gradient_buckets.h.
#include "zero/gradient_buckets.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>

#include "comm/communicator.h"

namespace zinf {

StatusOr<std::unique_ptr<GradientBuckets>> GradientBuckets::Create(
    TieredStore* store, Device* device, Communicator* comm, uint64_t bucket_elements, Sink sink) {
  if (device == nullptr) {
    return FailedPrecondition("gradient buckets need a tiered store with a device tier");
  }
  const bool host_addressable = device->host_addressable();
  std::unique_ptr<GradientBuckets> buckets(
      new GradientBuckets(store, device, host_addressable, comm, bucket_elements, std::move(sink)));
  if (!host_addressable) {
    ZINF_ASSIGN_OR_RETURN(buckets->copy_, device->CreateStream());
    ZINF_ASSIGN_OR_RETURN(buckets->down_, device->CreateStream());
  }
  return buckets;
}

GradientBuckets::GradientBuckets(TieredStore* store, Device* device, bool host_addressable,
                                 Communicator* comm, uint64_t bucket_elements, Sink sink)
    : store_(store),
      device_(device),
      host_addressable_(host_addressable),
      comm_(comm),
      world_(comm->world_size()),
      slice_elements_(SliceCapacity(bucket_elements, comm->world_size(), 0)),
      sink_(std::move(sink)) {}

GradientBuckets::~GradientBuckets() {
  for (Bucket& bucket : buckets_) {
    if (bucket.work != nullptr) (void)bucket.work->Wait();
  }
  for (Stream* stream : {copy_.get(), down_.get()}) {
    if (stream != nullptr) (void)stream->Synchronize();
  }
  // What never reached the sink is dropped with the batch (the sink's owner is going too).
  for (InFlight& entry : in_flight_) {
    if (entry.tensor != 0) Free(entry.tensor);
  }
}

void GradientBuckets::Free(TensorId tensor) {
  store_->Release(tensor, Tier::kDevice).IgnoreError();
  store_->Free(tensor).IgnoreError();
}

Status GradientBuckets::RetireAfter(Stream& stream, InFlight entry) {
  if (!spare_events_.empty()) {
    entry.copied = std::move(spare_events_.back());
    spare_events_.pop_back();
  } else {
    StatusOr<std::unique_ptr<Event>> created = device_->CreateEvent();
    if (!created.ok()) {
      (void)stream.Synchronize();
      if (entry.tensor != 0) Free(entry.tensor);
      return created.status();
    }
    entry.copied = std::move(created).value();
  }
  Status recorded = stream.Record(*entry.copied);
  in_flight_.push_back(std::move(entry));
  ZINF_RETURN_IF_ERROR(recorded);
  return Retire(kMaxInFlight);
}

Status GradientBuckets::Retire(size_t keep) {
  Status first;
  while (!in_flight_.empty()) {
    InFlight& oldest = in_flight_.front();
    Status copied;
    if (in_flight_.size() > keep) {
      copied = oldest.copied->Synchronize();
    } else {
      StatusOr<bool> done = oldest.copied->Query();
      if (done.ok() && !*done) break;
      copied = done.status();
    }
    if (copied.ok() && !oldest.landed.empty()) {
      copied = HandOver(oldest.flat_offset, oldest.landed.as<float>(), oldest.size, oldest.name);
    }
    if (first.ok()) first = std::move(copied);
    if (oldest.tensor != 0) Free(oldest.tensor);
    spare_events_.push_back(std::move(oldest.copied));
    in_flight_.pop_front();
  }
  return first;
}

Status GradientBuckets::Reserve(Bucket& bucket, uint64_t capacity) {
  if (bucket.capacity >= capacity) return OkStatus();
  bucket = Bucket();
  const std::string name = fmt::format("gradient bucket {}", created_++);
  // Every byte is written before it is read: nothing to zero.
  ZINF_ASSIGN_OR_RETURN(bucket.send, StoreArray::Create(store_, name, capacity * world_ * 4,
                                                        Tier::kDevice, Access::kOverwrite));
  ZINF_ASSIGN_OR_RETURN(bucket.received,
                        StoreArray::Create(store_, name + " (reduced)", capacity * 4, Tier::kDevice,
                                           Access::kOverwrite));
  if (!host_addressable_) {
    ZINF_ASSIGN_OR_RETURN(bucket.landed, StoreArray::Create(store_, name + " (host)", capacity * 4,
                                                            Tier::kHost, Access::kOverwrite));
  }
  bucket.capacity = capacity;
  return OkStatus();
}

Status GradientBuckets::CopyOnDevice(float* dst, const float* src, uint64_t count) {
  if (host_addressable_) {
    std::memcpy(dst, src, count * sizeof(float));
    return OkStatus();
  }
  return copy_->Copy(dst, src, count * sizeof(float), CopyKind::kDeviceToDevice);
}

Status GradientBuckets::HandOver(uint64_t flat_offset, const float* reduced, uint64_t size,
                                 const std::string& name) {
  if (!sink_error_.ok()) return sink_error_;
  Status sunk = sink_(flat_offset, reduced, size);
  if (!sunk.ok())
    sink_error_ = std::move(sunk).WithContext(fmt::format("the gradient of '{}'", name));
  return sink_error_;
}

Status GradientBuckets::Add(const float* grad, uint64_t shard_size, uint64_t flat_offset,
                            const std::string& name, Event* ready, TensorId tensor) {
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
  if (world_ == 1) {  // nothing to reduce: the gradient comes down, then goes to the sink
    InFlight entry{.tensor = tensor, .flat_offset = flat_offset, .size = shard_size, .name = name};
    ZINF_ASSIGN_OR_RETURN(
        entry.landed, StoreArray::Scratch(store_, name + " (gradient)", shard_size * 4, Tier::kHost,
                                          Access::kOverwrite));
    if (ready != nullptr) ZINF_RETURN_IF_ERROR(down_->Wait(*ready));
    ZINF_RETURN_IF_ERROR(down_->Copy(entry.landed.data(), grad, shard_size * sizeof(float),
                                     CopyKind::kDeviceToHost));
    ZINF_RETURN_IF_ERROR(RetireAfter(*down_, std::move(entry)));
    return tensor != 0 ? OkStatus() : Retire(0);  // the caller's `grad` may go on return
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
  float* send = bucket->send.as<float>();
  for (int r = 0; r < world_; ++r) {
    ZINF_RETURN_IF_ERROR(CopyOnDevice(send + r * bucket->capacity + bucket->used,
                                      grad + r * shard_size, shard_size));
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
  bucket.work = comm_->ReduceScatterAsync(send, bucket.received.data(), bucket.used,
                                          ElementType::kFp32, ReduceOp::kSum);
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
  const float* reduced = nullptr;
  if (host_addressable_) {
    reduced = bucket.received.as<float>();
  } else {  // only this rank's slice crosses the link
    ZINF_RETURN_IF_ERROR(down_->Copy(bucket.landed.data(), bucket.received.data(),
                                     bucket.used * sizeof(float), CopyKind::kDeviceToHost));
    ZINF_RETURN_IF_ERROR(down_->Synchronize());
    reduced = bucket.landed.as<float>();
  }
  Status sunk;
  for (const Piece& piece : bucket.pieces) {
    sunk = HandOver(piece.flat_offset, reduced + piece.at, piece.size, piece.name);
    if (!sunk.ok()) break;
  }
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
