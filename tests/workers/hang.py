"""Hang-detection test worker: STEPS steps 50 ms apart, each announced with
``drun.progress(step)`` when BEACONS is 1. In the first attempt (TORCHELASTIC_RESTART_COUNT 0)
rank 1 stops at step 20 inside ``stuck_here()`` for STUCK seconds (-1: forever; ``sigstop``: it
stops itself with SIGSTOP); the others go on. Prints ``done rank=R`` at the end.

With ``HANG_AS_NCCL=DIR`` in the environment the worker first loads a copy of the C math library
named ``DIR/libnccl.so.2.<RANK>``, so that its memory maps show an NCCL library as a GPU job's do.

Usage: hang.py STEPS STUCK BEACONS
"""

import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import drun  # noqa: E402


def stuck_here(seconds):
    if seconds == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
        seconds = -1
    if seconds < 0:
        while True:
            time.sleep(3600)
    time.sleep(seconds)


def load_as_nccl(where):
    import ctypes
    import shutil

    with open("/proc/self/maps") as maps:
        libm = next(line.split()[-1] for line in maps if "/libm.so" in line or "/libm-" in line)
    copy = os.path.join(where, "libnccl.so.2." + os.environ["RANK"])
    shutil.copyfile(libm, copy)
    ctypes.CDLL(copy)


def main():
    if os.environ.get("HANG_AS_NCCL"):
        load_as_nccl(os.environ["HANG_AS_NCCL"])
    steps, beacons = int(sys.argv[1]), sys.argv[3] == "1"
    stuck = sys.argv[2] if sys.argv[2] == "sigstop" else float(sys.argv[2])
    rank = int(os.environ["RANK"])
    first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    for step in range(1, steps + 1):
        if first and rank == 1 and step == 20:
            stuck_here(stuck)
        if beacons:
            drun.progress(step)
        time.sleep(0.05)
    print(f"done rank={rank}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
