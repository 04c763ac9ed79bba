"""Test worker: rank 1 fails on the first attempt only, to exercise restarts.

Usage: flaky.py OUTDIR

Writes OUTDIR/attempt<TORCHELASTIC_RESTART_COUNT>_rank<RANK> holding a JSON
object of a few launcher env vars; then, if TORCHELASTIC_RESTART_COUNT is "0"
and RANK is "1", exits 1 0.2 s after rank 0 wrote its record (at most 30 s); otherwise
exits 0.
"""

import json
import os
import sys
import time

from atomic import write_atomic

KEYS = ("TORCHELASTIC_RESTART_COUNT", "RANK", "WORLD_SIZE", "DRUN_GENERATION", "MASTER_PORT")


def main():
    outdir = sys.argv[1]
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    rank = os.environ.get("RANK")
    os.makedirs(outdir, exist_ok=True)
    info = {key: os.environ.get(key) for key in KEYS}
    write_atomic(os.path.join(outdir, f"attempt{restart}_rank{rank}"), json.dumps(info))
    if restart == "0" and rank == "1":
        # Fail once rank 0 wrote its record too (its interpreter may start later on a busy
        # machine), so that the test sees both attempts; at most 30 s.
        peer = os.path.join(outdir, "attempt0_rank0")
        deadline = time.monotonic() + 30
        while not os.path.exists(peer) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)
        print(f"flaky: rank {rank} failing on attempt {restart}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
