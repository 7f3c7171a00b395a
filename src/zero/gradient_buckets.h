// GradientBuckets: reduce-scatters gradients in buckets of reduce_bucket_size elements, each
// while backward goes on, and adds each rank's reduced shard into its fp32 accumulators.
//
// Note [Gradient buckets]
// Reducing one parameter at a time costs a collective per parameter and leaves backward
// waiting for each. Instead, Add copies a parameter's full gradient into a bucket laid out
// rank-major (rank r's slices of every parameter in the bucket side by side, as
// reduce-scatter hands out contiguous slices), and when the bucket is full, reduce-scatters
// it asynchronously on the communicator's thread while the caller fills the other bucket.
// A bucket's reduced slices are added into the accumulators when its buffers are needed
// again or at Finish, in the order the parameters were added: every accumulator element
// receives the same additions in the same order as reducing one parameter at a time would
// give, so the bucket size never changes the result (the collective reduces each element
// over the same ranks whatever the bucket holds).
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
  // `bucket_elements`: elements of gradient (over all ranks) per bucket, at least one per
  // rank. `accumulators` is this rank's flat fp32 shard of gradient sums. Both pointees must
  // outlive this object.
  GradientBuckets(Communicator* comm, uint64_t bucket_elements, float* accumulators);
  // Waits for collectives still in flight (their buffers are ours).
  ~GradientBuckets();
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  // Queues one parameter's full gradient (world * shard_size elements, padded); its reduced
  // shard will be added into accumulators[flat_offset, flat_offset + shard_size). `grad` is
  // copied: the caller may free it on return. May start a reduction or wait for an earlier
  // one. `name` names the parameter in errors.
  Status Add(const float* grad, uint64_t shard_size, uint64_t flat_offset, const std::string& name);
  // Reduces what is queued and waits until every added gradient is in the accumulators.
  Status Finish();
  // Called (on the thread that drives this object) with a parameter's flat_offset each time
  // its reduced shard has been added into the accumulators.
  void OnAdded(std::function<void(uint64_t flat_offset)> added) { added_ = std::move(added); }
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
  // Waits for the bucket's reduction and adds it into the accumulators; leaves it empty.
  Status Complete(Bucket& bucket);
  Status Reserve(Bucket& bucket, uint64_t capacity);

  Communicator* const comm_;
  const int world_;
  const uint64_t slice_elements_;  // bucket_elements / world
  float* const accumulators_;
  std::array<Bucket, 2> buckets_;
  int filling_ = 0;  // the bucket Add copies into; the other may be in flight
  uint64_t reductions_ = 0;
  std::function<void(uint64_t)> added_;
};

}  // namespace zinf

#endif  // ZINF_ZERO_GRADIENT_BUCKETS_H_
