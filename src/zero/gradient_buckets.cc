// See Note [Gradient buckets] in gradient_buckets.h.
#include "zero/gradient_buckets.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstring>

#include "comm/communicator.h"

namespace zinf {

GradientBuckets::GradientBuckets(Communicator* comm, uint64_t bucket_elements, Sink sink)
    : comm_(comm),
      world_(comm->world_size()),
      slice_elements_(std::max<uint64_t>(bucket_elements / comm->world_size(), 1)),
      sink_(std::move(sink)) {}

GradientBuckets::~GradientBuckets() {
  for (Bucket& bucket : buckets_) {
    if (bucket.work != nullptr) (void)bucket.work->Wait();
  }
}

Status GradientBuckets::Reserve(Bucket& bucket, uint64_t capacity) {
  if (bucket.capacity >= capacity) return OkStatus();
  bucket.send = HostBuffer();
  bucket.received = HostBuffer();
  ZINF_ASSIGN_OR_RETURN(bucket.send, HostBuffer::Allocate(capacity * world_ * sizeof(float)));
  ZINF_ASSIGN_OR_RETURN(bucket.received, HostBuffer::Allocate(capacity * sizeof(float)));
  bucket.capacity = capacity;
  return OkStatus();
}

Status GradientBuckets::Add(const float* grad, uint64_t shard_size, uint64_t flat_offset,
                            const std::string& name) {
  if (shard_size == 0) return OkStatus();
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
  float* send = bucket->send.as<float>();
  for (int r = 0; r < world_; ++r) {
    std::memcpy(send + r * bucket->capacity + bucket->used, grad + r * shard_size,
                shard_size * sizeof(float));
  }
  bucket->pieces.push_back({flat_offset, shard_size, bucket->used, name});
  bucket->used += shard_size;
  return OkStatus();
}

Status GradientBuckets::Start(Bucket& bucket) {
  // Reduce-scatter wants rank r's slice at r * used: close the gaps of a partly filled bucket.
  // Slices move towards the front in rank order, so none overwrites one not yet moved.
  float* send = bucket.send.as<float>();
  if (bucket.used < bucket.capacity) {
    for (int r = 1; r < world_; ++r) {
      std::memmove(send + r * bucket.used, send + r * bucket.capacity, bucket.used * sizeof(float));
    }
  }
  bucket.work = comm_->ReduceScatterAsync(send, bucket.received.data(), bucket.used,
                                          ElementType::kFp32, ReduceOp::kSum);
  ++reductions_;
  return OkStatus();
}

Status GradientBuckets::Complete(Bucket& bucket) {
  if (bucket.work == nullptr) return OkStatus();
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
  const float* received = bucket.received.as<float>();
  Status sunk;
  for (const Piece& piece : bucket.pieces) {
    sunk = sink_(piece.flat_offset, received + piece.at, piece.size);
    if (!sunk.ok()) {
      sunk = std::move(sunk).WithContext(fmt::format("the gradient of '{}'", piece.name));
      break;
    }
  }
  bucket.pieces.clear();
  bucket.used = 0;
  return sunk;
}

Status GradientBuckets::Finish() {
  Bucket& filling = buckets_[filling_];
  if (filling.used > 0) ZINF_RETURN_IF_ERROR(Start(filling));
  // The other bucket was started first: its additions come first.
  ZINF_RETURN_IF_ERROR(Complete(buckets_[filling_ ^ 1]));
  return Complete(filling);
}

}  // namespace zinf
