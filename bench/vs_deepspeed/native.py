#!/usr/bin/env python3
"""One run of zinf's native trainer (examples/gpt's train_gpt) with the dimensions, batch,
AdamW hyper-parameters, clipping and placement of train.py, for bench/vs_deepspeed.sh. It
trains on the same corpus file (README and architecture notes) but draws its windows with its
own sampler, and its GPT ties the output head to the token embedding: its loss curve is shown
beside the others, not compared with them. Prints one RESULT line (common.py) in train.py's
form; the peak RSS is each rank's (GNU time's %M), summed.

  python native.py --train-gpt build/bin/train_gpt --zinf build/bin/zinf --world 1
      --placement memory|cpu|nvme --work-dir DIR [--nvme-path DIR] [train.py's model args]
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
import train  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train-gpt", required=True)
    ap.add_argument("--zinf", required=True)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--placement", choices=("memory", "cpu", "nvme"), required=True)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--nvme-path", default="")
    ap.add_argument("--work-dir", required=True)
    train.add_model_args(ap)
    args = ap.parse_args()
    if args.model != "torch_gpt":
        ap.error("train_gpt has one model: give --model torch_gpt (its dimensions are used)")

    config = train.ds_config(args)
    config["model"] = {"vocab_size": train.VOCAB, "seq_len": args.seq, "d_model": args.d_model,
                       "n_layer": args.layers, "n_head": args.heads}
    work = os.path.abspath(args.work_dir)
    os.makedirs(work, exist_ok=True)
    config_path, metrics = os.path.join(work, "native.json"), os.path.join(work, "native.jsonl")
    with open(config_path, "w") as f:
        json.dump(config, f)
    # The script's snapshot of the corpus (bench/vs_deepspeed.sh), else the corpus as it is now.
    corpus = os.environ.get("ZINF_VS_DS_CORPUS", "")
    if not corpus:
        corpus = os.path.join(work, "corpus.bin")
        with open(corpus, "wb") as f:
            f.write(bytes(train._torch_example().load_corpus("").tolist()))
    rss_files = [os.path.join(work, f"rss.{r}") for r in range(args.world)]
    threads = max(1, common.cores() // args.world)
    command = (f'exec /usr/bin/time -f %M -o {work}/rss.$RANK {args.train_gpt} '
               f'--config {config_path} --steps {args.steps} --metrics {metrics} '
               f'--data {corpus} --threads {threads} --log-every 0')
    if args.nvme_path:
        command += f" --nvme-path {args.nvme_path}"
    run = subprocess.run([args.zinf, "run", "-n", str(args.world), "--", "sh", "-c", command],
                         capture_output=True, text=True)
    if run.returncode != 0:
        common.emit("e2e", side="zinf native", model="train_gpt", placement=args.placement,
                    world=args.world, layers=args.layers, d_model=args.d_model,
                    error=f"train_gpt exited {run.returncode}: {(run.stdout + run.stderr)[-2000:]}")
        sys.exit(1)
    with open(metrics) as f:
        steps = [json.loads(line) for line in f if line.strip()]
    timed = steps[train.WARMUP_STEPS:] or steps
    split = {k: common.median([s[k] for s in timed])
             for k in ("step_s", "compute_s", "param_wait_s", "grad_reduce_s", "optimizer_s")}
    rss = 0
    for path in rss_files:
        with open(path) as f:
            rss += int(f.read().split()[-1]) * 1024  # GNU time's %M is in KiB
    tokens = args.micro * args.world * args.seq
    common.emit("e2e", side="zinf native", model="train_gpt", placement=args.placement,
                world=args.world, threads_per_rank=threads, params=None, layers=args.layers,
                d_model=args.d_model, seq=args.seq, micro=args.micro, steps=args.steps,
                losses=[s["loss"] for s in steps], step_s=split["step_s"],
                tokens_per_s=tokens / split["step_s"], peak_rss_bytes=rss,
                engine_nvme_read_per_step=common.median([s["nvme_read_bytes"] for s in timed]),
                engine_nvme_written_per_step=common.median(
                    [s["nvme_written_bytes"] for s in timed]),
                split=split)


if __name__ == "__main__":
    main()
