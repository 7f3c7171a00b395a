"""A Lightning causal-LM script: a LightningModule over a GPT-2 (hf_trainer_clm.py's model and
data) with AdamW and a linear warmup schedule from configure_optimizers, trained by
lightning.pytorch.Trainer with gradient accumulation and clipping, checkpointed with
trainer.save_checkpoint and resumed with fit(ckpt_path=...).

--strategy names Lightning's strategy: "auto" or "ddp" (Lightning alone), "zinf" /
"zinf_stage_3_offload" (registered by `import zinf.lightning`, or with --package
pytorch_lightning, the older package, by `import zinf.pytorch_lightning`). Prints one line "RESULT {json}"
on global rank 0: each training_step's loss on that rank, and the logits of one batch from the
trained module (and, with --load, from LightningModule.load_from_checkpoint of the saved
checkpoint).

Usage: lightning_clm.py --init DIR --out DIR --strategy S [--devices N] [--gas 2]
           [--steps 10] [--resume CKPT] [--package lightning.pytorch|pytorch_lightning]
"""

import argparse
import importlib
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, get_linear_schedule_with_warmup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_trainer_clm import DataTrainingArguments, corpus, group_texts  # noqa: E402

PACKAGES = ("lightning.pytorch", "pytorch_lightning")


def _package():
    """The Lightning package the script is written against (--package)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--package", choices=PACKAGES, default=PACKAGES[0])
    return parser.parse_known_args()[0].package


pl = importlib.import_module(_package())


class CausalLM(pl.LightningModule):
    def __init__(self, init, steps, lr=1e-2):
        super().__init__()
        self.model = AutoModelForCausalLM.from_pretrained(init)
        self.steps, self.lr = steps, lr
        self.losses = []

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).logits

    def training_step(self, batch, batch_idx):
        loss = self.model(**batch).loss
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.0)
        scheduler = get_linear_schedule_with_warmup(optimizer, 3, self.steps)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--init", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--gas", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--stop_at", type=int, default=None,
                        help="train to this step, then save the checkpoint --out/last")
    parser.add_argument("--resume", help="a checkpoint to resume from")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--clip_algorithm", default="norm")
    parser.add_argument("--package", choices=PACKAGES, default=PACKAGES[0])
    args = parser.parse_args()
    if args.strategy.startswith("zinf"):  # registers the strategy names with the package
        importlib.import_module("zinf.lightning" if args.package == PACKAGES[0]
                                else "zinf.pytorch_lightning")
    pl.seed_everything(0)
    module = CausalLM(args.init, args.steps)
    blocks = group_texts(corpus(DataTrainingArguments()), 16)
    loader = torch.utils.data.DataLoader(blocks, batch_size=2, shuffle=False)
    trainer = pl.Trainer(strategy=args.strategy, accelerator="cpu", devices=args.devices,
                         max_steps=args.stop_at or args.steps, accumulate_grad_batches=args.gas,
                         gradient_clip_val=0.5, gradient_clip_algorithm=args.clip_algorithm,
                         precision=args.precision, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, loader, ckpt_path=args.resume)
    checkpoint = os.path.join(args.out, "last")
    trainer.save_checkpoint(checkpoint)
    batch = torch.stack([blocks[i]["input_ids"] for i in range(4)])
    with torch.no_grad():
        trained = trainer.strategy.model(batch) if args.strategy.startswith("zinf") \
            else module(batch)
    result = {"losses": module.losses, "global_step": trainer.global_step,
              "trained_logits": trained.flatten()[:256].tolist()}
    if trainer.is_global_zero:
        path = (os.path.join(checkpoint, "lightning_state.pt")
                if os.path.isdir(checkpoint) else checkpoint)
        loaded = CausalLM.load_from_checkpoint(path, init=args.init, steps=args.steps,
                                               map_location="cpu", weights_only=False)
        with torch.no_grad():
            result["loaded_logits"] = loaded(batch).flatten()[:256].tolist()
        print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
