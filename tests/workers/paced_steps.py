"""Torch test worker: gloo all_reduce steps every 50 ms until stopped, each one logged.

Usage: paced_steps.py OUTDIR

On start writes OUTDIR/gen<DRUN_GENERATION>_rank<RANK>.json (pid, world size, GROUP_RANK); then
after every step appends "<unix time> <step> <world size> <generation>" to
OUTDIR/steps_rank<RANK>.log, so a test sees every pause in the training. Ends on SIGTERM; a
lost peer makes the all_reduce raise and the worker exits 1.
"""

import datetime
import os
import signal
import sys
import time

from atomic import write_json

import torch
import torch.distributed as dist


def main():
    outdir = sys.argv[1]
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=5))
    rank, world = dist.get_rank(), dist.get_world_size()
    g = os.environ.get("DRUN_GENERATION")
    write_json(os.path.join(outdir, f"gen{g}_rank{rank}.json"),
               {"pid": os.getpid(), "rank": rank, "world_size": world,
                "group_rank": int(os.environ["GROUP_RANK"])})
    step = 0
    with open(os.path.join(outdir, f"steps_rank{rank}.log"), "a", buffering=1) as log:
        while not stop:
            t = torch.ones(1)
            dist.all_reduce(t)
            step += 1
            log.write(f"{time.time():.3f} {step} {world} {g}\n")
            time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
