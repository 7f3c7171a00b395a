"""TRL's DPOTrainer with a policy and a frozen reference model, as its examples run it, on a
GPT-2 from a config and a tokenizer and preference data made here (nothing downloaded). On zinf
by its imports (ZINF_TRL=1: ``DPOTrainer, DPOConfig = map(zinf.hf.on_zinf, ...)``, with --deepspeed
a config), else TRL as it is. Prints "RESULT {json}" on the main process: each logged step's
loss and reward margin, and whether the reference model was taken by an engine.

Usage: trl_dpo.py --out DIR [--deepspeed ds.json] [--steps 8] [--bf16]
"""

import argparse
import json
import os
import sys

import datasets
import torch
import transformers
import trl
from tokenizers import Tokenizer, models, pre_tokenizers

DPOTrainer, DPOConfig = trl.DPOTrainer, trl.DPOConfig
if os.environ.get("ZINF_TRL") == "1":
    import zinf.hf
    DPOTrainer, DPOConfig = map(zinf.hf.on_zinf, (DPOTrainer, DPOConfig))

LETTERS = "abcdefghijklmnopqrstuvwxyz .,"


def tokenizer():
    vocab = {c: i for i, c in enumerate(["<pad>", "<eos>"] + list(LETTERS))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>",
                                                eos_token="<eos>")


def preferences(n):
    """Prompts with a preferred completion (ending in '.') and a rejected one (','), seeded."""
    g = torch.Generator().manual_seed(0)

    def word(k):
        return "".join(LETTERS[i] for i in torch.randint(0, 10, (k,), generator=g).tolist())
    return datasets.Dataset.from_list([{"prompt": word(6) + " ", "chosen": word(4) + ".",
                                        "rejected": word(4) + ","} for _ in range(n)])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--deepspeed")
    parser.add_argument("--steps", type=int, default=8)
    # TRL's configs default to bf16 (on the CPU: Accelerate's autocast); zinf takes the
    # precision from its config's section, as DeepSpeed does.
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args()
    tok = tokenizer()
    config = transformers.GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2,
                                     n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, bos_token_id=1, eos_token_id=1,
                                     pad_token_id=0)
    torch.manual_seed(0)
    policy = transformers.AutoModelForCausalLM.from_config(config)
    reference = transformers.AutoModelForCausalLM.from_config(config)
    reference.load_state_dict(policy.state_dict())
    training_args = DPOConfig(output_dir=args.out, per_device_train_batch_size=4,
                              gradient_accumulation_steps=2, max_steps=args.steps,
                              logging_steps=1, report_to="none", use_cpu=True,
                              learning_rate=1e-3, max_length=32, save_strategy="no",
                              bf16=args.bf16, deepspeed=args.deepspeed)
    trainer = DPOTrainer(model=policy, ref_model=reference, args=training_args,
                         train_dataset=preferences(128), processing_class=tok)
    trainer.train()
    logs = [{"loss": h["loss"], "margin": h.get("rewards/margins")}
            for h in trainer.state.log_history if "loss" in h]
    if trainer.args.process_index == 0:
        print("RESULT " + json.dumps({
            "steps": logs, "reference_engine": type(trainer.ref_model).__name__}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
