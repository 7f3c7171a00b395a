// PipelinedOptimizer: the optimizer step over shards whose fp32 parameters, optimizer state and
// gradients live on NVMe, in pinned host memory, or split between the two.
//
// Each shard is cut into chunks, each chunk's arrays tensors of a TieredStore: homed on NVMe
// (two tensors: the fp32 parameters with the state arrays, and the gradients; the parameters
// stay out where the caller keeps them, Note [Parameters kept by the caller]) or in the host
// tier (one tensor). Step() streams the chunks through a fixed set of staging buffers (host-tier
// tensors too), moving each NVMe chunk with the store's streams (TieredStore::ReadHomeAsync,
// WriteHomeAsync), so that the store is the one place bytes move between tiers:
//
//     read chunk i+1  ||  CpuOptimizer::Update(chunk i)  ||  write chunk i-1
//
// so that the disk and the CPU are busy at the same time, and the host memory the step uses
// is num_buffers staging buffers whatever the model size (See Note [Pipelined step]). Each
// updated chunk goes to the shard's ParamWriter (offload/param_writer.h), the client that
// keeps its parameters: the update writes their compute-precision (bf16/fp16) copy, or the
// fp32 parameters themselves, straight where the writer says.
//
// Stepping in chunks is bitwise identical to CpuOptimizer::Step over the whole shard in memory
// (the update is element-wise), which the tests check.
//
// Thread-safety: not thread-safe; one thread drives a PipelinedOptimizer. CpuOptimizer groups
// must not be changed while Step() runs.
#ifndef ZINF_OFFLOAD_PIPELINED_OPTIMIZER_H_
#define ZINF_OFFLOAD_PIPELINED_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nvme/io_engine.h"
#include "offload/group_runs.h"
#include "offload/param_writer.h"
#include "zinf/cpu_optimizer.h"
#include "zinf/status.h"
#include "zinf/tiered_store.h"

namespace zinf {

// Note [Pipelined step]
// With K staging buffers the step keeps up to K-1 chunk reads ahead of the update and one
// chunk write behind it: while chunk i is updated, chunks i+1..i+K-2 are being read and chunk
// i-1 written. The read of chunk i+K-1 goes into the buffer of chunk i-1, whose write was
// issued before the update of chunk i started, so on a balanced pipeline the driving thread
// never waits for a write; it waits only when the disk is the bottleneck, and the disk then
// still has the queued reads and the latest write to work on.
// The I/O runs on io_uring (no CPU thread per request), so the optimizer keeps every core.
// Chunks of 1M elements (16 MiB of state and gradients by default) are large enough that the
// per-chunk costs — a wait, the optimizer's thread fork and join — vanish against the
// transfer, and small enough that eight of them keep the disk busy through jitter in 144 MiB
// of staging while a chunk's update runs from cache (bench/RESULTS.md, issue 5: 8M-element
// chunks moved the same bytes per second with 4x the memory and a slower update).
// Host-resident chunks take part in the same rotation: they need no read or write, so their
// update overlaps the I/O of NVMe-resident neighbours (the split given by nvme_ratio is
// interleaved over the chunks for that reason).

// Note [Speculative step]
// A caller that wants the step to start before it knows whether it may (the global gradient
// norm decides clipping and fp16 overflow, and needs every gradient) steps chunks as their
// gradients become final with the scale it expects, speculatively: the new state of each goes
// to a fresh tensor and the old one stays. Once the norm is known the caller keeps the new
// state (ResolveSpeculation(commit)) or drops it, which gives the chunks their old state
// back to step again with the right scale, or not at all for a skipped step. The update is
// element-wise, so the order and grouping of the chunks never changes a bit of the result.
// Only the write target changes (a new store tensor, swapped in for the chunk's state; the old
// one freed or swapped back), so speculation costs no extra I/O, only swap space for the chunks
// in flight (at most the shard's state once more).

struct PipelinedOptimizerOptions {
  // Bytes of host memory for the staging buffers (DeepSpeed: the pinned buffers of
  // offload_optimizer's swapper), taken from the store's host tier. The chunk size shrinks to
  // fit; a budget that cannot hold num_buffers chunks of kMinChunkElements is InvalidArgument
  // naming the minimum.
  uint64_t host_budget_bytes = 2ull << 30;
  // Staging buffers, >= 3: read ahead, update, write behind. More buffers absorb jitter.
  int num_buffers = 8;
  // Elements per chunk, a multiple of kChunkAlignElements. 1M elements = 16 MiB of fp32
  // parameters, two state arrays and fp32 gradients.
  uint64_t chunk_elements = 1ull << 20;
  // Fraction of each shard's chunks whose home is NVMe; the rest live in the store's host
  // tier. DeepSpeed: offload_optimizer.ratio. In [0, 1]; > 0 needs a store with an NVMe tier.
  double nvme_ratio = 1.0;

  static constexpr uint64_t kChunkAlignElements = 2048;  // keeps bf16 regions 4 KiB aligned
  static constexpr uint64_t kMinChunkElements = 64 * 1024;
  // Staging bytes per element of a chunk: fp32 params, two state arrays, fp32 gradients, and 2
  // more, where a 16-bit parameter copy was once staged: the copy now goes straight to the
  // shard's writer, but the engine's tier budgets and `zinf plan` size the buffers with this.
  static constexpr uint64_t kStagingBytesPerElement = 4 + 8 + 4 + 2;
  // And per element of a buffer for the old parameters a speculative step writes aside, for
  // shards whose parameters the caller keeps (one buffer per staging buffer, made with the
  // first such shard).
  static constexpr uint64_t kOldParamBytesPerElement = 4;

  [[nodiscard]] Status Validate() const;
};

// Note [Parameters kept by the caller]
// A caller whose own store tensors already hold a shard's fp32 parameters (the ZeRO engine's
// fp32 parameter tier, when parameters and optimizer are both on NVMe) keeps them there
// instead of in the chunks, so each parameter has one NVMe copy and the step moves 8 bytes of
// chunk state per element each way instead of 12. The chunks then hold the state arrays and
// gradients; the update reads and writes each stretch of parameters where the shard's writer
// says (ParamWriter::Targets, host memory, under ParamHandoff::kInPlace), and the writer's
// Updated finds them there (ChunkView::params_in_place). Visits fill ChunkView::params with
// ParamWriter::Read and store them with ParamWriter::Store. A speculative step writes the
// parameters' old values to a tensor of their own (4 bytes per element, the chunk's old state
// is kept as before), from which a dropped speculation stores them back.

// A shard to step: `count` elements of parameter group `group` of the CpuOptimizer, or of the
// groups `runs` gives (offload/group_runs.h).
struct ShardSpec {
  std::string name;  // appears in errors
  int group = 0;
  // Where parts of the shard step in groups of their own; empty: all of it in `group`. The
  // groups must share one type. Each chunk is updated run by run.
  std::vector<GroupRun> runs;
  size_t count = 0;
  ElementType grad_type = ElementType::kFp32;
  // Where the gradients live: null for the shard's own storage (its chunks' store tensors,
  // filled by a visit or WriteChunkGradientsAsync); else a host array of `count` elements of
  // grad_type that must outlive the shard, which the step reads in place: for a caller that
  // accumulates gradients in host memory anyway, this saves writing them to disk and reading
  // them back.
  void* host_grads = nullptr;
  // The client that keeps the shard's parameters (not owned; it must outlive the shard), and
  // what the step hands it (ParamHandoff). Null: nobody sees the new parameters but visits;
  // the handoff must then be kNewValues.
  ParamWriter* writer = nullptr;
  ParamHandoff handoff = ParamHandoff::kNewValues;
  ElementType param_copy_type = ElementType::kBf16;  // kCopy: kBf16 or kFp16
};

using ChunkVisitor = std::function<Status(const ChunkView& chunk)>;

struct PipelinedStepStats {
  double seconds = 0;          // wall time of the step
  double compute_seconds = 0;  // in CpuOptimizer::Update
  double wait_seconds = 0;     // the driving thread waiting for I/O or a staging buffer
  uint64_t bytes_read = 0;     // from NVMe
  uint64_t bytes_written = 0;  // to NVMe
  uint64_t chunks = 0;
};

class PipelinedOptimizer {
  struct Shard;

 public:
  // The step on `store`'s tiers (how the ZeRO engine keeps its optimizer state: one mover, one
  // budget per tier): NVMe chunks are tensors homed in its NVMe tier, host chunks and the
  // staging buffers tensors of its host tier, counted in that tier's budget, which must have
  // room for them (staging_bytes() and ChunkBytes of the host chunks); pinning and NUMA
  // placement are the host tier's. The staging buffers are registered for the NVMe tier's
  // fixed-buffer I/O (TieredStore::RegisterStreamBuffer), so no I/O may run on the store while
  // Create does. `optimizer` and `store` must outlive this object.
  // Errors: InvalidArgument for bad options (the host budget message names the minimum) or
  // nvme_ratio > 0 on a store without an NVMe tier; ResourceExhausted from the host tier.
  static StatusOr<std::unique_ptr<PipelinedOptimizer>> Create(
      CpuOptimizer* optimizer, TieredStore& store, const PipelinedOptimizerOptions& options);
  // Waits for any outstanding I/O; frees the shards' tensors and the staging buffers.
  ~PipelinedOptimizer();
  PipelinedOptimizer(const PipelinedOptimizer&) = delete;
  PipelinedOptimizer& operator=(const PipelinedOptimizer&) = delete;

  // Adds a shard: parameters and gradients zero, state as CpuOptimizer::InitState makes it;
  // then `init` (optional) is called once per chunk, in order, to fill parameters, gradients
  // or state, and the chunk is stored in its home tier. Returns the shard's id. The shard's
  // tensors are freed with the optimizer.
  // Errors: InvalidArgument (bad spec), ResourceExhausted (the store's NVMe or host tier),
  // errors from `init` and from the store, with the shard and chunk named.
  StatusOr<int> AddShard(const ShardSpec& spec, const ChunkVisitor& init = nullptr);

  // Calls `visit` for each chunk of the shard in order, with its current values (kInPlace:
  // the parameters from the writer's Read). With `write_back`, what the visitor changed is
  // stored back (how checkpoints are loaded; kInPlace: the parameters through the writer's
  // Store); without, the chunk is only read.
  Status Visit(int shard, const ChunkVisitor& visit, bool write_back);

  // The step over the given shards (all shards when empty): BeginStep once for each group
  // involved (ShardSpec::runs' too), then every chunk through the pipeline, each handed to its
  // shard's writer right after its update, on the calling thread. `grad_scale` as in
  // CpuOptimizer::Update.
  // An I/O error stops the step after the outstanding I/O has drained and is returned with
  // the shard and chunk named; the store's swap files keep a failed write as a sticky error.
  // An error from a writer stops the step like an I/O error (the chunks already updated stay
  // updated).
  Status Step(const std::vector<int>& shards = {}, float grad_scale = 1.0f);

  // ---- One step taken in parts (Note [Speculative step]) ----
  // The shard's chunks, in order.
  StatusOr<std::vector<ChunkInfo>> Chunks(int shard);
  // The parameter groups the shard's elements step in, each once, in increasing order.
  StatusOr<std::vector<int>> Groups(int shard);
  // Begins a step of the shard that StepChunks then takes in parts: BeginStep of each of its
  // groups (the caller sets their steps back if the step is abandoned) and the stats reset.
  Status BeginPartialStep(int shard);
  // Updates the given chunks (in that order) through the pipeline, as Step does every chunk;
  // stats add up over the parts. With `speculative`, each chunk's new state is written to a
  // new tensor and the old one kept until ResolveSpeculation, which keeps one or the other:
  // only NVMe chunks, each once per step, can be stepped so (else InvalidArgument). The
  // store's NVMe tier needs room for the new tensors. `writer` (optional) stands in for the
  // shard's writer in this call and must pass every call on to it (how a caller paces the
  // step behind its reader: StepBesideForward).
  Status StepChunks(int shard, const std::vector<size_t>& chunks, float grad_scale,
                    bool speculative, ParamWriter* writer = nullptr);
  // Ends the speculation of the shard's chunks: `commit` frees their old state; otherwise
  // the shard's writer is told (ParamWriter::Restart), their new state is freed and the old
  // one is theirs again (kInPlace: the old parameters stored back through the writer).
  // Returns the chunks undone.
  StatusOr<std::vector<size_t>> ResolveSpeculation(int shard, bool commit);
  // Visits the given chunks with their current values, read-only.
  Status VisitChunks(int shard, const std::vector<size_t>& chunks, const ChunkVisitor& visit);

  // One chunk's gradients, of a shard with its own fp32 gradient storage, moved straight
  // between its home and the caller's page-aligned buffer of kGradientBufferBytes(count)
  // (the chunk's floats first): safe while a step runs on other chunks. The write is
  // asynchronous: `buffer` must stay unchanged until `done` runs (at once for a host chunk).
  static uint64_t GradientBufferBytes(size_t count) { return (count * 4 + 4095) / 4096 * 4096; }
  void WriteChunkGradientsAsync(int shard, size_t chunk, const void* buffer, IoCallback done);
  Status ReadChunkGradients(int shard, size_t chunk, void* buffer);

  const PipelinedStepStats& last_step_stats() const { return stats_; }
  uint64_t chunk_elements() const { return chunk_elements_; }
  int num_buffers() const { return static_cast<int>(slots_.size()); }
  // Host-tier bytes the staging buffers take (with their buffers for old parameters, once a
  // shard's parameters are kept by the caller), beside the host-resident chunks (ChunkBytes).
  uint64_t staging_bytes() const;
  // Host bytes of one chunk's arrays of `count` elements, where it lives in host memory.
  static uint64_t ChunkBytes(uint64_t count, int state_count);

 private:
  struct Slot;
  PipelinedOptimizer(CpuOptimizer* optimizer, TieredStore* store,
                     const PipelinedOptimizerOptions& options);
  class HostChunk;
  struct Item {
    Shard* shard;
    size_t chunk;
  };
  class Pipeline;  // one run of the pipeline over a list of chunks (Note [Pipelined step])
  StatusOr<Shard*> Find(int shard);
  // Frees the shard's tensors (the first error; it frees the rest regardless).
  Status FreeShard(Shard& shard);
  // The staging buffers' companions for a speculative step's old parameters (once).
  Status MakeOldParamBuffers();
  static Status CheckChunks(const Shard& shard, const std::vector<size_t>& chunks);
  StatusOr<Shard*> FindGradientChunk(int shard, size_t chunk, const void* buffer);
  Status VisitChunks(Shard* shard, const std::vector<size_t>& chunks, const ChunkVisitor& visit,
                     bool write_back);

  CpuOptimizer* optimizer_;
  TieredStore* store_;
  PipelinedOptimizerOptions options_;
  bool has_nvme_ = false;  // the store has an NVMe tier
  uint64_t chunk_elements_ = 0;
  uint64_t slot_bytes_ = 0;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<std::unique_ptr<Shard>> shards_;  // by id
  PipelinedStepStats stats_;
};

}  // namespace zinf

#endif  // ZINF_OFFLOAD_PIPELINED_OPTIMIZER_H_
