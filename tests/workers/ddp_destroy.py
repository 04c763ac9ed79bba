"""Test worker (needs torch): an unmodified DDP script that ends with a plain
destroy_process_group() and returns, as most training scripts do (no os._exit).

Usage: ddp_destroy.py

Used by the worker-store stress loop: when worker rank 0 hosts the c10d store
(--worker-store rank0) and leaves first, a peer can abort at exit ("terminate called
without an active exception"); with the agent hosting it (the default) it must not.
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
