// ParamWriter: the one door between the PipelinedOptimizer and the client that keeps a shard's
// parameters (the ZeRO engine's parameter tier, or its fp32 master in host memory). The step
// hands each chunk to it as it updates it: where the update writes the chunk's parameters
// (Targets), the new values (Updated), and, for a dropped speculation, Restart. A client that
// keeps the fp32 parameters itself (ParamHandoff::kInPlace) also brings them in (Prefetch),
// shows them to a visit (Read) and takes a visit's changes (Store).
//
// Thread-safety: the PipelinedOptimizer calls a shard's writer from the thread that drives the
// step or visit, one call at a time; the writer says which threads it allows beside that.
#ifndef ZINF_OFFLOAD_PARAM_WRITER_H_
#define ZINF_OFFLOAD_PARAM_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf {

// Where a chunk of a shard lies: elements [offset, offset + count) of the shard, and its home.
struct ChunkInfo {
  size_t offset = 0;
  size_t count = 0;
  bool on_nvme = false;
};

// One chunk of a shard as visitors and writers see it: the arrays are in host memory.
struct ChunkView {
  size_t offset = 0;  // first element of the chunk within the shard
  size_t count = 0;
  float* params = nullptr;
  float* state0 = nullptr;
  float* state1 = nullptr;  // null for single-state optimizers
  void* grads = nullptr;
  ElementType grad_type = ElementType::kFp32;
  // The update just wrote this chunk's parameter copy to its Targets (ParamHandoff::kCopy;
  // false in visits).
  bool copy_written = false;
  // The update just read and wrote the fp32 parameters in place, where Targets said
  // (ParamHandoff::kInPlace; false in visits); `params` holds only the padding's.
  bool params_in_place = false;
};

// Where a stretch of a chunk's parameters goes: elements [begin, begin + count) of the chunk to
// `dst`, or nowhere when `dst` is null.
struct CopyTarget {
  uint64_t begin = 0;
  uint64_t count = 0;
  void* dst = nullptr;
};

// What a shard's ParamWriter receives from the step.
enum class ParamHandoff {
  // Updated sees each chunk's new fp32 parameters in the step's buffer; the chunks keep the
  // parameters.
  kNewValues,
  // The update also writes them in the shard's param_copy_type (bf16 or fp16) where Targets
  // says, in the same pass (ChunkView::copy_written).
  kCopy,
  // The writer keeps the fp32 parameters (Note [Parameters kept by the caller] in
  // offload/pipelined_optimizer.h): the update reads and writes them where Targets says, and
  // the chunks hold only the optimizer state and gradients.
  kInPlace,
};

class ParamWriter {
 public:
  virtual ~ParamWriter() = default;

  // kCopy: where the update of chunk `c` writes each stretch of the parameter copy (copy
  // elements); kInPlace: where each stretch of the fp32 parameters is, in host memory that
  // stays valid until Updated has seen the chunk (stretches with no `dst`, padding, read as
  // zeros). The targets are in order and cover [0, c.count) exactly. Called just before the
  // update. The default refuses (FailedPrecondition): a kNewValues writer needs none.
  virtual StatusOr<std::vector<CopyTarget>> Targets(const ChunkView& c);
  // kInPlace: the chunk's state is being read ahead; starts bringing its parameters to host
  // memory. The default does nothing.
  virtual void Prefetch(const ChunkInfo& c);
  // kInPlace: fills c.params with the chunk's parameters (a visit) / stores them as the
  // chunk's (a visit that writes back, a dropped speculation putting the old values back).
  // The defaults refuse (FailedPrecondition).
  virtual Status Read(const ChunkView& c);
  virtual Status Store(const ChunkView& c);
  // Chunk `c` was just updated (or, after a dropped speculation, is shown with its old values
  // again): its parameters are in c.params, or where Targets said (c.params_in_place), and
  // its copy written (c.copy_written). An error stops the step.
  virtual Status Updated(const ChunkView& c) = 0;
  // A speculative step is being dropped (PipelinedOptimizer::ResolveSpeculation without
  // commit): every chunk Updated saw since the step began will be shown again, and Store may
  // be called meanwhile. The default does nothing.
  virtual Status Restart();
};

}  // namespace zinf

#endif  // ZINF_OFFLOAD_PARAM_WRITER_H_
