"""Torch hang worker: gloo all_reduce steps 50 ms apart, each announced with
``drun.progress(step)``. Rank 1 stops at step 20 inside ``stuck_here()`` forever (printing
``stuck`` first), so rank 0 blocks in that step's ``all_reduce`` until gloo's timeout (30 min).

With ``--pair`` every step also all-reduces a ``float[2, 3]`` on a second process group
(``group_desc="pair"``, both ranks), before the default group's ``all_reduce``.

With ``DRUN_TEST_HANG_HERE`` set, the ranks of the agents it is set to ``1`` for stop
instead of rank 1 (a test that gives the nodes different hang timeouts picks whose rank stops).

Usage: allreduce_hang.py [--pair]
"""

import datetime
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import drun  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def stuck_here():
    while True:
        time.sleep(3600)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    rank = dist.get_rank()
    pair = dist.new_group([0, 1], group_desc="pair") if "--pair" in sys.argv else None
    for step in range(1, 100000):
        if pair is not None:
            dist.all_reduce(torch.ones(2, 3), group=pair)
        here = os.environ.get("DRUN_TEST_HANG_HERE")
        stops = rank == 1 if here is None else here == "1"
        if stops and step == 20:
            print("stuck", flush=True)
            stuck_here()
        t = torch.ones(1)
        dist.all_reduce(t)
        drun.progress(step)
        time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
