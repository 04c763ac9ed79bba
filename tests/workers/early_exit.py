"""Test worker (needs torch): rank 0 leaves right after the last collective while the other
ranks still use the c10d store.

Usage: early_exit.py OUTDIR

A gloo process group through env:// (as any torchrun script), one all_reduce, then a final
barrier. Rank 0 exits at once (os._exit: no teardown that could wait for the others). The
other ranks sleep 1 s, then use the group's store: a get of a key rank 0 set, an add, and a
store barrier among themselves. That works only if the store outlives rank 0, i.e. when the
agent hosts it (TORCHELASTIC_USE_AGENT_STORE=True). Each rank that finishes writes
OUTDIR/early_<RANK>.json.
"""

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    out = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        store.set("said_by_rank0", b"hello")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world, t
    dist.barrier()
    if rank == 0:
        os._exit(0)
    time.sleep(1.0)
    said = store.get("said_by_rank0")
    late = store.add("late", 1)
    store.barrier("others_done", world - 1)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"early_{rank}.json"), "w") as f:
        json.dump({"rank": rank, "said": said.decode(), "late": late,
                   "agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE")}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
