"""A causal-LM fine-tuning script in the style of transformers' examples/pytorch/language-modeling/
run_clm.py: HfArgumentParser over model, data and training arguments, a model from a config,
texts grouped into blocks, transformers' Trainer with its checkpoints, resume and save_model.

It trains on zinf by its imports alone (ZINF_TRAINER=zinf), on transformers' Trainer as it is
(ZINF_TRAINER=transformers, with --deepspeed: DeepSpeed itself, where installed). Nothing is
downloaded: the corpus is made here from a seed, and the model from its config.

Writes, into --output_dir, losses.json: each logged step's loss, learning rate and gradient
norm, and the logits of one fixed batch from the trained model and from the model `save_model`
wrote, loaded back with from_pretrained, for the tests (tests/python/test_hf_trainer.py).

Usage: hf_trainer_clm.py --model_type gpt2 --output_dir OUT --max_steps 20
           [--deepspeed ds_config.json] [--resume_from_checkpoint DIR] [any TrainingArguments]
"""

import dataclasses
import json
import os
import sys

import torch

if os.environ.get("ZINF_TRAINER", "zinf") == "zinf":
    from zinf.hf import Trainer, TrainingArguments
else:
    from transformers import Trainer, TrainingArguments
from transformers import AutoConfig, AutoModelForCausalLM, HfArgumentParser, TrainerCallback


@dataclasses.dataclass
class ModelArguments:
    model_type: str = dataclasses.field(default="gpt2", metadata={"help": "gpt2 or llama"})
    model_name_or_path: str = dataclasses.field(
        default=None, metadata={"help": "a saved model to start from (else one from the config)"})
    gradient_checkpointing_model: bool = False
    lora_r: int = dataclasses.field(
        default=0, metadata={"help": "> 0: PEFT's LoRA of this rank on a frozen base"})
    hidden: int = dataclasses.field(
        default=0, metadata={"help": "> 0: this hidden size (heads of 64) instead of the tiny one"})
    layers: int = dataclasses.field(default=0, metadata={"help": "> 0: this many layers"})


@dataclasses.dataclass
class DataTrainingArguments:
    block_size: int = 16
    vocab_size: int = 96
    corpus_tokens: int = 40000
    corpus_seed: int = 1234


CONFIGS = {
    "gpt2": dict(model_type="gpt2", n_embd=32, n_layer=2, n_head=2, n_positions=64,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                 bos_token_id=0, eos_token_id=0),
    "llama": dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                  tie_word_embeddings=False),
}


def corpus(data_args):
    """Token ids of a text-like stream: a seeded Markov chain over the vocabulary, so that a
    model has something to learn."""
    g = torch.Generator().manual_seed(data_args.corpus_seed)
    v = data_args.vocab_size
    table = torch.randint(0, v, (v, 4), generator=g)
    choice = torch.randint(0, 4, (data_args.corpus_tokens,), generator=g)
    ids = [0]
    for c in choice.tolist()[1:]:
        ids.append(int(table[ids[-1], c]))
    return ids


def group_texts(ids, block_size):
    """run_clm.py's group_texts: blocks of block_size tokens, labels the inputs."""
    total = (len(ids) // block_size) * block_size
    return [{"input_ids": torch.tensor(ids[i:i + block_size]),
             "labels": torch.tensor(ids[i:i + block_size])}
            for i in range(0, total, block_size)]


class LossLog(TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.steps.append({"step": state.global_step, "loss": logs["loss"],
                               "learning_rate": logs.get("learning_rate"),
                               "grad_norm": logs.get("grad_norm")})


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    sizes = {}
    if model_args.hidden > 0:
        heads = max(1, model_args.hidden // 64)
        sizes = ({"n_embd": model_args.hidden, "n_head": heads} if model_args.model_type == "gpt2"
                 else {"hidden_size": model_args.hidden, "intermediate_size": 4 * model_args.hidden,
                       "num_attention_heads": heads, "num_key_value_heads": heads})
    if model_args.layers > 0:
        sizes["n_layer" if model_args.model_type == "gpt2" else "num_hidden_layers"] = \
            model_args.layers
    config = AutoConfig.for_model(**{**CONFIGS[model_args.model_type], **sizes},
                                  vocab_size=data_args.vocab_size)
    torch.manual_seed(training_args.seed)
    if model_args.model_name_or_path:
        model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
    else:
        model = AutoModelForCausalLM.from_config(config)
    if model_args.gradient_checkpointing_model:
        model.gradient_checkpointing_enable()
    if model_args.lora_r > 0:
        import peft
        targets = {"gpt2": ["c_attn", "c_proj"], "llama": ["q_proj", "v_proj"]}
        torch.manual_seed(training_args.seed)
        model = peft.get_peft_model(model, peft.LoraConfig(
            r=model_args.lora_r, lora_alpha=2 * model_args.lora_r, lora_dropout=0.0,
            target_modules=targets[model_args.model_type], task_type="CAUSAL_LM",
            init_lora_weights="gaussian"))
    train_dataset = group_texts(corpus(data_args), data_args.block_size)
    log = LossLog()
    trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset,
                      callbacks=[log])
    metrics = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint).metrics
    batch = torch.stack([train_dataset[i]["input_ids"] for i in range(4)])
    with torch.no_grad():
        trained = trainer.model(batch).logits.flatten()[:256].tolist()
    trainer.save_model()
    trainer.accelerator.wait_for_everyone()  # the main process has written it

    # The saved model, loaded as a user loads it for inference, on the same batch (outside
    # transformers' DeepSpeed ZeRO-3 mode, which Trainer on DeepSpeed leaves switched on).
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config
    unset_hf_deepspeed_config()
    loaded = AutoModelForCausalLM.from_pretrained(training_args.output_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = loaded(batch).logits.flatten()[:256].tolist()
    # zinf's engine: the host bytes of its last step (the parameters' tier among them).
    last_step = getattr(trainer.model_wrapped, "last_step", None)
    if training_args.process_index == 0:
        with open(os.path.join(training_args.output_dir, "losses.json"), "w") as f:
            json.dump({"steps": log.steps, "trained_logits": trained, "logits": logits,
                       "global_step": trainer.state.global_step,
                       "train_runtime": metrics["train_runtime"],
                       "host_bytes": last_step["host_bytes"] if last_step else None}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
