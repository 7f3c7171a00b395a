"""A causal-LM training loop in the style of Accelerate's examples (by_feature/
deepspeed_with_config_support.py): Accelerator with gradient accumulation and a DeepSpeed
plugin, prepare(), accumulate(), backward(), clip_grad_norm_, save_state/load_state, and the
model saved through unwrap_model and get_state_dict.

It trains on zinf by its imports alone (ZINF_ACCELERATOR=zinf), on Accelerate as it is
(ZINF_ACCELERATOR=accelerate: with --deepspeed, DeepSpeed itself where installed; without,
plain PyTorch, DistributedDataParallel on several processes). The data and the models are
hf_trainer_clm.py's. Prints one line "RESULT {json}" on the main process: each micro-batch's
loss on that process, and the logits of the saved model loaded by from_pretrained and of the
trained model. It saves its state after --resume_at steps; --resume resumes from there in a new
process and prints the losses of the micro-batches after it.

Usage: accelerate_clm.py --init DIR --out DIR [--deepspeed ds.json] [--steps 10] [--gas 2]
           [--resume]
"""

import argparse
import json
import os
import sys

import torch

if os.environ.get("ZINF_ACCELERATOR", "zinf") == "zinf":
    from zinf.hf import Accelerator
else:
    from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin
from accelerate.utils.deepspeed import DummyOptim, DummyScheduler
from transformers import (AutoModelForCausalLM, get_constant_schedule,
                          get_linear_schedule_with_warmup)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_trainer_clm import DataTrainingArguments, corpus, group_texts  # noqa: E402


def build(args, accelerator_kwargs):
    # Without a GPU, Accelerate alone runs several processes only with cpu=True; its DeepSpeed
    # mode (DeepSpeed's CPU accelerator, or zinf) needs no flag.
    cpu = not torch.cuda.is_available() and "deepspeed_plugin" not in accelerator_kwargs
    accelerator = Accelerator(gradient_accumulation_steps=args.gas, cpu=cpu,
                              **accelerator_kwargs)
    model = AutoModelForCausalLM.from_pretrained(args.init)
    blocks = group_texts(corpus(DataTrainingArguments()), 16)
    loader = torch.utils.data.DataLoader(blocks, batch_size=2, shuffle=False)
    config = accelerator_kwargs.get("deepspeed_plugin")
    names_optimizer = config is not None and "optimizer" in config.deepspeed_config
    if names_optimizer:  # the config's optimizer and schedule, as Accelerate's examples do
        optimizer = DummyOptim(model.parameters(), lr=args.lr, weight_decay=0.01)
        scheduler = DummyScheduler(optimizer, total_num_steps=args.steps, warmup_num_steps=3)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        scheduler = (get_constant_schedule(optimizer) if args.constant_lr
                     else get_linear_schedule_with_warmup(optimizer, 3, args.steps))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader,
                                                              scheduler)
    return accelerator, model, optimizer, loader, scheduler


def train(accelerator, model, optimizer, loader, scheduler, first, last, max_norm):
    losses = []
    model.train()
    batches = iter(loader)
    for _ in range(first * accelerator.gradient_accumulation_steps):
        next(batches)  # the micro-batches before a resume's first step
    for _ in range((last - first) * accelerator.gradient_accumulation_steps):
        batch = next(batches)
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            losses.append(loss.item())
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), max_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    return losses


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--init", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--deepspeed")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--resume_at", type=int, default=5)
    parser.add_argument("--resume", action="store_true",
                        help="resume from --out's save_state and train the steps after it")
    parser.add_argument("--gas", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-2)
    # Accelerate alone steps a scheduler once per process at each optimizer step; in its
    # DeepSpeed mode (and on zinf) the engine steps it once.
    parser.add_argument("--constant_lr", action="store_true")
    args = parser.parse_args()
    kwargs = {}
    if args.deepspeed:
        kwargs["deepspeed_plugin"] = DeepSpeedPlugin(hf_ds_config=args.deepspeed,
                                                     gradient_clipping=0.5)
    parts = build(args, kwargs)
    accelerator, model, loader = parts[0], parts[1], parts[3]
    state_dir = os.path.join(args.out, "state")
    if args.resume:  # a new process, from save_state's directory
        accelerator.load_state(state_dir)
        resumed = train(*parts, args.resume_at, args.steps, 0.5)
        if accelerator.is_main_process:
            print("RESULT " + json.dumps({"resumed": resumed}), flush=True)
        return 0
    losses = train(*parts, 0, args.resume_at, 0.5)
    accelerator.save_state(state_dir)
    losses += train(*parts, args.resume_at, args.steps, 0.5)

    batch = torch.stack([loader.dataset[i]["input_ids"] for i in range(4)])
    with torch.no_grad():
        trained = model(input_ids=batch).logits.flatten()[:256].tolist()
    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    unwrapped.save_pretrained(args.out, is_main_process=accelerator.is_main_process,
                              save_function=accelerator.save,
                              state_dict=accelerator.get_state_dict(model))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config
        unset_hf_deepspeed_config()
        loaded = AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.float32)
        with torch.no_grad():
            logits = loaded(batch).logits.flatten()[:256].tolist()
        print("RESULT " + json.dumps({"losses": losses, "logits": logits,
                                      "trained_logits": trained}), flush=True)
    accelerator.wait_for_everyone()
    return 0


if __name__ == "__main__":
    sys.exit(main())
