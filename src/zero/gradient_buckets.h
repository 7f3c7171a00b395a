// GradientBuckets: reduce-scatters gradients in buckets of reduce_bucket_size elements, each
// while backward goes on, and adds each rank's reduced shard into its fp32 accumulators.
//
// Note [Gradient buckets]
// Reducing one parameter at a time costs a collective per parameter and leaves backward
// waiting for each. Instead, Add copies a parameter's full gradient into a bucket laid out
// rank-major (rank r's slices of every parameter in the bucket side by side, as
// reduce-scatter hands out contiguous slices), and when the bucket is full, reduce-scatters
// it asynchronously on the communicator's thread while the caller fills the other bucket.
// A bucket's reduced slices go to the sink (which adds them into the accumulators, in host
// memory or on NVMe) when its buffers are needed again or at Finish, in the order the
// parameters were added: every accumulator element receives the same additions in the same
// order as reducing one parameter at a time would give, so the bucket size never changes the
// result (the collective reduces each element over the same ranks whatever the bucket holds).
//
// Memory: two buckets of `bucket_elements` (grown to hold the largest parameter), allocated
// when first used, plus this rank's slice of each.
//
// Thread-safety: one thread drives it (the engine's).
#ifndef ZINF_ZERO_GRADIENT_BUCKETS_H_
#define ZINF_ZERO_GRADIENT_BUCKETS_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "zinf/host_memory.h"
#include "zinf/status.h"

namespace zinf {

class Communicator;
class CommWork;

class GradientBuckets {
 public:
  // Receives this rank's reduced shard of one parameter (`size` elements that belong at
  // `flat_offset` of the flat shard), to add into its accumulators; its error stops the
  // reduction.
  using Sink = std::function<Status(uint64_t flat_offset, const float* reduced, uint64_t size)>;

  // `bucket_elements`: elements of gradient (over all ranks) per bucket, at least one per
  // rank. `comm` must outlive this object.
  GradientBuckets(Communicator* comm, uint64_t bucket_elements, Sink sink);
  // Waits for collectives still in flight (their buffers are ours).
  ~GradientBuckets();
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  // Queues one parameter's full gradient (world * shard_size elements, padded); its reduced
  // shard will go to the sink at `flat_offset`. `grad` is
  // copied: the caller may free it on return. May start a reduction or wait for an earlier
  // one. `name` names the parameter in errors.
  Status Add(const float* grad, uint64_t shard_size, uint64_t flat_offset, const std::string& name);
  // Reduces what is queued and waits until every added gradient has gone to the sink.
  Status Finish();
  // Collectives started so far (each one bucket).
  uint64_t reductions() const { return reductions_; }

 private:
  struct Piece {
    uint64_t flat_offset;  // in the accumulators
    uint64_t size;         // elements per rank
    uint64_t at;           // offset within each rank's slice of the bucket
    std::string name;
  };
  struct Bucket {
    HostBuffer send;      // world * capacity elements, rank r's slice at r * capacity
    HostBuffer received;  // capacity elements: this rank's reduced slice
    uint64_t capacity = 0;
    uint64_t used = 0;  // elements per rank slice
    std::vector<Piece> pieces;
    std::shared_ptr<CommWork> work;  // the reduction in flight
  };

  Status Start(Bucket& bucket);
  // Waits for the bucket's reduction and hands it to the sink; leaves it empty.
  Status Complete(Bucket& bucket);
  Status Reserve(Bucket& bucket, uint64_t capacity);

  Communicator* const comm_;
  const int world_;
  const uint64_t slice_elements_;  // bucket_elements / world
  const Sink sink_;
  std::array<Bucket, 2> buckets_;
  int filling_ = 0;  // the bucket Add copies into; the other may be in flight
  uint64_t reductions_ = 0;
};

}  // namespace zinf

#endif  // ZINF_ZERO_GRADIENT_BUCKETS_H_
