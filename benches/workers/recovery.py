"""Bench worker: a gloo all_reduce every 0.1 s, recording when it started (real torch job).

Usage: recovery.py OUTDIR [FAIL_RANK FAIL_AFTER_STEPS|go]

The very first thing it does, before importing torch, is take the wall-clock time, and it writes
OUTDIR/<pid>.json with it: {"pid", "gen", "rank", "world", "start_ns", "master"}. It rewrites
the file with "imported_ns" after `import torch`, "init_ns" after init_process_group and
"ready_ns" after the first all_reduce. gen is
DRUN_GENERATION under drun and TORCHELASTIC_RESTART_COUNT + 1 under torchrun. With FAIL_RANK,
that rank exits 1 after FAIL_AFTER_STEPS steps (with `go`: at the first step once the file
OUTDIR/go exists, which the bench creates when it wants the fault), once per job (OUTDIR/failed marks it: under
torchrun a membership restart keeps the generation count, so "generation 1" could fail twice),
adding "exit_ns" first. With RECOVERY_STEPS=1 in its environment it adds "last_ns", the time of
its latest step, at every step (the arrivals rows' training time lost).
Without a failure it runs until its launcher stops it (or 900 s). The collective timeout is
torch's default, as in a real job.
"""

import time

START_NS = time.time_ns()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402


def write(path, rec):
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(rec, f)
    os.replace(tmp, path)


def fail_once(outdir):
    try:
        os.close(os.open(os.path.join(outdir, "failed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def main():
    env = os.environ
    outdir = sys.argv[1]
    fail_rank = int(sys.argv[2]) if len(sys.argv) > 2 else -1
    on_go = len(sys.argv) > 3 and sys.argv[3] == "go"
    fail_after = int(sys.argv[3]) if len(sys.argv) > 3 and not on_go else 0
    go = os.path.join(outdir, "go")
    if "DRUN_GENERATION" in env:
        gen = int(env["DRUN_GENERATION"])
    else:
        gen = int(env.get("TORCHELASTIC_RESTART_COUNT", "0")) + 1
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    path = os.path.join(outdir, f"{os.getpid()}.json")
    rec = {"pid": os.getpid(), "gen": gen, "rank": rank, "world": world, "start_ns": START_NS,
           "master": f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}"}
    write(path, rec)

    import torch
    import torch.distributed as dist

    rec["imported_ns"] = time.time_ns()
    write(path, rec)
    dist.init_process_group("gloo")
    rec["init_ns"] = time.time_ns()
    write(path, rec)
    dist.all_reduce(torch.ones(1))
    rec["ready_ns"] = time.time_ns()
    write(path, rec)
    deadline = time.monotonic() + 900
    step = 1
    steps = os.environ.get("RECOVERY_STEPS") == "1"
    while time.monotonic() < deadline:
        due = os.path.exists(go) if on_go else step >= fail_after
        if rank == fail_rank and due and fail_once(outdir):
            rec["exit_ns"] = time.time_ns()
            write(path, rec)
            os._exit(1)
        dist.all_reduce(torch.ones(1))
        step += 1
        if steps:
            rec["last_ns"] = time.time_ns()
            write(path, rec)
        time.sleep(0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
