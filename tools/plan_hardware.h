// A described node for `zinf plan --hardware`: the hardware's figures instead of a profile
// measured on this machine, so that a plan can be made for a node that is not at hand, and the
// plan's step for GPUs (Note [Plan on described hardware]).
//
// The file (shipped ones: tools/hardware/*.json, installed under share/zinf/hardware):
//   {"zinf_hardware": 1, "name": "...", "notes": "where the figures come from",
//    "gpus": {"count": 8, "bf16_tflops": 756, "training_efficiency": 0.5, "memory_GiB": 80,
//             "h2d_GBps": 50, "d2h_GBps": 50, "peer_GBps": 40},
//    "host": {"memory_GiB": 2048, "memory_GBps": 300, "cpu_adam_params_per_s": 5e9},
//    "nvme": [{"count": 8, "read_GBps": 12, "write_GBps": 7, "capacity_TB": 7.68}]}
// bf16_tflops is the datasheet's dense bf16 (fp16 on GPUs without bf16) tensor rate;
// training_efficiency (optional, default kTrainingEfficiency) the share of it a transformer's
// training sustains end to end on that GPU without offload; h2d and d2h are one GPU's PCIe
// link, each way, measured while every GPU of the node moves data (not the nominal rate);
// host.memory_GBps is the host memory's sustained bandwidth;
// peer_GBps is one GPU's collective bandwidth to the others (NVLink, NVSwitch or PCIe;
// required with more than one GPU); cpu_adam_params_per_s is the whole node's CPU Adam rate;
// nvme lists the drives, `count` of each (default 1). Every figure must be a number > 0;
// unknown keys are errors.
//
// Note [Plan on described hardware]
// One rank per GPU, in bf16 (fp16 where the config asks), a GPT-like model trained by
// PyTorch on the GPU. Per step of gradient_accumulation_steps micro-batches, per rank:
//  - compute: the matmul FLOPs at training_efficiency x bf16_tflops, which covers the rest of
//    the forward and backward too (a transformer's training sustains about half the tensor
//    cores' peak end to end on an A100: Narayanan et al., 2021, 52%; a third on a V100:
//    Shoeybi et al., 2019, 30%); fp32 placements at half of it (TF32 tensor cores);
//  - lanes beside the compute, each busy for its bytes at its rate: the PCIe link to the GPU
//    (the parameter shards the device tier does not keep, in the cache simulation of Note [Plan
//    memory]), the link from it (each micro-batch's reduced fp32 gradient shard), the peers (each
//    fetch's all-gather and each micro-batch's reduce-scatter), and the node's drives shared by its
//    GPUs (parameter shards read from NVMe). Prefetching overlaps them with the compute: forward
//    and backward take the longest of the compute and the lanes;
//  - the optimizer step after backward: CPU Adam on the rank's share of the node's rate (the
//    engine keeps the fp32 master, gradients and optimizer state in host memory whatever the
//    placement, so the reduced gradient shard always crosses to the host); with the
//    optimizer on NVMe, its pass (12 bytes a parameter each way, more with the gradients
//    there) on the rank's share of the drives, at the slower of it and Adam; then the new
//    parameters written to their tier (over PCIe, or to NVMe).
// Tokens per step to hide the offload: the tokens per step (at the config's gradient
// accumulation) at which the compute alone would last as long as the step's offload (the lanes'
// busiest plus the optimizer step): beyond it the GPU, not the transfers, sets the pace (with
// zinf.delayed_param_update, or the overlapped NVMe step, hiding the optimizer behind the next
// batch). Not modelled: the matmuls' efficiency by d_model (one figure per GPU),
// zinf.overlap_optimizer and zinf.delayed_param_update (nothing of the optimizer step is hidden),
// several nodes (collectives are within the node), tiling of layers larger than the GPU.
//
// Thread-safety: plain functions over values.
#ifndef ZINF_TOOLS_PLAN_HARDWARE_H_
#define ZINF_TOOLS_PLAN_HARDWARE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tools/plan_model.h"
#include "zinf/status.h"

namespace zinf::plan {

inline constexpr double kTrainingEfficiency = 0.5;

struct NodeHardware {
  std::string name;
  std::string notes;
  int gpus = 0;
  double gpu_flops = 0;  // bf16 dense peak, FLOP/s
  double training_efficiency = kTrainingEfficiency;
  uint64_t gpu_memory_bytes = 0;
  double h2d_Bps = 0, d2h_Bps = 0;  // one GPU's link
  double peer_Bps = 0;              // one GPU's collective bandwidth; 0 with one GPU
  uint64_t host_memory_bytes = 0;
  double host_memory_Bps = 0;
  double cpu_adam_params_per_s = 0;  // the whole node
  struct Drive {
    int count = 1;
    double read_Bps = 0, write_Bps = 0;
    uint64_t capacity_bytes = 0;
  };
  std::vector<Drive> nvme;
  // The drives together.
  double nvme_read_Bps() const;
  double nvme_write_Bps() const;
  uint64_t nvme_bytes() const;

  // InvalidArgument naming `source` and the key for a missing, non-positive or unknown figure,
  // or text that is not such a JSON object (too deep, malformed).
  static StatusOr<NodeHardware> FromJson(std::string_view text, const std::string& source);
};

// `name_or_path`: a file, or the name of a shipped description ("8xh100-pcie-8nvme"): the
// file NAME.json in the installed share/zinf/hardware beside the binary, else in the source
// tree's tools/hardware. NotFound-style InvalidArgument listing the shipped names.
StatusOr<std::string> ResolveShipped(const std::string& name_or_path, std::string_view kind,
                                     std::string_view flag);
// The shipped names of `kind` ("hardware", "models").
std::vector<std::string> ShippedNames(std::string_view kind);

// What the plan predicts for `config` on one GPU of `node` with `world` ranks (one per GPU,
// at most node.gpus). The model's activations are taken as model.gpu_activation_bytes.
struct HardwareEstimate {
  Estimate estimate;
  double tokens_per_step = 0;
  double hide_tokens = 0;   // tokens per step for the compute to last as long as the offload
  double model_tflops = 0;  // per GPU: 8 x parameters x tokens (recomputation) per step time
};
StatusOr<HardwareEstimate> EstimateOnHardware(const ModelSpec& model, const EngineConfig& config,
                                              const NodeHardware& node, int world);

}  // namespace zinf::plan

#endif  // ZINF_TOOLS_PLAN_HARDWARE_H_
