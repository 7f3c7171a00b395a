"""Hugging Face models under zinf.initialize: GPT-2 and Llama from small configs (nothing
downloaded) train with the ZeRO-3 DeepSpeed config of Hugging Face's documentation ("auto"
everywhere), its "auto" values filled from the training arguments as Hugging Face's DeepSpeed
integration fills them, to plain PyTorch's losses on the same batches; a number in the config
that the training arguments contradict is refused naming both; built under zinf.zero.Init
(where post_init initializes every weight of modules already built), each model holds no
weights after construction and trains to the losses of the model built normally, bit for
bit. Skips without transformers."""

import copy
import math
import types
import unittest

import torch

import zinf
import zinf.zero

try:
    import transformers
except Exception as e:  # ImportError, or an install that fails to import
    transformers = None
    WHY = f"transformers does not import: {e}"

# docs/source/en/deepspeed.md (transformers), "ZeRO-3 example".
HF_ZERO3 = {
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
             "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                              "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto",
                                                 "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
        "overlap_comm": True,
        "contiguous_gradients": True,
        "sub_group_size": 1e9,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": True,
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}

VOCAB, SEQ, MICRO, GAS, STEPS = 64, 16, 2, 2, 6
ARGS = dict(per_device_train_batch_size=MICRO, gradient_accumulation_steps=GAS,
            learning_rate=1e-2, weight_decay=0.01, max_grad_norm=0.5, max_steps=STEPS,
            warmup_steps=2)


def training_arguments(**values):
    """A transformers.TrainingArguments where one can be made (it needs accelerate), else an
    object with its attribute names, defaults and get_warmup_steps."""
    try:
        return transformers.TrainingArguments(output_dir="unused", report_to=[], use_cpu=True,
                                              **values)
    except ImportError:
        args = types.SimpleNamespace(
            per_device_train_batch_size=8, gradient_accumulation_steps=1, learning_rate=5e-5,
            weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
            max_grad_norm=1.0, max_steps=-1, warmup_steps=0, fp16=False, bf16=False,
            fp16_full_eval=False, bf16_full_eval=False)
        vars(args).update(values)
        args.get_warmup_steps = lambda total: args.warmup_steps
        return args


def make(kind, under_init=False):
    """GPT-2 or Llama from a small config, seeded alike; under_init: built inside
    zinf.zero.Init."""
    if under_init:
        with zinf.zero.Init(config_dict_or_path=copy.deepcopy(HF_ZERO3)):
            return make(kind)
    torch.manual_seed(0)
    if kind == "gpt2":
        # No dropout: both runs must see the same function.
        config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2,
                                         n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
                                         attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        return transformers.GPT2LMHeadModel(config)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, max_position_embeddings=SEQ)
    return transformers.LlamaForCausalLM(config)


def batches():
    """Counting sequences from random starts: learnable within a few steps."""
    g = torch.Generator().manual_seed(7)
    return [(torch.randint(0, VOCAB, (MICRO, 1), generator=g) + torch.arange(SEQ)) % VOCAB
            for _ in range(STEPS * GAS)]


@unittest.skipIf(transformers is None, "" if transformers is not None else WHY)
class HuggingFaceTest(unittest.TestCase):
    def train_zinf(self, model):
        engine, _, _, scheduler = zinf.initialize(model=model, config=copy.deepcopy(HF_ZERO3),
                                                  trainer=training_arguments(**ARGS))
        self.assertEqual((engine.train_micro_batch_size_per_gpu(),
                          engine.gradient_accumulation_steps()), (MICRO, GAS))
        self.assertIsNotNone(scheduler)
        losses, lrs = [], []
        for tokens in batches():
            loss = engine(input_ids=tokens, labels=tokens).loss
            engine.backward(loss)
            if engine.is_gradient_accumulation_boundary():
                lrs.append(engine.get_lr()[0])
            engine.step()
            losses.append(loss.item())
        return losses, lrs

    def train_torch(self, model, lrs):
        args = training_arguments(**ARGS)
        opt = torch.optim.AdamW(model.parameters(), lr=lrs[0], betas=(args.adam_beta1,
                                args.adam_beta2), eps=args.adam_epsilon,
                                weight_decay=args.weight_decay)
        losses = []
        for i, tokens in enumerate(batches()):
            loss = model(input_ids=tokens, labels=tokens).loss
            (loss / GAS).backward()
            losses.append(loss.item())
            if (i + 1) % GAS == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                for group in opt.param_groups:
                    group["lr"] = lrs[i // GAS]
                opt.step()
                opt.zero_grad()
        return losses

    def check_built_under_init(self, kind):
        model = make(kind, under_init=True)
        for name, p in model.named_parameters():
            with torch._C.DisableTorchFunction():
                self.assertEqual(p.data.stride(), (0,) * p.dim(), f"'{name}' holds its values")
        # Read before initialize, a weight refuses, naming itself, instead of giving NaN.
        with self.assertRaisesRegex(zinf.ParameterNotGatheredError, r"lm_head.weight|wte|embed"):
            model.get_output_embeddings().weight.sum()
        self.assertEqual(self.train_zinf(model), self.train_zinf(make(kind)))

    def check(self, kind):
        plain = make(kind)
        losses, lrs = self.train_zinf(make(kind))
        # The schedule from the training arguments: WarmupLR up to learning_rate over
        # warmup_steps, from warmup_min_lr's default 0.
        self.assertEqual(lrs[-1], ARGS["learning_rate"])
        self.assertLess(lrs[0], ARGS["learning_rate"])
        want = self.train_torch(plain, lrs)
        for got, ref in zip(losses, want):
            self.assertAlmostEqual(got, ref, delta=1e-4 * abs(ref), msg=f"{losses} vs {want}")
        self.assertLess(sum(losses[-GAS:]), sum(losses[:GAS]) - 0.05 * GAS, losses)

    def test_gpt2_built_under_zero_init_trains_bitwise_as_built_normally(self):
        self.check_built_under_init("gpt2")

    def test_llama_built_under_zero_init_trains_bitwise_as_built_normally(self):
        self.check_built_under_init("llama")

    def test_gpt2_trains_under_the_hf_zero3_config(self):
        self.check("gpt2")

    def test_llama_trains_under_the_hf_zero3_config(self):
        self.check("llama")

    def test_a_config_number_the_training_arguments_contradict_is_refused(self):
        config = copy.deepcopy(HF_ZERO3)
        config["gradient_accumulation_steps"] = 4
        with self.assertRaisesRegex(ValueError, "'gradient_accumulation_steps' is 4 but the "
                                                "trainer's value is 2"):
            zinf.initialize(model=make("gpt2"), config=config, trainer=training_arguments(**ARGS))
        # The same values as a dict of TrainingArguments' names fill the same keys.
        engine, *_ = zinf.initialize(model=make("gpt2"), config=copy.deepcopy(HF_ZERO3),
                                     trainer=dict(ARGS, warmup_steps=2))
        self.assertEqual(engine.gradient_accumulation_steps(), GAS)
        self.assertTrue(math.isfinite(engine.get_lr()[0]))


if __name__ == "__main__":
    unittest.main()
