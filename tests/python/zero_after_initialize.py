"""Parameters after zinf.zero.initialize, on every rank: the ranks start from rank 0's values
(each rank seeds torch differently here), GatheredParameters gathers them for reading and,
with modifier_rank, writes that rank's values into every rank's shards; outside it reading a
parameter raises, naming what to call; state_dict() gives the values on one rank and refuses on
several, naming what to call.

Run alone or under the launcher, from the repository root:
    PYTHONPATH=build/python build/bin/zinf run -n 2 -- /usr/bin/python3 \\
        tests/python/zero_after_initialize.py [--offload none|cpu|nvme] [--nvme-path DIR]
Exits non-zero, saying what, when something differs.
"""

import argparse
import copy
import os
import sys

import torch

import zero_train
import zinf
import zinf.zero


def check(args):
    rank = int(os.environ.get("RANK", "0"))
    # Each rank its own seed: DeepSpeed broadcasts rank 0's values, and so does zinf.
    model = zero_train.make_model(seed=rank)
    engine = zinf.zero.initialize(model, zero_train.config(args, 4), timeout_s=60)
    world = engine.world_size
    expected = dict(zero_train.make_model(seed=0).named_parameters())
    for name, value in engine.gather_parameters().items():
        if not torch.equal(value, expected[name].detach()):
            return f"'{name}' is not rank 0's value after initialize"

    weight = model.head.weight
    if engine.parameters_resident:
        # Note [Resident parameters]: the values are the parameters' own, readable anywhere.
        if not torch.equal(weight.detach(), expected["head.weight"].detach()):
            return "a resident parameter does not read as its value"
        return check_blocks(engine, model, expected, world, rank)
    # Outside any fetch nothing reads as values (Note [Released parameters raise]); what needs
    # none still answers.
    if tuple(weight.shape) != tuple(expected["head.weight"].shape) or not weight.requires_grad:
        return f"a released parameter's shape or requires_grad changed: {tuple(weight.shape)}"
    if not weight.type().endswith("FloatTensor") or weight.float() is not weight:
        return "a released parameter's type() or a conversion that changes nothing failed"
    for what, read in (("an op", lambda: weight * 2), ("data", lambda: weight.data),
                       ("a detached copy", lambda: weight.detach().clone()),
                       ("numpy", lambda: weight.detach().numpy()),
                       ("a deep copy", lambda: copy.deepcopy(model.head)),
                       ("F.linear", lambda: torch.nn.functional.linear(
                           torch.zeros(1, weight.shape[1]), weight))):
        try:
            read()
            return f"outside any fetch {what} of the parameter read values"
        except zinf.ParameterNotGatheredError as e:
            if "'head.weight'" not in str(e) or "GatheredParameters" not in str(e):
                return f"the refusal to read {what} does not say what to call: {e}"
    return check_blocks(engine, model, expected, world, rank)


def check_blocks(engine, model, expected, world, rank):
    """GatheredParameters, its write-back, state_dict and a step after them."""
    weight = model.head.weight
    with zinf.zero.GatheredParameters([weight, model.embed.weight]):
        if not torch.equal(weight, expected["head.weight"].detach()):
            return "GatheredParameters did not give the value"
    with zinf.zero.GatheredParameters(model.head.parameters(), modifier_rank=world - 1):
        weight.data.fill_(float(rank + 1))  # only the modifier rank's write counts
    with zinf.zero.GatheredParameters([weight]):
        if not (weight == float(world)).all():
            return f"after the write-back the weight reads {weight.unique().tolist()}"
        state = model.head.state_dict()  # a gathered parameter is there as it is
        if not (state["weight"] == float(world)).all():
            return "state_dict() inside GatheredParameters did not give the gathered value"
    if not (engine.gather_parameters()["head.weight"] == float(world)).all():
        return "the write-back did not reach the engine's shards"

    if world > 1:
        try:
            model.state_dict()
            return "state_dict() on several ranks gave values it cannot have"
        except RuntimeError as e:
            if "consolidated_state_dict" not in str(e) or "embed.weight" not in str(e):
                return f"state_dict()'s refusal does not say what to call: {e}"
    else:
        state = model.state_dict()
        if not (state["head.weight"] == 1.0).all() or torch.isnan(state["embed.weight"]).any():
            return "state_dict() on one rank did not give the values"
    full = engine.consolidated_state_dict()
    if not (full["head.weight"] == float(world)).all():
        return "consolidated_state_dict() differs from the written value"

    tokens, targets = next(zero_train.batches(1, 4))
    engine.backward(zero_train.lm_loss(engine(tokens), targets))
    engine.step()  # training goes on from the written values
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--offload", choices=["none", "cpu", "nvme"], default="none")
    ap.add_argument("--nvme-path", default="")
    args = ap.parse_args()
    args.accum = 1
    problem = check(args)
    if problem:
        print(f"MISMATCH: {problem}", file=sys.stderr)
        return 1
    print(f"parameters after initialize: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
