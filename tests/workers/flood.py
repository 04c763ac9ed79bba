"""Test worker: waits out a garbage flood, then proves its agent's worker API still answers.

Usage: flood.py OUTDIR

Writes OUTDIR/sock_<RANK> (the DRUN_AGENT_SOCK path), waits up to 300 s for OUTDIR/go, then
sends `hello` and a `progress` beacon on the worker API and checks both answers are ok.
Writes OUTDIR/done_<RANK> and exits 0 on success; exits 3 if an answer is wrong, 4 if `go`
never came.
"""

import json
import os
import socket
import sys
import time

from atomic import write_atomic

outdir = sys.argv[1]
rank = os.environ["RANK"]
sock = os.environ["DRUN_AGENT_SOCK"]
write_atomic(os.path.join(outdir, f"sock_{rank}"), sock)

deadline = time.monotonic() + 300
while not os.path.exists(os.path.join(outdir, "go")):
    if time.monotonic() > deadline:
        sys.exit(4)
    time.sleep(0.05)

s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(60)
s.connect(sock)
f = s.makefile("rwb")
answers = []
for req in ({"op": "hello", "protocol": 2}, {"op": "progress", "rank": int(rank), "step": 1}):
    f.write(json.dumps(req).encode() + b"\n")
    f.flush()
    answers.append(json.loads(f.readline()))
if not all(a.get("ok") is True for a in answers):
    print(f"flood.py rank {rank}: bad answers {answers}", file=sys.stderr)
    sys.exit(3)
write_atomic(os.path.join(outdir, f"done_{rank}"), json.dumps(answers))
