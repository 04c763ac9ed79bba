"""Test worker (needs torch): each generation must find an empty worker store.

Usage: fresh_store.py OUTDIR   (run with --max-restarts 1)

Every rank connects to the store at MASTER_ADDR:MASTER_PORT as a client, records whether
the key `left_over` exists, waits until the others have looked too, sets it, and meets the
others in a store barrier. In the first attempt (TORCHELASTIC_RESTART_COUNT=0) rank 1 then
fails, so the group re-forms; in the second every rank writes OUTDIR/fresh_<RANK>.json.
"""

import datetime
import json
import os
import sys

import torch.distributed as dist


def main():
    out = sys.argv[1]
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    s = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                      is_master=False, timeout=datetime.timedelta(seconds=30))
    seen = s.check(["left_over"])
    s.barrier("checked", int(os.environ["WORLD_SIZE"]))
    s.set("left_over", str(attempt))
    s.barrier("met", int(os.environ["WORLD_SIZE"]))
    if attempt == 0 and rank == 1:
        sys.exit(1)
    if attempt > 0:
        with open(os.path.join(out, f"fresh_{rank}.json"), "w") as f:
            json.dump({"rank": rank, "attempt": attempt, "left_over_seen": seen,
                       "port": os.environ["MASTER_PORT"]}, f)


if __name__ == "__main__":
    main()
