"""Test worker: orphans a grandchild and watches whether it is reaped.

Usage: orphan_reap.py OUTDIR

Forks a child that forks a grandchild and exits at once, so the grandchild is
orphaned (re-parented to the nearest child subreaper or to PID 1). The
grandchild waits until its parent is gone, records its new parent's pid, then
exits after 0.3 s. The worker watches /proc/<grandchild> until it disappears
(reaped) or 10 s pass (left a zombie), and writes OUTDIR/orphan_<RANK>.json
{"grandchild", "adopted_by", "reaped", "state"}. Exits 0.
"""

import json
import os
import sys
import time

from atomic import write_atomic


def proc_state(pid):
    """The state letter of /proc/PID/stat (Z: zombie), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def main():
    outdir = sys.argv[1]
    rank = os.environ.get("RANK", "none")
    os.makedirs(outdir, exist_ok=True)
    adopted_path = os.path.join(outdir, f"adopted_{rank}")
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        grandchild = os.fork()
        if grandchild == 0:
            os.close(r)
            parent = os.getppid()
            deadline = time.monotonic() + 5
            while os.getppid() == parent and time.monotonic() < deadline:
                time.sleep(0.01)
            write_atomic(adopted_path, str(os.getppid()))
            time.sleep(0.3)
            os._exit(0)
        os.write(w, str(grandchild).encode())
        os._exit(0)
    os.close(w)
    grandchild = int(os.read(r, 32).decode())
    os.waitpid(child, 0)
    deadline = time.monotonic() + 10
    state = proc_state(grandchild)
    while state is not None and time.monotonic() < deadline:
        time.sleep(0.05)
        state = proc_state(grandchild)
    adopted = None
    if os.path.exists(adopted_path):
        with open(adopted_path) as f:
            adopted = int(f.read())
    record = {
        "grandchild": grandchild,
        "adopted_by": adopted,
        "reaped": state is None,
        "state": state,
    }
    write_atomic(os.path.join(outdir, f"orphan_{rank}.json"), json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
