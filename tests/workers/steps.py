"""Torch test worker: STEPS gloo all_reduce steps, 0.1 s apart, then a clean exit.

Usage: steps.py OUTDIR STEPS

After its first all_reduce writes OUTDIR/gen<DRUN_GENERATION>_rank<RANK>.json with its pid,
world size, GROUP_RANK and when that all_reduce completed (first_all_reduce_at, Unix seconds);
after the last step prints "done gen=<g> rank=<r> world=<w> sum=<all_reduce of 1s>".
A lost peer makes the all_reduce raise (gloo: connection closed/reset), and the worker exits 1.
"""

import datetime
import os
import sys
import time

from atomic import write_json

import torch
import torch.distributed as dist


def main():
    outdir, steps = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=5))
    rank, world = dist.get_rank(), dist.get_world_size()
    g = os.environ.get("DRUN_GENERATION")
    path = os.path.join(outdir, f"gen{g}_rank{rank}.json")
    t = torch.ones(1)
    for step in range(steps):
        t = torch.ones(1)
        dist.all_reduce(t)
        if step == 0:
            write_json(path, {"pid": os.getpid(), "rank": rank, "world_size": world,
                              "group_rank": int(os.environ["GROUP_RANK"]),
                              "first_all_reduce_at": time.time()})
        time.sleep(0.1)
    print(f"done gen={g} rank={rank} world={world} sum={int(t.item())}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
