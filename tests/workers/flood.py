"""Test worker: waits out a garbage flood, then proves its agent's worker API still answers.

Usage: flood.py OUTDIR

Writes OUTDIR/store_<RANK> (MASTER_ADDR:MASTER_PORT, the agent-hosted c10d store) and
OUTDIR/sock_<RANK> (the DRUN_AGENT_SOCK path), waits up to 300 s for OUTDIR/go, then sends
`hello` and a `progress` beacon on the worker API and checks both answers are ok, and speaks
torch's TCPStore protocol to the store (validate, ping, add) and checks its answers. Writes
OUTDIR/done_<RANK> and exits 0 on success; exits 3 if an answer is wrong, 4 if `go` never came.
"""

import json
import os
import socket
import struct
import sys
import time

from atomic import write_atomic

outdir = sys.argv[1]
rank = os.environ["RANK"]
sock = os.environ["DRUN_AGENT_SOCK"]
master = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
write_atomic(os.path.join(outdir, f"store_{rank}"), f"{master[0]}:{master[1]}")
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


def read_exactly(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError("the store closed the connection")
        data += chunk
    return data


key = b"/flood"
store = socket.create_connection(master, timeout=60)
# validate (0, magic), ping (13, nonce), add (4, key, delta): torch's client's bytes.
store.sendall(b"\x00" + struct.pack("<I", 0x3C85F7CE) + b"\x0d" + struct.pack("<I", 1000 + int(rank))
              + b"\x04" + struct.pack("<Q", len(key)) + key + struct.pack("<q", 1))
nonce = struct.unpack("<I", read_exactly(store, 4))[0]
count = struct.unpack("<q", read_exactly(store, 8))[0]
if nonce != 1000 + int(rank) or not 1 <= count <= 4:
    print(f"flood.py rank {rank}: store answered nonce {nonce}, count {count}", file=sys.stderr)
    sys.exit(3)
write_atomic(os.path.join(outdir, f"done_{rank}"), json.dumps(answers))
