"""Trains models that no one in this project wrote (torch's own nn.Transformer and
nn.TransformerEncoder, a CNN with BatchNorm, and with `transformers` installed Hugging Face's
GPT-2 and Llama built from a config) twice from the same initial values and data: with plain
PyTorch (torch.optim.AdamW) and under zinf.zero, and compares the loss curves step by step.

Each rank of zinf runs its own slice of the global batch; the reference runs the same slices
one after another in one process and averages their losses, which is the same gradient (and
BatchNorm sees the same per-slice batches in both). Nothing is registered by hand: modules
that read a child's parameters without calling it (nn.MultiheadAttention's out_proj) must be
found by zinf.zero itself (Note [Module hooks] in python/zinf/zero.py).

Run alone (one rank) or under the launcher, from the repository root:
    PYTHONPATH=build/python build/bin/zinf run -n 2 -- /usr/bin/python3 \\
        tests/python/torch_models_train.py --model transformer [--offload nvme --nvme-path D]
Exits 0 when the curves agree to LOSS_RTOL, 77 when the model needs a missing package, else 1
naming the first step that differs.
"""

import argparse
import gc
import os
import socket
import sys

import torch
import torch.nn.functional as F

import zinf.zero
from zero_train import sequences  # noqa: E402  (this folder is on the path)

LOSS_RTOL = 1e-5
SKIP = 77


class SkipModel(Exception):
    pass


def transformers_or_skip():
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        raise SkipModel(f"transformers is not importable ({e}); pip install transformers")
    return transformers


# Each model is an nn.Module whose forward takes one rank's slice of tokens and returns the
# loss, around the model under test (so that zinf.zero's root hooks wrap the whole step).

class TransformerLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 32)
        self.t = torch.nn.Transformer(d_model=32, nhead=4, num_encoder_layers=2,
                                      num_decoder_layers=2, dim_feedforward=64, dropout=0.0,
                                      batch_first=True)
        self.head = torch.nn.Linear(32, 16)

    def forward(self, tokens):
        src, tgt = self.embed(tokens[:, :6]), self.embed(tokens[:, 6:-1])
        # In the model's dtype (bf16 under a bf16 config on a GPU), as attention wants it.
        mask = torch.nn.Transformer.generate_square_subsequent_mask(tgt.shape[1]).to(tgt)
        out = self.t(src, tgt, tgt_mask=mask)
        return F.cross_entropy(self.head(out).reshape(-1, 16), tokens[:, 7:].reshape(-1))


class EncoderLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 32)
        layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64,
                                                 dropout=0.0, batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, num_layers=2)
        self.head = torch.nn.Linear(32, 16)

    def forward(self, tokens):
        x = self.embed(tokens[:, :-1])
        mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1]).to(x)
        out = self.enc(x, mask=mask)
        return F.cross_entropy(self.head(out).reshape(-1, 16), tokens[:, 1:].reshape(-1))


def images(tokens):
    """8x8 one-channel images of 4 classes: the class's quadrant is bright, on a background
    that varies with the token rows."""
    y = tokens[:, 0] % 4
    img = tokens[:, :8].float()[:, None, :].expand(-1, 8, -1) / 64.0
    img = img.clone()
    for k in range(4):
        rows, cols = slice(4 * (k // 2), 4 * (k // 2) + 4), slice(4 * (k % 2), 4 * (k % 2) + 4)
        img[y == k, rows, cols] += 1.0
    return img[:, None], y


class BatchNormCnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        # No bias before BatchNorm, as in ResNet: BatchNorm cancels it, so its gradient is
        # rounding noise that Adam would blow up into steps of lr, different in any two runs.
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(), torch.nn.Linear(32, 4))

    def forward(self, tokens, logits=False):
        x, y = images(tokens)
        out = self.net(x)
        return out if logits else F.cross_entropy(out, y)


class HfLM(torch.nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, tokens):
        logits = self.lm(input_ids=tokens[:, :-1]).logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def gpt2_model():
    t = transformers_or_skip()
    cfg = t.GPT2Config(vocab_size=16, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return HfLM(t.GPT2LMHeadModel(cfg))


def llama_model():
    t = transformers_or_skip()
    if not hasattr(t, "LlamaConfig"):
        raise SkipModel(f"transformers {t.__version__} has no Llama")
    cfg = t.LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=16)
    return HfLM(t.LlamaForCausalLM(cfg))


def checkpointed(make_lm, **kwargs):
    """A Hugging Face model with activation checkpointing on, as Trainer's
    --gradient_checkpointing turns it on (kwargs: its gradient_checkpointing_kwargs)."""
    def make():
        model = make_lm()
        model.lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None)
        return model
    return make


MODELS = {
    "transformer": TransformerLM,
    "encoder": EncoderLM,
    "cnn_bn": BatchNormCnn,
    "gpt2": gpt2_model,
    "llama": llama_model,
    "gpt2_ckpt": checkpointed(gpt2_model),
    "gpt2_ckpt_reentrant": checkpointed(gpt2_model, use_reentrant=True),
    "llama_ckpt": checkpointed(llama_model),
}


def make(name, seed=0, device="cpu"):
    torch.manual_seed(seed)
    return MODELS[name]().to(device)


def batches(steps, global_batch, seed=1, device="cpu"):
    for tokens in sequences(steps, global_batch, seq=12, vocab=16, seed=seed):
        yield tokens.to(device)


def deterministic(device):
    """On a GPU, kernels that give the same bits every run and no TF32, so that zinf's run and
    the reference compute alike (as the CPU does by itself)."""
    if torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


LR = {"cnn_bn": 1e-2}  # a larger step for the CNN: its task is simple

def config(args, micro):
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0}
    if args.offload != "none":
        zero["offload_param"] = {"device": args.offload, "nvme_path": args.nvme_path}
        zero["offload_optimizer"] = {"device": "cpu"}
    return {"train_micro_batch_size_per_gpu": micro, "zero_optimization": zero,
            "optimizer": {"type": "AdamW",
                          "params": {"lr": LR.get(args.model, 1e-3), "weight_decay": 0.01}}}


def train(args):
    """(reference losses, zinf losses, engine, reference model); zinf's losses are the global
    batch's (the mean over ranks)."""
    micro = 4
    device = device_of(args)
    deterministic(device)
    engine = zinf.zero.initialize(make(args.model, device=device), config(args, micro),
                                  timeout_s=120)
    rank, world = engine.rank, engine.world_size
    ref = make(args.model, device=device)
    opt = torch.optim.AdamW(ref.parameters(), lr=LR.get(args.model, 1e-3), weight_decay=0.01)
    ref_losses, zinf_losses = [], []
    for tokens in batches(args.steps, micro * world, device=device):
        slices = [tokens[r * micro:(r + 1) * micro] for r in range(world)]
        opt.zero_grad()
        loss = sum(ref(s) for s in slices) / world
        loss.backward()
        opt.step()
        ref_losses.append(loss.item())

        loss = engine(slices[rank])
        engine.backward(loss)
        engine.step()
        zinf_losses.append(engine.mean_over_ranks(loss.item()))
    return ref_losses, zinf_losses, engine, ref


def resume_check(args):
    """The CNN's BatchNorm statistics go through a checkpoint: train, save, train on, load into
    a fresh model on every rank; its eval output must be rank 0's at the save, bitwise, and
    (one process) the reference's. None, or what differs."""
    args.model = "cnn_bn"
    save_dir = os.path.join(args.nvme_path or ".", "resume-ckpt")
    micro = 4
    device = device_of(args)
    deterministic(device)
    model = make(args.model, device=device)
    engine = zinf.zero.initialize(model, config(args, micro), timeout_s=120)
    rank, world = engine.rank, engine.world_size
    ref = make(args.model, device=device)
    opt = torch.optim.AdamW(ref.parameters(), lr=LR[args.model], weight_decay=0.01)
    probe = next(batches(1, 8, seed=7, device=device))
    data = batches(args.steps + 5, micro * world, device=device)
    for _ in range(args.steps):
        tokens = next(data)
        slices = [tokens[r * micro:(r + 1) * micro] for r in range(world)]
        opt.zero_grad()
        (sum(ref(s) for s in slices) / world).backward()
        opt.step()
        engine.backward(engine(slices[rank]))
        engine.step()
    with torch.no_grad():
        engine.eval()
        saved = engine(probe, logits=True)
        engine.train()
        ref.eval()
        want = ref(probe, logits=True)
    engine.save_checkpoint(save_dir, "step-10", {"step": args.steps})
    for _ in range(5):  # the statistics move on after the save
        engine.backward(engine(next(data)[rank * micro:(rank + 1) * micro]))
        engine.step()
    # One engine at a time: the first one's rendezvous store holds zinf's port. And a port of
    # its own for the second, since a rank that gets there first would otherwise find the
    # first store, not yet closed on rank 0, and its stale addresses: rank 0 picks a free one
    # and the first engine's collective tells the others (the mean of it and zeros).
    if world > 1:
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1] if rank == 0 else 0
            os.environ["ZINF_MASTER_PORT"] = str(round(engine.mean_over_ranks(port) * world))
    del engine, model
    gc.collect()
    fresh = make(args.model, seed=3, device=device)
    resumed = zinf.zero.initialize(fresh, config(args, micro), timeout_s=120)
    client = resumed.load_checkpoint(save_dir)
    if client != {"step": args.steps}:
        return f"client_state came back as {client}"
    with torch.no_grad():
        resumed.eval()
        got = resumed(probe, logits=True)
    stats = sum(b.double().abs().sum().item() for _, b in fresh.named_buffers())
    if abs(resumed.mean_over_ranks(stats) - stats) > 1e-9 * stats:
        return f"rank {rank}: the buffers after the load differ between ranks"
    if rank == 0 and not torch.equal(got, saved):
        return f"the eval output after resuming differs from the saved model's: {got} vs {saved}"
    if world == 1 and not torch.allclose(got, want, rtol=LOSS_RTOL, atol=1e-6):
        return f"the eval output after resuming differs from torch's: {got} vs {want}"
    return None


def device_of(args):
    """The device the models train on: cuda is cuda:LOCAL_RANK, as each rank's own GPU."""
    device = getattr(args, "device", "cpu")
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if device == "cuda" else device


def check(ref_losses, zinf_losses):
    for step, (a, b) in enumerate(zip(ref_losses, zinf_losses)):
        if not abs(a - b) <= LOSS_RTOL * abs(a):
            return (f"step {step}: torch loss {a:.8f}, zinf loss {b:.8f} "
                    f"(relative {abs(a - b) / abs(a):.2e} > {LOSS_RTOL})")
    first, last = sum(ref_losses[:5]) / 5, sum(ref_losses[-5:]) / 5
    if not last < first:
        return f"the model did not learn: mean loss of the first 5 steps {first:.4f}, last {last:.4f}"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--offload", choices=["none", "cpu", "nvme"], default="none")
    ap.add_argument("--nvme-path", default="")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where the models compute (cuda: cuda:LOCAL_RANK)")
    ap.add_argument("--resume-check", action="store_true",
                    help="the CNN's BatchNorm statistics through a checkpoint (resume_check)")
    args = ap.parse_args()
    if args.resume_check:
        args.steps = 10
        problem = resume_check(args)
        if problem:
            print(f"MISMATCH (resume): {problem}", file=sys.stderr)
            return 1
        print(f"[resume check] rank {os.environ.get('RANK', '0')} ok")
        return 0
    try:
        ref_losses, zinf_losses, _, _ = train(args)
    except SkipModel as e:
        print(f"SKIPPED: {e}")
        return SKIP
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        for step, (a, b) in enumerate(zip(ref_losses, zinf_losses)):
            print(f"step {step:2d}  torch {a:.8f}  zinf {b:.8f}")
    problem = check(ref_losses, zinf_losses)
    if problem:
        print(f"MISMATCH ({args.model}, {args.offload}): {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
