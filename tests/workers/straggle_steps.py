"""Stdlib test worker: STEPS steps of about 20 ms (±20 % jitter), each announced to drun with
``drun.progress(step)``; rank SLOW_RANK (-1: none) takes 3× longer per step. Then a clean exit.

Usage: straggle_steps.py STEPS SLOW_RANK
"""

import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import drun  # noqa: E402


def main():
    steps, slow = int(sys.argv[1]), int(sys.argv[2])
    rank = int(os.environ["RANK"])
    base = 0.06 if rank == slow else 0.02
    rng = random.Random(rank)
    for step in range(1, steps + 1):
        time.sleep(base * rng.uniform(0.8, 1.2))
        drun.progress(step)
    print(f"done rank={rank}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
