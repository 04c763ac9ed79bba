"""Stdlib worker for the --ckpt-interval test: steps until killed, asks drun.should_save() every
step and saves only when drun asks; a save takes SAVE_SECONDS. Logs every event as a JSON line
to $CKPT_OUT/events.jsonl.

The ranks agree on should_save() the way drun.should_save(sync=True) does under
torch.distributed (all_reduce MAX over the ranks, every step): here over files in
$CKPT_OUT/ar/, one per (generation, step, rank), so every rank decides the same at the same step.

Environment: CKPT_OUT (required), STEP_SECONDS (0.05), SAVE_SECONDS (0.5).
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import drun  # noqa: E402

OUT = os.environ["CKPT_OUT"]
RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
GEN = int(os.environ.get("DRUN_GENERATION", "0"))
STEP = float(os.environ.get("STEP_SECONDS", "0.05"))
SAVE = float(os.environ.get("SAVE_SECONDS", "0.5"))
GB = 8
AR = os.path.join(OUT, "ar")
os.makedirs(AR, exist_ok=True)


def log(event, **kw):
    kw.update(event=event, rank=RANK, gen=GEN, pid=os.getpid(), t=time.time())
    fd = os.open(os.path.join(OUT, "events.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, (json.dumps(kw) + "\n").encode())
    os.close(fd)


def all_reduce_max(step, flag):
    """MAX of every rank's flag for this step (blocks until every rank posted it)."""
    name = os.path.join(AR, "g%d-s%d-r%d" % (GEN, step, RANK))
    with open(name + ".tmp", "w") as f:
        f.write("1" if flag else "0")
    os.replace(name + ".tmp", name)
    got = False
    for r in range(WORLD):
        path = os.path.join(AR, "g%d-s%d-r%d" % (GEN, step, r))
        while not os.path.exists(path):
            time.sleep(0.002)
        with open(path) as f:
            got = got or f.read() == "1"
    return got


info = drun.resume_info()
step = info["step"] if info else 0
log("start", resume_step=step)
while True:
    step += 1
    time.sleep(STEP)
    drun.progress(step)
    if not all_reduce_max(step, drun.should_save(sync=False)):
        continue
    log("save", step=step)
    path = drun.shard_path(step)

    def write(f):
        f.write(b"x" * 1024)
        time.sleep(SAVE)

    drun.atomic_save(path, write)
    answer = drun.commit(step, [path], {"epoch": 0, "consumed_in_epoch": step * GB,
                                        "global_batch": GB})
    log("committed", step=step, sealed=answer["sealed"])
