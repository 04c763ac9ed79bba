"""Stdlib worker for chaos runs: trains on a small dataset through drun.ElasticSampler, commits a
checkpoint every CHAOS_EVERY steps through drun.commit, and appends its history, one JSON object
per line, to $CHAOS_OUT/history.jsonl (O_APPEND, so lines of concurrent ranks never interleave):

  {"kind": "start", gen, rank, world, node, pid, t, resume: null | {step, generation, epoch,
   samples}}
  {"kind": "perm", epoch, perm}           rank 0, once per epoch it runs: the epoch's permutation
  {"kind": "step", gen, rank, world, node, pid, t, step, epoch, idx}   the indices it consumed
  {"kind": "commit", gen, rank, node, pid, t, step, cursor, sealed}    or "refused" with error
  {"kind": "done", gen, rank, node, pid, t, step}

Knobs: CHAOS_DATASET (samples, default 192), CHAOS_GB (global batch, 24: a multiple of every
world size 1..4 x 1..2), CHAOS_EPOCHS (3), CHAOS_EVERY (2), CHAOS_SLEEP (seconds per step, 0.15),
CHAOS_SEED (sampler seed, 7), CHAOS_NODE (the agent's slot, set by the test).
Test-only switch: CHAOS_BREAK_OFFSET=1 shifts a resumed sampler by one world size (a deliberately
broken data cursor that the chaos checker must catch).
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import drun  # noqa: E402

OUT = os.environ["CHAOS_OUT"]
RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
GEN = int(os.environ.get("DRUN_GENERATION", "0"))
NODE = int(os.environ.get("CHAOS_NODE", "0"))
N = int(os.environ.get("CHAOS_DATASET", "192"))
GB = int(os.environ.get("CHAOS_GB", "24"))
EPOCHS = int(os.environ.get("CHAOS_EPOCHS", "3"))
EVERY = int(os.environ.get("CHAOS_EVERY", "2"))
SLEEP = float(os.environ.get("CHAOS_SLEEP", "0.15"))
SEED = int(os.environ.get("CHAOS_SEED", "7"))


def log(kind, **kw):
    kw.update(kind=kind, gen=GEN, rank=RANK, world=WORLD, node=NODE, pid=os.getpid(),
              t=time.time())
    fd = os.open(os.path.join(OUT, "history.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, (json.dumps(kw) + "\n").encode())
    os.close(fd)


info = drun.resume_info()
sampler = drun.ElasticSampler(N, seed=SEED, global_batch=GB)
if os.environ.get("CHAOS_BREAK_OFFSET") == "1" and info:
    sampler._resume_offset += WORLD
log("start", resume=info and {"step": info["step"], "generation": info["generation"],
                              "epoch": info["epoch"], "samples": info["global_samples"]})
step = info["step"] if info else 0
for epoch in range(sampler.epoch, EPOCHS):
    sampler.set_epoch(epoch)
    if RANK == 0:
        log("perm", epoch=epoch, perm=drun._permutation(N, SEED, epoch, True))
    mine = sampler.indices()
    lb = sampler.local_batch
    for b in range(len(mine) // lb):
        step += 1
        time.sleep(SLEEP)
        log("step", step=step, epoch=epoch, idx=mine[b * lb:(b + 1) * lb])
        if step % EVERY:
            continue
        cursor = sampler.cursor(b + 1)
        path = drun.shard_path(step)
        drun.atomic_save(path, lambda f: f.write(("rank %d step %d\n" % (RANK, step)).encode()))
        try:
            answer = drun.commit(step, [path], cursor, timeout=60)
        except drun.DrunError as e:
            log("refused", step=step, error=str(e))
            sys.exit(3)
        log("commit", step=step, cursor={"epoch": cursor["epoch"],
                                         "samples": cursor["consumed_in_epoch"]},
            sealed=bool(answer and answer.get("sealed")))
log("done", step=step)
