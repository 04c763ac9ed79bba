"""Test worker: emulates how torch's TCPStore uses MASTER_ADDR/MASTER_PORT.

Usage: portcheck.py OUTDIR

RANK 0 binds ("", MASTER_PORT) with SO_REUSEADDR, listens, and sends
TORCHELASTIC_RUN_ID + "\\n" to each of WORLD_SIZE-1 connections. Other ranks
connect to (MASTER_ADDR, MASTER_PORT), retrying for up to 30 s, and read the
line. Every rank writes OUTDIR/port_<RANK>.json and exits 0 only if the bind
worked and the run ids match.
"""

import json
import os
import socket
import sys
import time

from atomic import write_atomic

CONNECT_TIMEOUT_S = 30.0


def serve(port, world_size, run_id):
    """Rank 0: returns an error string or None."""
    try:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("", port))
        srv.listen(max(1, world_size))
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    srv.settimeout(CONNECT_TIMEOUT_S + 30)
    with srv:
        for _ in range(world_size - 1):
            conn, _addr = srv.accept()
            with conn:
                conn.sendall((run_id + "\n").encode())
    return None


def fetch(addr, port):
    """Other ranks: returns the line rank 0 sent, without the newline."""
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        try:
            with socket.create_connection((addr, port), timeout=5) as conn:
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                return data.decode().rstrip("\n")
        except OSError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def main():
    outdir = sys.argv[1]
    rank = os.environ.get("RANK", "none")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ["MASTER_PORT"])
    own_run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    os.makedirs(outdir, exist_ok=True)

    bind_error = None
    seen = None
    if rank == "0":
        bind_error = serve(port, world_size, own_run_id)
        seen = own_run_id
    else:
        try:
            seen = fetch(addr, port)
        except OSError as e:
            print(f"portcheck: rank {rank} could not reach {addr}:{port}: {e}",
                  file=sys.stderr, flush=True)

    # Extra, informational: torchrun sets TORCHELASTIC_USE_AGENT_STORE=True and
    # keeps MASTER_PORT bound itself, so this worker's bind fails under torchrun.
    result = {"run_id_seen": seen, "own_run_id": own_run_id, "port": port,
              "bind_error": bind_error,
              "use_agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE")}
    write_atomic(os.path.join(outdir, f"port_{rank}.json"), json.dumps(result))

    if bind_error is not None:
        print(f"portcheck: rank {rank} bind to port {port} failed: {bind_error}",
              file=sys.stderr, flush=True)
        return 1
    if seen != own_run_id:
        print(f"portcheck: rank {rank} run id mismatch: saw {seen!r}, own {own_run_id!r}",
              file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
