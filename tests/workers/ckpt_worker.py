"""Stdlib worker for checkpoint-ledger tests: steps, commits through drun's helper, and logs
every event as a JSON line to $CKPT_OUT/events.jsonl.

Environment knobs (all optional):
  CKPT_STEPS          last step (default 12)          CKPT_EVERY   commit every N steps (2)
  CKPT_SLEEP          seconds per step (0.05)         CKPT_GB      global batch (8)
  CKPT_BAD_CURSOR     "RANK:STEP": that rank reports a cursor one sample off at that step
  CKPT_DIE_MIDWRITE   "RANK:STEP": in generation 1 that rank SIGKILLs itself halfway through
                      writing its file of that step
  CKPT_HOLD_AT        STEP: in generation 1, after committing STEP every rank waits for the file
                      $CKPT_OUT/crash, then rank 0 exits 1
  CKPT_REFUSED_EXIT   exit status after a refused commit (default 3)
  CKPT_PROGRESS       0: send no step beacons
  CKPT_HANG_AT        "RANK:STEP": in generation 1 that rank stops at that step (before its beacon)
                      inside stuck_here(), forever
  CKPT_SAVE_ON_REQUEST_FROM_GEN  G: from generation G on, once drun.should_save() is true the
                      rank commits every step (ranks that see the request a step apart still
                      meet on the later steps)
"""

import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import drun  # noqa: E402

OUT = os.environ["CKPT_OUT"]
RANK = int(os.environ["RANK"])
GEN = int(os.environ.get("DRUN_GENERATION", "0"))
STEPS = int(os.environ.get("CKPT_STEPS", "12"))
EVERY = int(os.environ.get("CKPT_EVERY", "2"))
SLEEP = float(os.environ.get("CKPT_SLEEP", "0.05"))
GB = int(os.environ.get("CKPT_GB", "8"))


def knob(name):
    v = os.environ.get(name)
    if not v:
        return None
    r, s = v.split(":")
    return int(r), int(s)


def stuck_here():
    while True:
        time.sleep(3600)


def log(event, **kw):
    kw.update(event=event, rank=RANK, gen=GEN, pid=os.getpid(), t=time.time())
    line = (json.dumps(kw) + "\n").encode()
    fd = os.open(os.path.join(OUT, "events.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, line)
    os.close(fd)


def resume_files():
    """SHA-256 of each rank file in DRUN_RESUME_PATH, by name: what this rank resumes from."""
    d = os.environ.get("DRUN_RESUME_PATH")
    if not d or not os.path.isdir(d):
        return {}
    import hashlib
    return {n: hashlib.sha256(open(os.path.join(d, n), "rb").read()).hexdigest()
            for n in sorted(os.listdir(d)) if n.endswith(".pt")}


info = drun.resume_info()
start = info["step"] if info else 0
log("start", resume_step=info and info["step"], resume_samples=info and info["global_samples"],
    world=int(os.environ["WORLD_SIZE"]), env_resume={k: v for k, v in os.environ.items()
                                                     if k.startswith("DRUN_RESUME")},
    resume_files=resume_files())
bad_cursor = knob("CKPT_BAD_CURSOR")
die = knob("CKPT_DIE_MIDWRITE")
hang = knob("CKPT_HANG_AT")
hold = os.environ.get("CKPT_HOLD_AT")
save_from_gen = os.environ.get("CKPT_SAVE_ON_REQUEST_FROM_GEN")
saving = False

for step in range(start + 1, STEPS + 1):
    time.sleep(SLEEP)
    if hang == (RANK, step) and GEN == 1:
        log("hanging", step=step)
        stuck_here()
    if os.environ.get("CKPT_PROGRESS", "1") == "1":
        drun.progress(step)
    if save_from_gen is not None and GEN >= int(save_from_gen) and not saving:
        saving = drun.should_save(sync=False)
        if saving:
            log("save_requested", step=step)
    if step % EVERY and not saving:
        continue
    path = drun.shard_path(step)
    payload = (("rank %d step %d " % (RANK, step)) * 200).encode()
    if die == (RANK, step) and GEN == 1:
        def half_then_die(f):
            f.write(payload[: len(payload) // 2])
            f.flush()
            log("dying", step=step)
            os.kill(os.getpid(), signal.SIGKILL)
        drun.atomic_save(path, half_then_die)
    log("saving", step=step)
    drun.atomic_save(path, lambda f: f.write(payload))
    samples = step * GB + (1 if bad_cursor == (RANK, step) else 0)
    log("committing", step=step)
    try:
        answer = drun.commit(step, [path], {"epoch": 0, "consumed_in_epoch": samples,
                                            "global_batch": GB})
    except drun.DrunError as e:
        log("refused", step=step, error=str(e))
        sys.exit(int(os.environ.get("CKPT_REFUSED_EXIT", "3")))
    log("committed", step=step, sealed=answer["sealed"], manifest=answer["manifest"],
        staged=answer.get("staged", False), on_disk=os.path.exists(path))
    if hold is not None and step == int(hold) and GEN == 1:
        log("holding", step=step)
        while not os.path.exists(os.path.join(OUT, "crash")):
            time.sleep(0.02)
        if RANK == 0:
            log("crashing", step=step)
            sys.exit(1)
        time.sleep(60)

log("done", step=STEPS)
