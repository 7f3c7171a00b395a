"""The training loop of DeepSpeed's getting-started guide, with X = zinf or X = deepspeed
(--backend): the same text runs on either. A model whose forward returns the loss, trained on a
dataset through the loader X.initialize returns; a checkpoint with client_state at --save-step;
then the checkpoint is loaded and the steps after it are trained again, as the guide's
"load_checkpoint ... advance data loader to ckpt step" resume does. Prints one JSON line per
rank: the losses, the learning rate of each optimizer step, the losses after the resume, the
step its client_state held, the engine's batch figures.

    PYTHONPATH=build/python build/bin/zinf run -n 2 -- python3 tests/python/initialize_train.py \\
        --backend zinf --deepspeed_config CONFIG --save_dir DIR

One process needs RANK=0 WORLD_SIZE=1 MASTER_ADDR MASTER_PORT for deepspeed (its
init_distributed); zinf runs alone without them.
"""

import argparse
import importlib
import json
import sys

import torch
import torch.nn.functional as F


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, batch):
        x, y = batch
        return F.cross_entropy(self.fc2(torch.tanh(self.fc1(x))), y)


def dataset(samples):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(samples, 8, generator=g)
    y = (x[:, :4].argmax(dim=1) + (x[:, 4] > 0).long()) % 4
    return torch.utils.data.TensorDataset(x, y)


def main():
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--backend", choices=["zinf", "deepspeed"], required=True)
    X = importlib.import_module(first.parse_known_args()[0].backend)

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=["zinf", "deepspeed"], required=True)
    parser.add_argument("--save_dir", required=True)
    parser.add_argument("--save_step", type=int, default=3)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--device", default="cpu", help="where the model is put before "
                        "initialize (cuda: its GPU, where zinf's engine then runs)")
    parser = X.add_config_arguments(parser)
    args = parser.parse_args()

    torch.manual_seed(0)
    net = Net().to(args.device)
    # ---- DeepSpeed's getting-started loop, the same text for X = zinf and X = deepspeed ----
    model_engine, optimizer, data_loader, _ = X.initialize(
        args=args, model=net, model_parameters=net.parameters(), training_data=dataset(args.samples))

    losses, lrs = [], []
    for step, batch in enumerate(data_loader):
        batch = [t.to(model_engine.device) for t in batch]
        # forward() method
        loss = model_engine(batch)
        # runs backpropagation
        model_engine.backward(loss)
        if model_engine.is_gradient_accumulation_boundary():
            lrs.append(model_engine.get_lr()[0])  # what this step applies
        # weight update
        model_engine.step()
        losses.append(loss.item())
        # save checkpoint
        if step == args.save_step:
            client_sd = {"step": step}
            model_engine.save_checkpoint(args.save_dir, client_state=client_sd)

    # load checkpoint
    _, client_sd = model_engine.load_checkpoint(args.save_dir)
    ckpt_step = client_sd["step"]
    resumed = []
    for step, batch in enumerate(data_loader):
        # advance data loader to ckpt step
        if step <= ckpt_step:
            continue
        batch = [t.to(model_engine.device) for t in batch]
        loss = model_engine(batch)
        model_engine.backward(loss)
        model_engine.step()
        resumed.append(loss.item())
    # ---- end of the loop ----

    print(json.dumps({
        "rank": model_engine.global_rank, "losses": losses, "lrs": lrs, "resumed": resumed,
        "client_state": client_sd, "global_steps": model_engine.global_steps,
        "train_batch_size": model_engine.train_batch_size(),
        "micro_batch": model_engine.train_micro_batch_size_per_gpu(),
        "gradient_accumulation_steps": model_engine.gradient_accumulation_steps(),
        "batches": len(data_loader)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
