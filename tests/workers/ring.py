"""Torch test worker: a gloo all_reduce every 0.2 s with a 30-minute collective timeout.

Usage: ring.py OUTDIR

Stands in for a NCCL job that hangs when a peer vanishes: if a peer dies, the others block in
all_reduce (up to 30 minutes) until their launcher stops them. On start writes
OUTDIR/gen<DRUN_GENERATION>_rank<RANK>.json with its pid and WORLD_SIZE.
"""

import datetime
import os
import sys
import time

from atomic import write_json

import torch
import torch.distributed as dist


def main():
    outdir = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    rank = dist.get_rank()
    env = os.environ
    path = os.path.join(outdir, f"gen{env.get('DRUN_GENERATION')}_rank{rank}.json")
    write_json(path, {"pid": os.getpid(), "rank": str(rank), "world_size": str(dist.get_world_size())})
    t = torch.ones(4)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        dist.all_reduce(t)
        time.sleep(0.2)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
