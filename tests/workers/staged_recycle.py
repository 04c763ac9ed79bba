"""Stdlib worker for tests/ckpt/memory.rs: five staged saves of raw bytes, each sealed (so on
disk) before the next, under a budget that holds two steps: from the third save on the agent
releases the oldest, and its files become the ranks' spares. Reports, per save, the inode of
the rank's spare before it (``None``: no spare) and of the step's staged file, and whether the
persisted copy holds exactly the bytes saved (a smaller save over a larger released file is cut
to its own size). Writes CKPT_OUT/rank<R>.json."""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import drun  # noqa: E402
from drun import _ledger  # noqa: E402

rank = int(os.environ["RANK"])
gen = int(os.environ["DRUN_GENERATION"])
spare = os.path.join(os.environ["DRUN_CKPT_STAGE_DIR"], ".spare-rank%d" % rank)
MIB = 1 << 20
sizes = [MIB, MIB, MIB, MIB, MIB // 2]
report = {"spare_ino": [], "staged_ino": [], "equal": []}

for step, n in enumerate(sizes, start=1):
    t = _ledger.STATE.spare.thread
    if t is not None:
        t.join()  # the spare prepared after the last commit
    report["spare_ino"].append(os.stat(spare).st_ino if os.path.exists(spare) else None)
    blob = bytes([step * 16 + rank]) * n
    path = drun.shard_path(step)
    drun.atomic_save(path, lambda f: f.write(blob))
    staged = _ledger._staged_place(path)
    assert staged is not None
    report["staged_ino"].append(os.stat(staged).st_ino)
    answer = drun.commit(step, [path])
    assert answer and answer.get("staged"), answer
    manifest = os.path.join(os.path.dirname(path), "drun-manifest-%d-%d.json" % (step, gen))
    deadline = time.time() + 60
    while not os.path.exists(manifest):
        if time.time() > deadline:
            sys.exit("step %d was not sealed within 60 s" % step)
        time.sleep(0.02)
    with open(path, "rb") as f:
        report["equal"].append(f.read() == blob)

with open(os.path.join(os.environ["CKPT_OUT"], "rank%d.json" % rank), "w") as f:
    json.dump(report, f)
