"""Test worker (torch): what a worker sees of its own start, then a gloo all_reduce.

Usage: warm_dump.py OUTDIR [--fail-warm]

Writes OUTDIR/attempt<R>_rank<RANK>.json (R: TORCHELASTIC_RESTART_COUNT) with the time of
its first line, its environment, argv, sys.path, cwd, __main__'s names, signal dispositions,
threads, then (after `import torch`) torch's intra-op threads and is_torchelastic_launched(),
and the time its first all_reduce finished. Attempt 0 waits for OUTDIR/go (the test creates
it once the warm interpreters are ready), then fails; a later attempt fails too with
--fail-warm, else exits 0. Failures go through torch's @record (the error file).
"""

import os
import sys
import time

FIRST_LINE = time.time()
MAIN_NAMES = sorted(globals())

import json  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from atomic import write_json  # noqa: E402


def start_record():
    return {
        "first_line": FIRST_LINE,
        "env": dict(os.environ),
        "argv": sys.argv,
        # What `ps` shows (a warm interpreter's differs from a cold one's by its `-c` stub).
        "cmdline": open("/proc/self/cmdline", "rb").read().decode(errors="replace").split("\0")[:-1],
        "orig_argv": sys.orig_argv,
        # [1:] is the helper directory this script inserted.
        "path": sys.path[1:],
        "cwd": os.getcwd(),
        "name": __name__,
        "file": __file__,
        "main_names": MAIN_NAMES,
        "signals": {
            signal.Signals(s).name: str(signal.getsignal(s))
            for s in sorted(signal.valid_signals())
            if s in signal.Signals._value2member_map_ and signal.getsignal(s) is not None
        },
        "py_threads": threading.active_count(),
        "flags": str(sys.flags),
    }


def main():
    outdir = sys.argv[1]
    record = start_record()
    import torch
    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing.errors import record as torch_record

    record["torch_threads"] = torch.get_num_threads()
    record["torchelastic_launched"] = dist.is_torchelastic_launched()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank = int(os.environ["RANK"])

    @torch_record
    def train():
        dist.init_process_group("gloo")
        t = torch.ones(4)
        dist.all_reduce(t)
        record["first_all_reduce"] = time.time()
        record["sum"] = t.tolist()
        write_json(os.path.join(outdir, f"attempt{attempt}_rank{rank}.json"), record)
        if attempt == 0:
            go = os.path.join(outdir, "go")
            deadline = time.time() + 300
            while not os.path.exists(go) and time.time() < deadline:
                time.sleep(0.02)
            raise RuntimeError(f"first attempt fails on purpose (rank {rank})")
        if "--fail-warm" in sys.argv:
            raise RuntimeError(f"warm attempt fails on purpose (rank {rank})")
        dist.destroy_process_group()

    train()


if __name__ == "__main__":
    main()
