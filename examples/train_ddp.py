"""Small but real PyTorch DDP training job (gloo, CPU) used to exercise drun.

Runs unchanged under torchrun or drun, e.g.:

    torchrun --standalone --nproc-per-node 2 examples/train_ddp.py

It fits an MLP to a deterministic synthetic regression dataset, prints the
all-reduced loss from rank 0, and saves a final checkpoint to <out>/final.pt.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

NUM_SAMPLES = 4096
NUM_FEATURES = 16
DATA_SEED = 1234
MODEL_SEED = 0
LOG_EVERY = 20


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10,
                        help="number of passes over the dataset")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="per-rank batch size")
    parser.add_argument("--lr", type=float, default=0.05,
                        help="SGD learning rate")
    parser.add_argument("--out", default="checkpoints",
                        help="directory for the final checkpoint")
    return parser.parse_args()


def make_dataset():
    """Deterministic regression targets from a fixed nonlinear function plus noise."""
    gen = torch.Generator().manual_seed(DATA_SEED)
    x = torch.randn(NUM_SAMPLES, NUM_FEATURES, generator=gen)
    w = torch.randn(NUM_FEATURES, 1, generator=gen) / NUM_FEATURES ** 0.5
    y = torch.tanh(x @ w) * 2.0 + 0.5 * (x[:, :1] * x[:, 1:2])
    y = y + 0.05 * torch.randn(NUM_SAMPLES, 1, generator=gen)
    return TensorDataset(x, y)


def make_model():
    torch.manual_seed(MODEL_SEED)  # identical init on every rank
    return nn.Sequential(
        nn.Linear(NUM_FEATURES, 64),
        nn.ReLU(),
        nn.Linear(64, 64),
        nn.ReLU(),
        nn.Linear(64, 1),
    )


@record
def main():
    args = parse_args()
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)

    dist.init_process_group(backend="gloo", init_method="env://")
    rank = dist.get_rank()
    world_size = dist.get_world_size()

    dataset = make_dataset()
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank,
                                 shuffle=True, seed=DATA_SEED, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                        drop_last=True)

    model = DistributedDataParallel(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.MSELoss()

    step = 0
    first_loss = None
    last_loss = None
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1

            is_first = first_loss is None
            if is_first or step % LOG_EVERY == 0:
                mean_loss = loss.detach().clone()
                dist.all_reduce(mean_loss, op=dist.ReduceOp.SUM)
                value = mean_loss.item() / world_size
                if is_first:
                    first_loss = value
                last_loss = value
                if rank == 0:
                    print(f"step={step} epoch={epoch} loss={value:.6f}", flush=True)

    # Final loss: all-reduced mean of the last batch loss, whatever the step.
    if step > 0 and step % LOG_EVERY != 0:
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss, op=dist.ReduceOp.SUM)
        last_loss = mean_loss.item() / world_size

    if rank == 0:
        first = float("nan") if first_loss is None else first_loss
        last = float("nan") if last_loss is None else last_loss
        print(f"done steps={step} first_loss={first:.6f} last_loss={last:.6f} "
              f"world_size={world_size}", flush=True)
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "final.pt")
        tmp = path + ".tmp"
        torch.save({"model": model.module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "step": step}, tmp)
        os.replace(tmp, path)

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Everything is saved and the group is destroyed. Leave without running C++ static
    # destructors: when worker rank 0 hosts the c10d store (TORCHELASTIC_USE_AGENT_STORE=False,
    # as under drun) and exits first, a peer's store client thread can abort in its destructor
    # ("terminate called without an active exception") although all work succeeded.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
