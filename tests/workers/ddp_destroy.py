"""Test worker (needs torch): an unmodified DDP script that ends with a plain
destroy_process_group() and returns, as most training scripts do (no os._exit).

Usage: ddp_destroy.py

Used by the worker-store stress loop and the --preflight tests. torch itself (2.15, gloo) can
abort such a script at interpreter exit ("terminate called without an active exception"): a
gloo worker thread drops the last reference to a finished Work that holds a Python object (the
context autograd stashes during backward, where DDP's all-reduces start), and if that happens
once finalization began, taking the GIL ends the thread inside a noexcept destructor. It is as
likely under torchrun as under drun (about 1 run in 10-20 on a loaded 2-core machine).
"""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        x = torch.randn(16, 8)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
