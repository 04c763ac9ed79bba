"""Torch test worker: one gloo all_reduce, recorded, then idle until stopped.

Usage: allreduce.py OUTDIR LABEL

Joins the process group (env://), all-reduces RANK + 1 over the world, prints the sum with its
RANK and GROUP_RANK, and writes OUTDIR/gen<DRUN_GENERATION>_rank<RANK>.json with its pid, LABEL,
RANK, GROUP_RANK, WORLD_SIZE and the sum (the same record layout as elastic.py, plus
"allreduce"). Then it sleeps, out of any collective, until SIGTERM/SIGINT and exits 0.
"""

import os
import signal
import sys
import time

from atomic import write_json

import torch
import torch.distributed as dist


def main():
    outdir, label = sys.argv[1], sys.argv[2]
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    env = os.environ
    total = int(t.item())
    print(f"all_reduce={total} RANK={env['RANK']} GROUP_RANK={env['GROUP_RANK']}", flush=True)
    record = {
        "pid": os.getpid(),
        "label": label,
        "rank": env["RANK"],
        "group_rank": env["GROUP_RANK"],
        "world_size": env["WORLD_SIZE"],
        "generation": env.get("DRUN_GENERATION"),
        "allreduce": total,
    }
    path = os.path.join(outdir, f"gen{env.get('DRUN_GENERATION')}_rank{env['RANK']}.json")
    write_json(path, record)
    deadline = time.monotonic() + 600
    while not stop and time.monotonic() < deadline:
        time.sleep(0.05)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
