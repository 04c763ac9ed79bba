"""What a background load of a small CPU share costs two ranks that keep both cores busy (the
question behind issue 35: why the training's steps lose more than the persister's share).

    python share_cost.py steps SECONDS
        one "rank": eight 384x384 matmuls per step on one thread, as ckpt_stall.py's steps;
        prints the median and mean step (ms) and the number of steps.
    python share_cost.py load MODE SHARE SECONDS SOURCE [DEST_DIR]
        a load held to SHARE of one CPU (its thread's CPU time over the wall time): MODE spin
        (a busy loop), read (4 MiB slices of the file SOURCE, on tmpfs, read and hashed with
        SHA-256, as the persister reads a staged file) or write (the same, each slice also
        written with O_DIRECT to a file in DEST_DIR, as the persister writes to --ckpt-dir).

Run two `steps` beside one `load` (and beside none, for the baseline), alternating the modes
in rounds: docs/contributing/benchmarks.md, "The persister's share and what it costs".
"""

import hashlib
import mmap
import os
import statistics
import sys
import time

SLICE = 4 << 20


def steps(seconds: float) -> None:
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(384, 384), torch.randn(384, 384)
    for _ in range(50):
        a @ b
    end = time.monotonic() + seconds
    times = []
    while time.monotonic() < end:
        t0 = time.perf_counter()
        for _ in range(8):
            a @ b
        times.append(time.perf_counter() - t0)
    print("%.3f %.3f %d" % (statistics.median(times) * 1e3, statistics.mean(times) * 1e3, len(times)))


def load(mode: str, share: float, seconds: float, source: str, dest: str) -> None:
    buf = mmap.mmap(-1, SLICE)  # page-aligned, as O_DIRECT wants
    fd = os.open(source, os.O_RDONLY)
    size = os.fstat(fd).st_size
    out = None
    if mode == "write":
        path = os.path.join(dest, ".share_cost.out")
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT)
        os.unlink(path)
    digest = hashlib.sha256()
    start = time.monotonic()
    end = start + seconds
    busy = 0.0
    offset = 0
    while time.monotonic() < end:
        c0 = time.thread_time()
        if mode == "spin":
            while time.thread_time() - c0 < 0.004:
                pass
        else:
            n = os.preadv(fd, [buf], offset)
            digest.update(memoryview(buf)[:n])
            if out is not None:
                os.pwritev(out, [buf], offset)
            offset = (offset + SLICE) % size
        busy += time.thread_time() - c0
        ahead = busy / share - (time.monotonic() - start)
        if ahead > 0:
            time.sleep(ahead)
    wall = time.monotonic() - start
    print("load %s: %.2f s of CPU over %.1f s (%.1f %% of one CPU)" % (mode, busy, wall, 100 * busy / wall))


if __name__ == "__main__":
    if sys.argv[1] == "steps":
        steps(float(sys.argv[2]))
    else:
        mode, share, seconds, source = sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
        load(mode, share, seconds, source, sys.argv[6] if len(sys.argv) > 6 else os.getcwd())
