"""Stdlib worker for tests/ckpt/replicas.rs: commits a checkpoint of SAVE_MB MiB every step
(STEPS steps, STEP_SLEEP seconds apart) through drun's helper, then writes
$CKPT_OUT/rank<R>.json with each step's answer: whether it was staged in memory."""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import drun  # noqa: E402

rank = int(os.environ["RANK"])
size = int(os.environ.get("SAVE_MB", "4")) << 20
answers = []
for step in range(1, int(os.environ.get("STEPS", "10")) + 1):
    time.sleep(float(os.environ.get("STEP_SLEEP", "0.2")))
    data = bytes([step % 251]) * size
    path = drun.shard_path(step)
    drun.atomic_save(path, lambda f: f.write(data))
    answer = drun.commit(step, [path])
    answers.append({"step": step, "staged": bool(answer.get("staged"))})
with open(os.path.join(os.environ["CKPT_OUT"], "rank%d.json" % rank), "w") as f:
    json.dump(answers, f)
