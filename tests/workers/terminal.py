"""Test worker: what a worker gets from the terminal drun runs in.

Usage: terminal.py stdin        reads one line from stdin, prints "rank<R> read=<repr>", exits 0
       terminal.py hup DIR      prints "rank<R> sighup_ignored=<bool>", writes DIR/ready<R>
                                (its pid), waits (at most 60 s) for DIR/go, exits 0
"""

import os
import signal
import sys
import time

rank = os.environ["LOCAL_RANK"]
mode = sys.argv[1]
if mode == "stdin":
    line = sys.stdin.readline()
    print(f"rank{rank} read={line!r}", flush=True)
elif mode == "hup":
    d = sys.argv[2]
    ignored = signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    print(f"rank{rank} sighup_ignored={ignored}", flush=True)
    tmp = os.path.join(d, f".ready{rank}")
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.rename(tmp, os.path.join(d, f"ready{rank}"))
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(d, "go")):
        if time.monotonic() > deadline:
            sys.exit(7)
        time.sleep(0.02)
    print(f"rank{rank} still here after the hang-up", flush=True)
else:
    sys.exit(f"unknown mode {mode}")
