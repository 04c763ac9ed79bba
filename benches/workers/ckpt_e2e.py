"""A short checkpointing training for the end-to-end benchmark of checkpoints in memory
(docs/contributing/benchmarks.md, "Checkpoints in memory at the default, end to end"): run it
under `drun --standalone --nproc-per-node 2 --ckpt-dir DIR`; gloo on CPU, a model whose state is
E2E_STATE_MB per rank (default 32), E2E_STEPS steps (40), a save every E2E_EVERY steps (10)
through drun.atomic_save + drun.commit. Prints per rank how long the saves blocked the training.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import drun  # noqa: E402

MB = int(os.environ.get("E2E_STATE_MB", "32"))
STEPS = int(os.environ.get("E2E_STEPS", "40"))
EVERY = int(os.environ.get("E2E_EVERY", "10"))

dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.nn.Parameter(torch.zeros(MB * (1 << 20) // 4))
opt = torch.optim.SGD([w], lr=0.1)
blocked = 0.0
for step in range(1, STEPS + 1):
    loss = (w[:1024] - 1.0).pow(2).sum()
    opt.zero_grad()
    loss.backward()
    head = w.grad[:1024].contiguous()
    dist.all_reduce(head)
    w.grad[:1024] = head / dist.get_world_size()
    opt.step()
    if step % EVERY == 0:
        t = time.monotonic()
        path = drun.shard_path(step)
        drun.atomic_save(path, lambda f: torch.save({"w": w.detach()}, f))
        drun.commit(step, [path], {"epoch": 0, "consumed_in_epoch": 2 * step, "global_batch": 2})
        blocked += time.monotonic() - t
print("rank %d: saves blocked the training %.3f s" % (rank, blocked), flush=True)
dist.destroy_process_group()
