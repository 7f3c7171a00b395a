"""zinf.zero and torch.distributed in one process: init_process_group before the engine, or
after it, then a few steps of training with the metrics all-reduced by torch beside the
engine's own collectives. Run alone (with RANK=0 WORLD_SIZE=1 MASTER_ADDR MASTER_PORT set, as
init_process_group's env:// needs) or under `zinf run -n 2`:
    PYTHONPATH=build/python build/bin/zinf run -n 2 -- /usr/bin/python3 \\
        tests/python/torch_distributed_train.py --order torch-first
Exits non-zero saying what failed.
"""

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist

import torch_models_train as tm
import zinf.zero


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--order", choices=["torch-first", "zinf-first"], required=True)
    args = ap.parse_args()
    cfg = tm.config(argparse.Namespace(model="cnn_bn", offload="none", nvme_path=""), 4)
    model = tm.make("cnn_bn")
    blocker = None
    if args.order == "torch-first":
        dist.init_process_group("gloo")
        # With torch first, zinf agrees on its port through torch's store: show it by taking
        # away the port it would use otherwise (MASTER_PORT + 1) on rank 0.
        os.environ.pop("ZINF_MASTER_PORT", None)
        if dist.get_rank() == 0 and dist.get_world_size() > 1:
            blocker = socket.socket()
            try:
                blocker.bind(("127.0.0.1", int(os.environ["MASTER_PORT"]) + 1))
                blocker.listen()
            except OSError:
                pass  # taken already: as good
        engine = zinf.zero.initialize(model, cfg, timeout_s=60)
    else:
        engine = zinf.zero.initialize(model, cfg, timeout_s=60)
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if (rank, world) != (engine.rank, engine.world_size):
        print(f"torch says rank {rank} of {world}, zinf {engine.rank} of {engine.world_size}",
              file=sys.stderr)
        return 1
    for step, tokens in enumerate(tm.batches(5, 4 * world)):
        loss = engine(tokens[rank * 4:(rank + 1) * 4])
        engine.backward(loss)
        engine.step()
        # A metric over ranks both ways: torch's all_reduce and the engine's collective.
        metric = torch.tensor([loss.item()], dtype=torch.float64)
        dist.all_reduce(metric)
        mean = engine.mean_over_ranks(loss.item())
        if abs(metric.item() / world - mean) > 1e-12 * abs(mean):
            print(f"step {step}: torch's mean {metric.item() / world}, zinf's {mean}",
                  file=sys.stderr)
            return 1
    dist.barrier()
    dist.destroy_process_group()
    if blocker is not None:
        blocker.close()
    print(f"rank {rank}: {args.order} ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
