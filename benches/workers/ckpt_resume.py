"""Benchmark worker (benches/ckpt.rs part 4, torch): a worker failure right after a staged save,
then the restarted ranks' load of the state: from the agent's memory (the resume point drun
hands them) and, in the same rank, from the persisted copy in ``--ckpt-dir`` with its pages
dropped from the page cache first (``POSIX_FADV_DONTNEED`` on that file only), so it is read
from the disk, then from memory once more. Argument: MB per rank. Rank 0 prints one JSON line
after the restart."""

import json
import os
import sys
import time

sys.path.insert(0, os.environ["DRUN_BENCH_HELPER"])
import drun  # noqa: E402
import torch  # noqa: E402

mb = int(sys.argv[1])
rank = int(os.environ["RANK"])
info = drun.resume_info()
if info is None:
    state = {"w": torch.randn(mb * (1 << 18))}
    path = drun.shard_path(1)
    drun.atomic_save(path, lambda f: torch.save(state, f))
    drun.commit(1, [path])
    if rank == 1:
        sys.exit(3)  # the failure: the agent restarts both ranks from step 1
    time.sleep(600)
    sys.exit(0)

name = "rank%d.pt" % rank
t = time.perf_counter()
got = torch.load(os.path.join(info["path"], name), weights_only=True)["w"]
memory = time.perf_counter() - t
total = float(got.double().sum())
del got  # one copy of the state at a time: 1 GiB per rank, 2 ranks on one node
stage = os.environ.get("DRUN_CKPT_STAGE_DIR") or ""
from_memory = bool(stage) and os.path.abspath(info["path"]).startswith(os.path.abspath(stage))
with open(info["manifest"]) as f:
    files = json.load(f)["files"]
disk = next(x["path"] for x in files if os.path.basename(x["path"]) == name)
fd = os.open(disk, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
os.close(fd)
t = time.perf_counter()
again = torch.load(disk, weights_only=True)["w"]
cold = time.perf_counter() - t
assert float(again.double().sum()) == total
del again
# Memory once more: the first load of the process also paid for allocating the tensor's memory.
t = time.perf_counter()
torch.load(os.path.join(info["path"], name), weights_only=True)
memory_again = time.perf_counter() - t
if rank == 0:
    print(json.dumps({"memory": memory, "from_memory": from_memory, "disk": cold,
                      "memory_again": memory_again, "load": os.getloadavg()[0]}), flush=True)
