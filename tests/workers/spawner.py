"""Test worker: leaves grandchildren behind, to check the launcher cleans them up.

Usage: spawner.py OUTDIR MODE     (MODE is "sleep" or "crash")

Spawns `sleep 600` in the worker's own process group and `sleep 600` in a new
session (start_new_session=True), writes OUTDIR/pids_<RANK>.json with
{"worker", "child", "setsid_child"}, then sleeps 600 s (MODE sleep) or exits 1
after 0.5 s (MODE crash).
"""

import json
import os
import subprocess
import sys
import time

from atomic import write_atomic


def main():
    outdir, mode = sys.argv[1], sys.argv[2]
    if mode not in ("sleep", "crash"):
        print(f"spawner: unknown MODE {mode!r}", file=sys.stderr)
        return 2
    rank = os.environ.get("RANK", "none")
    os.makedirs(outdir, exist_ok=True)
    child = subprocess.Popen(["sleep", "600"])
    setsid_child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    pids = {"worker": os.getpid(), "child": child.pid, "setsid_child": setsid_child.pid}
    write_atomic(os.path.join(outdir, f"pids_{rank}.json"), json.dumps(pids))
    if mode == "crash":
        time.sleep(0.5)
        print(f"spawner: rank {rank} crashing", file=sys.stderr, flush=True)
        return 1
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        time.sleep(0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
