"""What the host does around the device per step, counted: the step summary's transfer counters
(Note [Transfer counters] in offload/tiered_store.cc) for the GPT of examples/torch under
zinf.zero, on the host device behind its modelled link, where every copy and wait a GPU run
would make is made and counted. Counts, not times: they say what a GPU would be asked to do
(copies up and down, waits on the caller's thread and on zinf's own) without a GPU.

    ZINF_HOST_LINK_GBPS=1000 PYTHONPATH=build/python /usr/bin/python3 bench/transfer_counts.py \\
        [--offload-param none|cpu|nvme] [--layers 4] [--d-model 256] [--steps 6]

Prints one JSON line: the settings, for each counter its median over the steps after the
first two (the first records the fetch order, the second is the first with read-ahead), and
each step's loss (to hold against another build's: the counts may change, the values not).
ZINF_HOST_LINK_GBPS must be set: on the host device without a link the engine touches device
memory directly and counts no copy.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples", "torch"))

import train_gpt  # noqa: E402  (the example's model)
import zinf.zero  # noqa: E402

COUNTERS = ["host_waits", "worker_waits", "copies_up", "bytes_up", "copies_down", "bytes_down",
            "copies_on_device", "host_bytes_set", "host_bytes_copied"]
VOCAB, SEQ, BATCH = 256, 64, 4


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--offload-param", choices=["none", "cpu", "nvme"], default="cpu")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    if not os.environ.get("ZINF_HOST_LINK_GBPS"):
        sys.exit("transfer_counts: set ZINF_HOST_LINK_GBPS (the host device's modelled link)")
    torch.manual_seed(0)
    model = train_gpt.GPT(vocab=VOCAB, seq=SEQ, d_model=args.d_model, heads=4,
                          layers=args.layers)
    with tempfile.TemporaryDirectory(prefix="zinf-counts-") as nvme:
        offload = {"device": args.offload_param}
        if args.offload_param == "nvme":
            offload["nvme_path"] = nvme
        config = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
                  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                        "offload_param": offload},
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
        engine = zinf.zero.initialize(model, config, optimizer_threads=1)
        x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
        summaries, losses = [], []
        for _ in range(args.steps):
            logits = engine(x)
            loss = torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), x.view(-1))
            engine.backward(loss)
            summaries.append(engine.step())
            losses.append(loss.item())
    counted = summaries[2:] or summaries
    print(json.dumps({"offload_param": args.offload_param, "layers": args.layers,
                      "d_model": args.d_model,
                      "parameters": sum(p.numel() for p in model.parameters()),
                      **{k: statistics.median(s[k] for s in counted) for k in COUNTERS},
                      "losses": losses}))


if __name__ == "__main__":
    main()
