// ParamTier: the ZeRO engine's parameters on the tiered store — this rank's shard of every
// parameter in the compute precision (the parameter tier), the gathered full parameters in
// the device tier, and the fetch, prefetch and release that move them.
//
// Note [Parameter tier]
// Each parameter's shard is one tensor of the TieredStore, whose home is the tier the config
// puts parameters in: the device (offload_param none), pinned host memory (cpu) or NVMe
// (nvme). It holds the compute precision (bf16/fp16 when enabled, else fp32), rounded from the
// fp32 master at every update (Note [Compute precision] in engine.cc). Fetch makes the shard
// resident in the device tier (the store reads NVMe through its staging buffers and copies
// host to device over its copy stream), all-gathers it there into a device tensor holding the
// full parameter, and hands out device pointers; Release frees that tensor. With one rank the
// shard is the whole parameter and is handed out itself. Cached device copies of shards stay
// until the device budget needs their room; eviction follows the traced order (SetNextUse).
// Writes overwrite the shard in its home tier (through a host copy written back
// asynchronously for NVMe), which makes every cached copy stale. So every byte the engine
// moves between tiers is moved by the store, under its budgets.
//
// Note [Prefetch]
// The first step records the order in which modules are fetched. Later steps follow it: each
// Fetch asks the store to bring the shards of the modules after it to the device tier, up to
// stage3_prefetch_bucket_size elements (at least the next module) and as long as the
// parameters gathered or being brought in stay within stage3_max_live_parameters elements, so
// the disk and the link work while the current module computes. With several ranks each Fetch
// also starts the all-gathers of the next module, which run on the communicator's thread
// meanwhile; every rank decides alike from the same order and sizes, so the collectives stay
// in step. A loop that never steps (evaluation, inference) has its order found as the period
// of its fetches, once the recorded sequence is one period repeated twice (no gradient asked
// for meanwhile), and followed cyclically. A fetch that leaves the recorded order starts the
// recording again (with a warning, once); shards are then brought in and gathered when fetched,
// which is always correct, only slower.
//
// Note [Fetch and release events]
// The device's compute runs asynchronously to the thread that drives the engine (a GPU's
// stream), so handing out memory and taking it back are ordered by events, not by waiting.
// Fetch enqueues the widening of 16-bit parameters on this tier's stream of the compute
// device and records the module's `ready` event there; the trainer's compute stream waits on
// it. On the host device the caller's thread is the compute stream, so Fetch waits for the
// event itself before it returns. Release with the trainer's `done` event makes a stream of
// its own (not the widening stream, whose next fetch must not wait for this module's compute)
// wait on it and on the widening so far, and records an event there (capturing `done` as it
// is now, whatever the trainer records later); the module's copies are dropped, and their
// memory reused, only once that has completed: checked at every Fetch, waited for when more
// than two modules are pending or before the copies are replaced. A module fetched again
// before its copies were dropped keeps them. Without `done` (host trainers) the copies go at
// once. With several ranks a fetch that keeps its copies starts no all-gather where one that
// finds them dropped does, so the ranks must drop alike: there the check is not made, and the
// copies go only when waited for (a count every rank shares), never when an event happens to
// have completed on one rank first (the collectives would go out of step).
//
// Thread-safety: one thread drives it (the engine's).
#ifndef ZINF_ZERO_PARAM_TIER_H_
#define ZINF_ZERO_PARAM_TIER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <vector>

#include "offload/param_writer.h"
#include "zero/partition.h"
#include "zero/store_array.h"
#include "zinf/cpu_optimizer.h"
#include "zinf/device.h"
#include "zinf/engine.h"
#include "zinf/status.h"
#include "zinf/tiered_store.h"

namespace zinf {

class Communicator;
class CommWork;

struct ParamTierOptions {
  ElementType param_type = ElementType::kFp32;  // the compute precision
  Tier shard_home = Tier::kDevice;
  // Whether the host may write the device tier's memory (Device::host_addressable):
  // else writes of device-homed shards go through a host copy, as NVMe ones do.
  bool device_host_addressable = true;
  // Whether Fetch hands out fp32 copies of 16-bit parameters: for trainers computing in fp32
  // on the host device. A GPU computes in the compute precision; the copies would only take
  // its memory.
  bool fp32_view = true;
  uint64_t prefetch_bucket_elements = 0;  // stage3_prefetch_bucket_size
  uint64_t max_live_elements = 0;         // stage3_max_live_parameters
};

// What a fetch or a step adds to the engine's StepSummary.
struct ParamTierCounters {
  uint64_t bytes_gathered = 0;
  uint64_t collectives = 0;  // all-gathers started
  uint64_t peak_live_parameters = 0;
  double seconds_gather = 0;
};

// Shards written in the host tier and waiting to go home to NVMe, sent as one batch (Note
// [Batched write-backs] in offload/tiered_store.cc), and the batches in flight.
class WriteBacks {
 public:
  // Whether the host copies stay once written (TieredStore::WriteBackAsync), for a reader
  // that comes soon; else they are evicted (the default). Any thread, while another writes.
  void set_keep(bool keep) { keep_ = keep; }
  void Add(TensorId shard, uint64_t bytes) {
    unsent_.push_back(shard);
    unsent_bytes_ += bytes;
  }
  uint64_t unsent_bytes() const { return unsent_bytes_; }
  // Starts the write-backs of the shards added since the last call, as one batch.
  void Send(TieredStore& store);
  // Sends the rest and waits for every batch; the first error.
  Status Wait(TieredStore& store);

 private:
  std::atomic<bool> keep_{false};
  std::vector<TensorId> unsent_;
  uint64_t unsent_bytes_ = 0;
  std::vector<std::shared_future<Status>> sent_;
};

class ParamTier {
 public:
  // `store`, `comm`, `params` and `modules` must outlive this object; `params` is laid out.
  ParamTier(TieredStore* store, Communicator* comm, const std::vector<Param>* params,
            std::vector<Module>* modules, const ParamTierOptions& options);
  // Waits for gathers in flight, unpins and frees every tensor (best effort).
  ~ParamTier();
  ParamTier(const ParamTier&) = delete;
  ParamTier& operator=(const ParamTier&) = delete;

  // Creates the shard tensors (reading as zeros until written), and the stream and events
  // of `device`, the store's device tier's, that the gathers use; it must outlive this object.
  Status Create(Device* device);

  // Gathers the module's parameters into the device tier: `out` gets one tensor each, in the
  // compute precision, and `fp32` (when not null, with options.fp32_view) the same values
  // widened to fp32 in device memory (the same pointers at fp32). The widening runs on the device,
  // on this tier's stream; `ready` (when not null) gets the event where that work completes (Note
  // [Fetch and release events]). Records or follows the fetch order (Note [Prefetch]).
  Status Fetch(int module, std::vector<ParamTensor>* out, std::vector<float*>* fp32,
               Event** ready = nullptr);
  // Frees the gathered copies of the module's non-persistent parameters: now, or with `done`
  // (an event of the trainer's compute stream) once it has completed.
  Status Release(int module, Event* done = nullptr);
  // Regathers every persistent parameter (stages 1 and 2 keep the model gathered), as few
  // collectives as stage3_prefetch_bucket_size allows (Note [Coalesced gathers]).
  Status GatherPersistent();
  // Elements of the non-persistent parameters gathered (`fetching` counted as gathered) or
  // being brought in: what stage3_max_live_parameters bounds.
  uint64_t LiveElements(int fetching) const;
  // Ends a batch (after the step has written the tier): the first one's fetches are the
  // recorded order; prefetching follows it from the next (when there is anything to prefetch),
  // starting with the next batch's first modules now.
  void EndBatch();
  // Backward has begun (a gradient was asked for): this batch's order ends at its step, not
  // at a repetition (Note [Prefetch]).
  void NoteBackward();
  // The fetch order recorded (empty before the first batch ends, or while recording again).
  const std::vector<int>& fetch_order() const {
    static const std::vector<int> kNone;
    return recording_ ? kNone : fetch_order_;
  }
  // A step still writing the tier as the forward fetches (Note [Step in the next forward's
  // order] in step_beside_forward.h).
  class StepWrites {
   public:
    virtual ~StepWrites() = default;
    // Whether module `module`'s shards hold their new values.
    virtual bool Written(int module) = 0;
  };
  // While `step` is still writing the tier (not owned; null when the tier is written),
  // read-ahead stops at the first module it has not written, and no gather starts ahead of its
  // fetch (the ranks' steps progress apart, and every rank must start the same collectives).
  // Meanwhile a fetch drops the host copies the step kept for it once it has taken them.
  void SetStepWrites(StepWrites* step) { step_writes_ = step; }

  // Overwrites parameter `p`'s shard: BeginWrite returns host-addressable memory for its
  // TierBytes, EndWrite stores it (starting the write-back when the home is NVMe). Drops
  // p's gathered copies first. WriteFp32 converts fp32 values in between.
  StatusOr<void*> BeginWrite(const Param& p);
  Status EndWrite(const Param& p);
  Status WriteFp32(const Param& p, const float* values);
  // Sends home what EndWrite stored and waits for every write-back; the first error.
  Status FinishWrites();
  class ChunkWriter;

  // Copies `p`'s shard (TierBytes) into `out`; ReadFp32 widens it to `p.shard_size` floats.
  Status ReadShard(const Param& p, void* out);
  Status ReadFp32(const Param& p, float* out);
  // Drops every gathered copy and read-ahead (before the values they hold are replaced).
  void DropAll();

  uint64_t TierBytes(const Param& p) const {
    return p.shard_size * ElementSize(options_.param_type);
  }
  ParamTierCounters TakeCounters();
  // Parameter `param`'s shard in the store (for tests and tools).
  TensorId shard(int param) const;

 private:
  struct State;
  struct Coalesced;
  // A module released with an event: its copies are dropped once `done` has completed.
  struct PendingRelease {
    int module;
    std::unique_ptr<Event> done;  // recorded on stream_ after the trainer's event
  };
  bool NeedsGather(int param) const;
  // Pins the shard and the destination of one parameter's gather (counted as gathered).
  Status PrepareGather(int param);
  Status StartGather(int param);
  // Starts the gathers of those of `params` not yet gathered, with one collective where there
  // are several (Note [Coalesced gathers]).
  Status StartGathers(const std::vector<int>& params);
  // The shards homed in host memory or on NVMe that the gathers of `todo` read and no
  // read-ahead brings in, moved to device memory as one batch (one wait, one copy where they lie
  // together: Note [Batched write-backs] in offload/tiered_store.cc) before each is pinned.
  void BringShards(const std::vector<int>& todo);
  // Copies a coalesced gather's pieces into its parameters' gathered tensors; frees its buffers.
  Status Unpack(Coalesced& c);
  // Device memory to device memory, in order on stream_ (a memcpy where the host may touch it).
  Status CopyOnDevice(void* dst, const void* src, size_t bytes);
  // Drops the pending releases whose events have completed, and waits for the oldest while
  // more than `keep` are pending.
  void ReapReleases(size_t keep);
  Status Gather(int param);
  void Drop(int param);
  void TraceFetch(int module);
  void Record(int module);
  void HintNextUse(int module);
  // Brings the shards of the modules from fetch_cursor_ on to the device tier, within the
  // window and the live bound (`live`: what is live now).
  void ReadAhead(uint64_t live);
  void FinishRecording(bool cyclic);
  void PrefetchGathers();
  Tier WriteTier() const;

  // Drops the host copies of the module's shards (clean ones: no write), once its fetch has
  // taken them: a step beside the forward keeps what it writes only until then.
  void DropHostCopies(int module);

  TieredStore* const store_;
  Communicator* const comm_;
  const std::vector<Param>* const params_;
  std::vector<Module>* const modules_;
  const ParamTierOptions options_;
  std::vector<State> state_;
  Device* device_ = nullptr;                   // the store's device tier's
  std::unique_ptr<Stream> stream_;             // widening on the device
  std::unique_ptr<Stream> release_stream_;     // where pending releases wait for the trainer
  std::vector<std::unique_ptr<Event>> ready_;  // by module: its last Fetch's work done
  std::deque<PendingRelease> pending_;
  std::vector<std::unique_ptr<Event>> spare_events_;
  WriteBacks write_backs_;
  std::vector<int> fetch_order_;  // recorded during the first batch or pass
  bool recording_ = true;
  bool prefetching_ = false;
  bool cyclic_ = false;         // a forward-only loop's order: it repeats without steps
  bool backward_seen_ = false;  // since recording began
  size_t period_ = 0;           // while recording: the repetition being checked, 0 for none
  bool warned_ = false;
  size_t fetch_cursor_ = 0;  // position in fetch_order_ this batch
  StepWrites* step_writes_ = nullptr;
  ParamTierCounters counters_;
};

// Writes the parameter tier from the optimizer step's chunks of the flat shard (fp32 values of
// its elements [c.offset, c.offset + c.count)), as they are updated: the step's ParamWriter
// (offload/param_writer.h). Chunks in any order, a chunk again (a speculative step redone),
// from one thread at a time, which may be another than the one driving the ParamTier while
// backward goes on: it touches only the store (thread-safe) and its own state. A parameter's
// write ends with its last element. The persistent parameters stay pinned in the device tier
// for the whole batch (their gathered copies are the shards with one rank), so their values
// are kept here and written by Finish, on the driving thread after ParamTier::DropAll.
class ParamTier::ChunkWriter final : public ParamWriter {
 public:
  // `in_place`: the tier is fp32 and is the optimizer's master: the update reads and writes
  // the parameters where they are (ParamHandoff::kInPlace, Note [Parameters kept by the
  // caller] in offload/pipelined_optimizer.h), through Targets, and the writer only ends their
  // writes. Else the handoff is kCopy for a 16-bit tier, kNewValues for an fp32 one.
  explicit ChunkWriter(ParamTier* tier, bool in_place = false);
  ~ChunkWriter() override;
  ChunkWriter(const ChunkWriter&) = delete;
  ChunkWriter& operator=(const ChunkWriter&) = delete;

  // What the step hands this writer, and in which type (kCopy).
  ParamHandoff handoff() const;
  ElementType param_type() const;

  // Starts a step's writes: every parameter unwritten.
  void Begin();
  // Whether the written shards' host copies stay once written back, for a forward that reads
  // them soon (Note [Step in the next forward's order] in step_beside_forward.h); else they
  // are evicted. Also while a
  // step writes: from its next batch of write-backs on.
  void KeepWrittenCopies(bool keep) { write_backs_.set_keep(keep); }
  // Drops the writes so far, to write every parameter touched again from the start (a
  // speculative step dropped): what is open is released as it is, without a write-back,
  // since all of it will be overwritten; then as Begin. The store's host tier must not stay
  // held by a parameter half written meanwhile.
  Status Restart() override;
  // Writes the chunk's new parameters into the tier (where Targets did not already).
  Status Updated(const ChunkView& c) override;
  // Where the update of chunk `c` may write the compute-precision copy of its new parameters
  // straight into the tier (ParamHandoff::kCopy), opening the parameters it covers; Updated
  // then finds them written (ChunkView::copy_written). Persistent parameters and padding get
  // no target. Only for a 16-bit compute precision (the kernels write bf16 or fp16 copies).
  // In place, the targets are the fp32 parameters themselves, persistent ones included (their
  // next values, loaded from the tier at the step's first touch).
  StatusOr<std::vector<CopyTarget>> Targets(const ChunkView& c) override;
  // In place: starts bringing the parameters of a chunk to be stepped to host memory; fills
  // a visited chunk's parameters from the tier (Read); stores them there (Store), leaving
  // open (as a step's writes do) each parameter that goes on past the chunk, until a later
  // chunk ends it or Finish. Store wants the gathered copies dropped (ParamTier::DropAll) and
  // no step writing (after Restart or Finish).
  void Prefetch(const ChunkInfo& c) override;
  Status Read(const ChunkView& c) override;
  Status Store(const ChunkView& c) override;
  // Writes those of `params` that are persistent and whose chunks are all written, on the
  // driving thread (as Finish does, ahead of it: their module is about to be fetched).
  Status WritePersistent(const std::vector<int>& params);
  // Ends the writes left open (after a failure), writes the persistent parameters and waits
  // for every write-back; the first error.
  Status Finish();

 private:
  struct Open {
    void* data = nullptr;
    uint64_t remaining = 0;  // elements not yet written in this step
    bool written = false;    // opened before in this step: a reopening keeps the bytes
  };
  // Parameter `pi`'s tier memory, acquired for writing at its first opening in a step.
  StatusOr<void*> OpenParam(size_t pi);
  // Where the write tier is not the shards' home, memory for the host copies that chunk `c`
  // is about to write and no earlier chunk has opened, as one run: written back, or read by
  // the next forward, they then go up as one copy (Note [Runs of blocks] in
  // offload/memory_pool.h).
  void PlaceChunk(const ChunkView& c);
  // A persistent parameter's next values, loaded from the tier at the first opening in a step
  // when in place.
  StatusOr<float*> OpenPersistent(size_t pi);
  // The parameters that overlap chunk [offset, offset + count), each with its overlap.
  template <typename F>
  Status ForEachOverlap(uint64_t offset, uint64_t count, F&& f);

  ParamTier* const tier_;
  const bool in_place_;
  std::vector<Open> open_;
  std::vector<StoreArray> persistent_;  // by parameter, host tier; empty for the others
  WriteBacks write_backs_;  // its own: Write may run on another thread than the ParamTier's
};

}  // namespace zinf

#endif  // ZINF_ZERO_PARAM_TIER_H_
