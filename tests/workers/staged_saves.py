"""Torch worker for tests/ckpt/memory.rs: staged saves of states that shrink and grow
(a save written over the spare staging memory of a larger one, then one larger than its spare),
each persisted copy checked once its step is sealed: it loads back exactly, and its zip records
carry no CRC-32 (the helper skips them when staging). Writes CKPT_OUT/rank<R>.json."""

import json
import os
import sys
import time
import zipfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import drun  # noqa: E402
from drun import _ledger  # noqa: E402

rank = int(os.environ["RANK"])
gen = int(os.environ["DRUN_GENERATION"])
sizes = [300_000, 100_000, 500_000, 100_000]
stage = os.environ["DRUN_CKPT_STAGE_DIR"]
spare = os.path.join(stage, ".spare-rank%d" % rank)
report = {"spare_before": [], "steps": []}


def state_of(step, n):
    return {"w": torch.arange(n, dtype=torch.float32) + step * 1000 + rank}


for step, n in enumerate(sizes, start=1):
    t = getattr(getattr(_ledger.STATE, "spare", None), "thread", None)
    if t is not None:
        t.join()
    report["spare_before"].append(os.path.exists(spare))
    state = state_of(step, n)
    path = drun.shard_path(step)
    drun.atomic_save(path, lambda f: torch.save(state, f))
    answer = drun.commit(step, [path])
    assert answer and answer.get("staged"), answer

for step, n in enumerate(sizes, start=1):
    path = drun.shard_path(step)
    manifest = os.path.join(os.path.dirname(path), "drun-manifest-%d-%d.json" % (step, gen))
    deadline = time.time() + 60
    while not os.path.exists(manifest):
        if time.time() > deadline:
            sys.exit("step %d was not sealed within 60 s" % step)
        time.sleep(0.05)
    got = torch.load(path, weights_only=True)["w"]
    crcs = [i.CRC for i in zipfile.ZipFile(path).infolist() if i.file_size > 0]
    report["steps"].append({"step": step, "equal": bool(torch.equal(got, state_of(step, n)["w"])),
                            "bytes": os.path.getsize(path), "crcs": sorted(set(crcs))})

with open(os.path.join(os.environ["CKPT_OUT"], "rank%d.json" % rank), "w") as f:
    json.dump(report, f)
