#!/usr/bin/python3
"""Reference vectors for tests/cpu_optim/cpu_optimizer_test.cc, made with PyTorch.

Run with Debian's interpreter (python3-torch): /usr/bin/python3 cpu_optim_torch_ref.py
It writes cpu_optim_torch_ref.json beside itself. Each case: hyper-parameters, initial params
and state, the raw gradients of every step and the grad_scale applied to them, and params and
state after every step. AdamW, Adam and Adagrad run through torch.optim; where torch has no
switch (Adam/AdamW without bias correction) or no optimizer (Lion), the case runs the same
torch tensor ops torch.optim uses, with the bias corrections taken as 1, or Lion's published
update rule (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2).
bf16/fp16-gradient cases convert the gradients with torch and step on their fp32 values;
the expected param copies are torch's .to(bfloat16/float16) of the new params.
"""
import json
import math
import os

import torch

N = 33      # four AVX2 vectors plus a tail element
STEPS = 5


def f32_list(t):
    return [float(x) for x in t.detach().float().reshape(-1).tolist()]


def u16_list(t):
    return [int(x) & 0xFFFF for x in t.view(torch.int16).reshape(-1).tolist()]


def manual_adam(p, m, v, g, step, hp, decoupled):
    lr, (b1, b2), eps, wd = hp["lr"], (hp["beta1"], hp["beta2"]), hp["eps"], hp["weight_decay"]
    if decoupled:
        p.mul_(1 - lr * wd)
    elif wd != 0:
        g = g.add(p, alpha=wd)
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    if hp["bias_correction"]:
        bc1 = 1 - b1 ** step
        bc2 = 1 - b2 ** step
    else:
        bc1 = bc2 = 1.0
    step_size = lr / bc1
    denom = (v.sqrt() / math.sqrt(bc2)).add_(eps)
    p.addcdiv_(m, denom, value=-step_size)


def lion(p, m, g, hp):
    lr, b1, b2, wd = hp["lr"], hp["beta1"], hp["beta2"], hp["weight_decay"]
    p.mul_(1 - lr * wd)
    update = m.clone().mul_(b1).add(g, alpha=1 - b1).sign_()
    p.add_(update, alpha=-lr)
    m.mul_(b2).add_(g, alpha=1 - b2)


def run_case(name, hp, seed, grad_type="fp32", copy_type=None, grad_scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    p = torch.randn(N, generator=gen, dtype=torch.float32)
    kind = hp["type"]
    if kind == "adagrad":
        s0 = torch.full((N,), float(hp["initial_accumulator_value"]), dtype=torch.float32)
    else:
        s0 = torch.zeros(N, dtype=torch.float32)
    s1 = torch.zeros(N, dtype=torch.float32)
    case = {"name": name, "hp": hp, "grad_type": grad_type, "copy_type": copy_type,
            "grad_scale": grad_scale, "init_params": f32_list(p), "init_state0": f32_list(s0),
            "init_state1": f32_list(s1), "steps": []}

    param = torch.nn.Parameter(p.clone())
    opt = None
    use_torch = (kind in ("adamw", "adam") and hp["bias_correction"]) or kind == "adagrad"
    if use_torch and kind == "adamw":
        opt = torch.optim.AdamW([param], lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]),
                                eps=hp["eps"], weight_decay=hp["weight_decay"])
    elif use_torch and kind == "adam":
        opt = torch.optim.Adam([param], lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]),
                               eps=hp["eps"], weight_decay=hp["weight_decay"])
    elif use_torch and kind == "adagrad":
        opt = torch.optim.Adagrad([param], lr=hp["lr"], lr_decay=hp["lr_decay"],
                                  weight_decay=hp["weight_decay"], eps=hp["eps"],
                                  initial_accumulator_value=hp["initial_accumulator_value"])
    m, v = s0.clone(), s1.clone()
    for step in range(1, STEPS + 1):
        raw = torch.randn(N, generator=gen, dtype=torch.float32) * (0.1 * step)
        if step == 3:
            raw[5] = 0.0  # a zero gradient (Lion's sign(0) = 0)
        if grad_type == "bf16":
            stored = raw.to(torch.bfloat16)
        elif grad_type == "fp16":
            stored = raw.to(torch.float16)
        else:
            stored = raw
        g = stored.float() * torch.tensor(grad_scale, dtype=torch.float32)  # unscale, as GradScaler
        entry = {"grads": f32_list(stored) if grad_type == "fp32" else u16_list(stored)}
        if opt is not None:
            param.grad = g.clone()
            opt.step()
            st = opt.state[param]
            newp = param.detach()
            if kind == "adagrad":
                entry["state0"] = f32_list(st["sum"])
            else:
                entry["state0"] = f32_list(st["exp_avg"])
                entry["state1"] = f32_list(st["exp_avg_sq"])
        else:
            with torch.no_grad():
                if kind == "lion":
                    lion(param.data, m, g, hp)
                    entry["state0"] = f32_list(m)
                else:
                    manual_adam(param.data, m, v, g, step, hp, decoupled=(kind == "adamw"))
                    entry["state0"] = f32_list(m)
                    entry["state1"] = f32_list(v)
            newp = param.detach()
        entry["params"] = f32_list(newp)
        if copy_type == "bf16":
            entry["copy"] = u16_list(newp.to(torch.bfloat16))
        elif copy_type == "fp16":
            entry["copy"] = u16_list(newp.to(torch.float16))
        case["steps"].append(entry)
    return case


def hp(kind, **kw):
    base = {"type": kind, "lr": 1e-2, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
            "weight_decay": 0.0, "bias_correction": True, "lr_decay": 0.0,
            "initial_accumulator_value": 0.0}
    if kind == "adagrad":
        base["eps"] = 1e-10
    if kind == "lion":
        base.update(lr=1e-3, beta2=0.99)
    base.update(kw)
    return base


def main():
    torch.set_num_threads(1)
    cases = [
        run_case("adamw_bc_wd", hp("adamw", weight_decay=0.01), 1),
        run_case("adamw_nobc_wd", hp("adamw", weight_decay=0.1, bias_correction=False), 2),
        run_case("adamw_scaled_bf16copy", hp("adamw", lr=3e-3, beta2=0.95, weight_decay=0.05), 3,
                 copy_type="bf16", grad_scale=1.0 / 1024.0),
        run_case("adamw_bf16grad_fp16copy", hp("adamw", weight_decay=0.01), 4,
                 grad_type="bf16", copy_type="fp16"),
        run_case("adam_bc", hp("adam"), 5),
        run_case("adam_bc_l2", hp("adam", weight_decay=0.05, eps=1e-6), 6),
        run_case("adam_nobc_l2_fp16grad", hp("adam", weight_decay=0.01, bias_correction=False), 7,
                 grad_type="fp16"),
        run_case("adagrad", hp("adagrad"), 8),
        run_case("adagrad_decay_l2_init", hp("adagrad", lr=5e-2, lr_decay=0.01, weight_decay=0.01,
                                               initial_accumulator_value=0.1), 9),
        run_case("lion_wd", hp("lion", weight_decay=0.1), 10),
        run_case("lion_bf16grad_bf16copy", hp("lion", lr=3e-4, beta1=0.95, beta2=0.98), 11,
                 grad_type="bf16", copy_type="bf16"),
    ]
    out = {"generator": "tests/data/cpu_optim_torch_ref.py", "torch": torch.__version__,
           "n": N, "steps": STEPS, "cases": cases}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_optim_torch_ref.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
