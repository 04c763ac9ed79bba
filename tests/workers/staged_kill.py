"""Torch worker for tests/ckpt/memory.rs: a rank killed in the middle of a staged save written
over its spare staging memory. The first generation saves and commits step 1 (both ranks), then
rank 1 SIGKILLs itself halfway through ``torch.save`` of step 2, over its spare; rank 0 saves
step 2 and waits in its commit. The restarted generation writes CKPT_OUT/rank<R>.json: the step
it resumes from, and what it loads from it."""

import json
import os
import signal
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import drun  # noqa: E402
from drun import _ledger  # noqa: E402

rank = int(os.environ["RANK"])


def state_of(step):
    return {"w": torch.arange(200_000, dtype=torch.float32) + step * 1000 + rank}


class DiesHalfway:
    """The file torch.save writes to, until half of ``total`` bytes went through: then SIGKILL."""

    def __init__(self, f, total):
        self.f, self.left = f, total // 2

    def write(self, b):
        n = len(memoryview(b).cast("B"))
        if n >= self.left:
            self.f.write(memoryview(b).cast("B")[:self.left])
            os.kill(os.getpid(), signal.SIGKILL)
        self.left -= n
        return self.f.write(b)

    def __getattr__(self, name):
        return getattr(self.f, name)


info = drun.resume_info()
if info is not None:
    got = torch.load(os.path.join(info["path"], "rank%d.pt" % rank), weights_only=True)["w"]
    with open(os.path.join(os.environ["CKPT_OUT"], "rank%d.json" % rank), "w") as f:
        json.dump({"resumed": info["step"],
                   "equal": bool(torch.equal(got, state_of(info["step"])["w"]))}, f)
    sys.exit(0)

path = drun.shard_path(1)
drun.atomic_save(path, lambda f: torch.save(state_of(1), f))
assert drun.commit(1, [path])["staged"]
_ledger.STATE.spare.thread.join()
assert _ledger.STATE.spare.ready is not None, "rank %d has its spare staging memory ready" % rank
path = drun.shard_path(2)
if rank == 1:
    size = os.path.getsize(_ledger._staged_place(drun.shard_path(1)))
    drun.atomic_save(path, lambda f: torch.save(state_of(2), DiesHalfway(f, size)))
drun.atomic_save(path, lambda f: torch.save(state_of(2), f))
drun.commit(2, [path])
sys.exit("rank %d: the commit of step 2 returned without rank 1" % rank)
