"""Test worker: the chosen rank exits with a given code; the others wait to be killed.

Usage: exit_code.py CODE RANK[,RANK...] [DELAY_S]

Each worker whose RANK is one of RANK sleeps DELAY_S (default 0.2), prints
"rank <R> exiting with <CODE>" to stderr and exits with CODE. Every other rank
sleeps up to 600 s in short steps and exits 0 if it gets that far.
"""

import os
import sys
import time


def main():
    code = int(sys.argv[1])
    targets = sys.argv[2].split(",")
    delay = float(sys.argv[3]) if len(sys.argv) > 3 else 0.2
    rank = os.environ.get("RANK", "")
    if rank in targets:
        time.sleep(delay)
        print(f"rank {rank} exiting with {code}", file=sys.stderr, flush=True)
        return code
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        time.sleep(0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
