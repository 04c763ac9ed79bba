"""Bench worker of the network-bed rows: a gloo all_reduce every 0.1 s, each completed step stamped.

Usage: bed_steps.py OUTDIR

The job's step counter survives a restart the way a real job's does, through a checkpoint: rank 0
writes the number of the last completed step to OUTDIR/ckpt every 10 steps (1 s of training),
and every new worker resumes after the step written there (0 on the first start).

On start writes OUTDIR/<pid>.json: {"pid", "host" (the hostname: the bed's host), "gen",
"rank", "world", "group_rank", "start_ns", "resumed_from"}; after every all_reduce appends
"<wall time in ns> <step>" to OUTDIR/<pid>.steps. gen is DRUN_GENERATION under drun and
TORCHELASTIC_RESTART_COUNT + 1 under torchrun. Runs until its launcher stops it (or 900 s). The
collective timeout is torch's default, as in a real job.
"""

import time

START_NS = time.time_ns()

import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402

CKPT_EVERY = 10


def write(path, text):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main():
    env = os.environ
    outdir = sys.argv[1]
    if "DRUN_GENERATION" in env:
        gen = int(env["DRUN_GENERATION"])
    else:
        gen = int(env.get("TORCHELASTIC_RESTART_COUNT", "0")) + 1
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    ckpt = os.path.join(outdir, "ckpt")
    try:
        with open(ckpt) as f:
            step = int(f.read())
    except FileNotFoundError:
        step = 0
    rec = {"pid": os.getpid(), "host": socket.gethostname(), "gen": gen, "rank": rank,
           "world": world, "group_rank": int(env["GROUP_RANK"]), "start_ns": START_NS,
           "resumed_from": step}
    write(os.path.join(outdir, f"{os.getpid()}.json"), json.dumps(rec))

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    deadline = time.monotonic() + 900
    with open(os.path.join(outdir, f"{os.getpid()}.steps"), "a", buffering=1) as log:
        while time.monotonic() < deadline:
            dist.all_reduce(torch.ones(1))
            step += 1
            log.write(f"{time.time_ns()} {step}\n")
            if rank == 0 and step % CKPT_EVERY == 0:
                write(ckpt, str(step))
            time.sleep(0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
