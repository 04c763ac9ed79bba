"""Test worker for elastic re-formation: records where it runs, then waits to be stopped.

Usage: elastic.py OUTDIR LABEL [FAIL_PLAN]

On start writes OUTDIR/gen<DRUN_GENERATION>_rank<RANK>.json with its pid, LABEL (which agent
started it), WORLD_SIZE, GROUP_RANK, TORCHELASTIC_RESTART_COUNT and the DRUN_RESTARTS_* counts.
Then it sleeps until SIGTERM/SIGINT and exits 0.

FAIL_PLAN (optional) is "R:G,R:G": the worker exits 1 after 0.5 s when its
TORCHELASTIC_RESTART_COUNT is R and its GROUP_RANK is G (one failure per listed pair).
"""

import os
import signal
import sys
import time

from atomic import write_json


def main():
    outdir, label = sys.argv[1], sys.argv[2]
    plan = sys.argv[3] if len(sys.argv) > 3 else ""
    env = os.environ
    record = {
        "pid": os.getpid(),
        "label": label,
        "world_size": env.get("WORLD_SIZE"),
        "group_rank": env.get("GROUP_RANK"),
        "restart_count": env.get("TORCHELASTIC_RESTART_COUNT"),
        "restarts_failures": env.get("DRUN_RESTARTS_FAILURES"),
        "restarts_membership": env.get("DRUN_RESTARTS_MEMBERSHIP"),
        "generation": env.get("DRUN_GENERATION"),
        "rank": env.get("RANK"),
    }
    path = os.path.join(outdir, f"gen{env.get('DRUN_GENERATION')}_rank{env.get('RANK')}.json")
    write_json(path, record)

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    mine = f"{env.get('TORCHELASTIC_RESTART_COUNT')}:{env.get('GROUP_RANK')}"
    if plan and mine in plan.split(",") and env.get("LOCAL_RANK") == "0":
        time.sleep(0.5)
        print(f"failing as planned ({mine})", file=sys.stderr, flush=True)
        sys.exit(1)
    deadline = time.monotonic() + 600
    while not stop and time.monotonic() < deadline:
        time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
