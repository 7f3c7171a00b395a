// GradientBuckets: reduce-scatters gradients in buckets of reduce_bucket_size elements, each
// while backward goes on, and hands each rank's reduced shard to the accumulators.
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
// Where the bytes are. Gradients arrive in device memory, and the buckets are tensors of the
// tiered store's device tier: the gradient is packed into the bucket on the device (a copy
// on a stream), the collective reduces device memory (NCCL on a GPU, Gloo on the host
// device) into a scratch tensor of the reduced slice's size, and only that slice goes down to
// the host tier, moved by the store like any other tensor (metered on its device-to-host link)
// before the sink reads it. The collective waits for the bucket's packing on the
// communicator's thread (the event the packing stream records), so the caller waits once per
// bucket, for its reduced slice coming down. With one rank there is nothing to reduce: the bucket
// itself comes down, in one copy after the event the packing stream records; that copy is the one
// wait for the bucket, made when its buffers are needed again or at Finish: one wait per backward
// where a bucket holds the model (the copy is the store's, CopyDownAsync: metered on its link like
// every move). One rank's bucket is filled from its end: backward hands the parameters over in
// reverse, so its pieces then lie in the flat shard's order, side by side, and where the sink's
// accumulators hold nothing of the batch yet (the first micro-batch) the copy lands straight in
// them (GradientSink::LandingFor): no host pass. Else it lands in a host-tier array of the bucket's
// own (pinned, so the copy is asynchronous), from which the sink adds each piece. Every rank's
// slice of a bucket fills from its end too, so a reduced slice in flat order lands in the
// accumulators the same way: the collective writes them where the host may address device memory,
// else the store copies the reduced slice down into them (CopyDownAsync). The buckets are finished
// only at the step, so two micro-batches' gradients of the same parameters may be in flight at
// once: a bucket is offered no landing while the other still holds any of its parameters (the sink
// learns of those only when that bucket completes, and they must come first). Where device memory
// is host memory the host may touch (the host device without a modelled link), the packing is a
// memcpy and the sink reads the slice, or with one rank the gradient, where it is: no copy beyond
// what the collective needs. Elsewhere the packing copies run while backward goes on, and each
// gradient is freed once its copy has run, found by asking its event, without waiting, at the next
// Add; Add waits for the oldest only while more than a bucket's bytes of gradients are in flight.
//
// Memory: two buckets of `bucket_elements` (grown to hold the largest parameter) in the
// device tier, allocated when first used, with several ranks this rank's slice of each, and
// that slice again in the host tier while the sink reads it when the device is not
// host-addressable (with one rank: each bucket's host array); and up to a bucket's bytes of
// gradients (or one gradient, if larger) whose packing is in flight.
//
// Thread-safety: one thread drives it (the engine's).
#ifndef ZINF_ZERO_GRADIENT_BUCKETS_H_
#define ZINF_ZERO_GRADIENT_BUCKETS_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "zero/store_array.h"
#include "zinf/device.h"
#include "zinf/status.h"
#include "zinf/tiered_store.h"

namespace zinf {

class Communicator;
class CommWork;

// Where the buckets hand each reduced gradient: the accumulators' owner (the engine's
// OptimizerStep).
class GradientSink {
 public:
  virtual ~GradientSink() = default;
  // This rank's reduced shard of one parameter: `size` elements in host memory that belong at
  // `flat_offset` of the flat shard, to add into its accumulators. An error stops the
  // reduction: no later gradient comes (those already in flight are dropped), and every later
  // call of the buckets returns that error.
  virtual Status Add(uint64_t flat_offset, const float* reduced, uint64_t size) = 0;
  // Where the reduced gradients of the whole parameters covering the flat elements
  // [first, first + count) may be written directly, in host memory a device's copy may
  // write: their accumulators, when none holds anything of the batch yet (so the gradients
  // would be copied there, not added). Null where they may not; then Add takes them.
  virtual float* LandingFor(uint64_t first, uint64_t count) = 0;
  // The gradients of [first, first + count) were written where LandingFor said.
  virtual Status Landed(uint64_t first, uint64_t count) = 0;
};

class GradientBuckets {
 public:
  // `bucket_elements`: elements of gradient (over all ranks) per bucket, at least one per
  // rank. `store` (with its device tier on `device`), `comm` (whose collectives take that
  // device's memory) and `sink` must outlive this object.
  static StatusOr<std::unique_ptr<GradientBuckets>> Create(TieredStore* store, Device* device,
                                                           Communicator* comm,
                                                           uint64_t bucket_elements,
                                                           GradientSink* sink);
  // Waits for collectives and copies still in flight (their buffers are ours).
  ~GradientBuckets();
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  // Queues one parameter's full gradient (world * shard_size elements, padded, in device
  // memory); its reduced shard will go to the sink at `flat_offset`. `grad` is read after
  // `ready` (when given: the event backward's stream recorded). `grad` is the device-tier
  // tensor `tensor` of the store, acquired once, which the buckets now own: they release and
  // free it once its copy has run, without waiting for that (copies run on the buckets'
  // stream while the caller goes on; a bucket's bytes are in flight at most). With `tensor`
  // 0 the caller keeps `grad`, which is copied before the call returns. May start a
  // reduction (with one rank, a bucket's copy down) or wait for an earlier one. `name` names the
  // parameter in errors. `padding`: the last elements of `grad` past the parameter's own (world *
  // shard_size - numel), which are never read: the bucket gets zeros there, so a trainer that
  // overwrote only the parameter's elements needs no zeroed buffer (with one rank there is none).
  Status Add(const float* grad, uint64_t shard_size, uint64_t flat_offset, const std::string& name,
             Event* ready = nullptr, TensorId tensor = 0, uint64_t padding = 0);
  // Reduces what is queued and waits until every added gradient has gone to the sink.
  Status Finish();
  // Elements of one rank's slice of a bucket at most: a bucket of `bucket_elements` over
  // `world` ranks, grown to hold the largest parameter's shard.
  static uint64_t SliceCapacity(uint64_t bucket_elements, int world, uint64_t largest_shard) {
    return std::max<uint64_t>(std::max<uint64_t>(bucket_elements / world, 1), largest_shard);
  }
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
    StoreArray send;  // device: world * capacity elements, rank r's slice at r * capacity
    uint64_t capacity = 0;
    uint64_t used = 0;  // elements per rank slice
    std::vector<Piece> pieces;
    // From the start of its reduction until its slice has gone to the sink: the reduced
    // slice, a device-tier scratch tensor of `used` elements, acquired there at `reduced`.
    TensorId received = 0;
    float* reduced = nullptr;
    std::shared_ptr<CommWork> work;  // the reduction in flight
    // One rank, where the device is not host-addressable: the bucket's copy in the host tier
    // (`capacity` elements), the event recorded after the copy down, and the flat elements it
    // covers when it came down into the sink's accumulators instead (`direct`).
    StoreArray landing;
    // Recorded after the bucket's packing, where the device is not host-addressable: what the
    // copy down (one rank) or the collective (several) waits for.
    std::unique_ptr<Event> packed;
    std::shared_future<Status> landed;  // the store's copy down, after `packed`
    // Where the sink let the bucket's reduced gradients land directly (its accumulators of
    // the flat elements from `flat_first`), or null (AskForLanding).
    float* direct = nullptr;
    uint64_t flat_first = 0;
  };

  // A gradient whose packing copy is in flight: freed once `copied` has completed.
  struct InFlight {
    std::unique_ptr<Event> copied;
    TensorId tensor = 0;
    uint64_t bytes = 0;
  };

  GradientBuckets(TieredStore* store, Device* device, bool host_addressable, Communicator* comm,
                  uint64_t bucket_elements, GradientSink* sink);
  // Frees the gradients whose copies have run, waiting for the oldest while more than
  // `keep_bytes` of them are in flight; the first error.
  Status Retire(uint64_t keep_bytes);
  // An event to record on a stream: a spare one, or a new one.
  StatusOr<std::unique_ptr<Event>> TakeEvent();
  // `tensor` (`bytes`) is freed once the work now on `stream` has run.
  Status RetireAfter(Stream& stream, TensorId tensor, uint64_t bytes);
  // One rank: waits for the bucket's copy down (the one wait per bucket).
  Status WaitLanded(Bucket& bucket);
  // Whether the bucket's pieces lie side by side in the flat shard's order.
  static bool InFlatOrder(const Bucket& bucket);
  // Asks the sink where the bucket, about to be reduced or copied down, may land: `direct`.
  void AskForLanding(Bucket& bucket);
  // Tells the sink that the bucket landed where it said; its error stops the reduction.
  Status Landed(Bucket& bucket);
  // Releases and frees a gradient the buckets own.
  void Free(TensorId tensor);
  Status Start(Bucket& bucket);
  // Waits for the bucket's reduction (one rank: its copy down) and hands it to the sink, or
  // tells the sink it landed; leaves it empty, whatever failed.
  Status Complete(Bucket& bucket);
  // Several ranks: waits for the bucket's reduction, and where it lands in the accumulators
  // on a device the host cannot address, for the store's copy of it into them.
  Status WaitReduced(Bucket& bucket);
  // Hands each piece of a completed bucket that did not land to the sink.
  Status HandOverPieces(Bucket& bucket);
  // Releases and frees the bucket's reduced slice.
  void DropReduced(Bucket& bucket);
  Status Reserve(Bucket& bucket, uint64_t capacity);
  // Copies device memory to device memory, in order on copy_ (a memcpy now when the device is
  // host-addressable).
  Status CopyOnDevice(float* dst, const float* src, uint64_t count);
  // Zeroes device memory, in order on copy_ (a memset now when the device is host-addressable).
  Status ZeroOnDevice(float* dst, uint64_t count);

  TieredStore* const store_;
  Device* const device_;
  const bool host_addressable_;
  Communicator* const comm_;
  const int world_;
  const uint64_t slice_elements_;  // bucket_elements / world
  // The sink, until it fails: from then on its error, with no call (the reduction stopped).
  Status HandOver(uint64_t flat_offset, const float* reduced, uint64_t size,
                  const std::string& name);
  GradientSink* const sink_;
  Status sink_error_;  // the sink's first error
  // Packing gradients into buckets, and with one rank the buckets' copies down.
  std::unique_ptr<Stream> copy_;
  std::array<Bucket, 2> buckets_;
  std::deque<InFlight> in_flight_;
  uint64_t in_flight_bytes_ = 0;
  std::vector<std::unique_ptr<Event>> spare_events_;
  int filling_ = 0;  // the bucket Add copies into; the other may be in flight
  int created_ = 0;  // bucket tensors created, for their names
  uint64_t reductions_ = 0;
};

}  // namespace zinf

#endif  // ZINF_ZERO_GRADIENT_BUCKETS_H_
