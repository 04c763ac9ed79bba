"""Test worker: runs until SIGTERM, then needs 3 s to "save" before exiting 0.

Usage: slow_save.py OUTDIR. Writes OUTDIR/<host>-rank<RANK>.log with one line per event
(started, term, saved); further SIGTERMs during the save are counted, not acted upon.
"""

import os
import signal
import socket
import sys
import time

OUT = sys.argv[1]
path = os.path.join(OUT, "%s-rank%s.log" % (socket.gethostname(), os.environ["RANK"]))
state = {"terms": 0}


def log(line):
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()


def on_term(signum, frame):
    state["terms"] += 1
    log("term %d pid %d" % (state["terms"], os.getpid()))


signal.signal(signal.SIGTERM, on_term)
log("started pid %d" % os.getpid())
while state["terms"] == 0:
    time.sleep(0.05)
end = time.time() + 3.0
while time.time() < end:  # the save; a duplicate SIGTERM does not cut it short
    time.sleep(0.05)
log("saved")
sys.exit(0)
