"""Torch test worker: gloo all_reduce steps, 0.1 s apart, each announced to drun with
``drun.progress(step, samples=8)`` (the step beacon behind drun's per-rank step-time metrics),
until OUTDIR/release exists (its test writes it once its scrapes saw what they wait for, however
loaded the machine), then a clean exit.

Usage: beacon_steps.py OUTDIR

On start writes OUTDIR/gen<DRUN_GENERATION>_rank<RANK>.json with its pid and world size. A lost
peer makes the all_reduce raise (gloo: connection closed/reset), and the worker exits 1.
"""

import datetime
import os
import sys
import time

from atomic import write_json

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import drun  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main():
    outdir = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=5))
    rank, world = dist.get_rank(), dist.get_world_size()
    g = os.environ.get("DRUN_GENERATION")
    write_json(os.path.join(outdir, f"gen{g}_rank{rank}.json"),
               {"pid": os.getpid(), "rank": rank, "world_size": world})
    release = os.path.join(outdir, "release")
    step = 0
    while True:
        step += 1
        # The step's all_reduce carries whether this rank saw the release: every rank stops
        # after the same step.
        t = torch.tensor([float(os.path.exists(release))])
        dist.all_reduce(t)
        drun.progress(step, samples=8)
        if t.item() > 0:
            break
        time.sleep(0.1)
    print(f"done gen={g} rank={rank} world={world}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
