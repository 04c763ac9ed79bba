"""The flight-recorder dump: with ``drun --hang-timeout``, torch's flight recorder (the last
collectives of every process group) written to a file the agent names, when the agent asks.

A rank blocked in a collective never runs a Python signal handler (they run on the main thread,
between bytecodes), so the request does not come as a signal: a daemon thread waits on a FIFO
(``request``, made here) that the agent opens for writing when it judged a hang; the thread then
writes torch's JSON dump to ``dump`` (a temporary file renamed into place). Torch releases the GIL
while a collective waits, so the thread runs while the main thread is blocked in one.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any, Dict, Optional

from ._agent import Json


class FlightDump:
    """The request FIFO this process listens on, once started (None: not yet)."""

    def __init__(self) -> None:
        self.request: Optional[str] = None

    def register(self, paths: Any) -> None:
        """Listens on ``paths["request"]`` (as the agent sent them: ``{"request": FIFO,
        "dump": FILE}``, or None for no dump) on a daemon thread. Starts once; a FIFO that
        cannot be made (another platform, a read-only directory) means no dump."""
        if not isinstance(paths, dict) or self.request is not None:
            return
        request, dump = paths.get("request"), paths.get("dump")
        if not isinstance(request, str) or not isinstance(dump, str):
            return
        try:
            if os.path.lexists(request):
                os.unlink(request)  # a FIFO of this rank's previous worker
            os.mkfifo(request, 0o600)
        except (OSError, AttributeError):
            return
        self.request = request
        threading.Thread(target=_serve, args=(request, dump), name="drun-flight-recorder",
                         daemon=True).start()


def _serve(request: str, dump: str) -> None:
    """Waits for the agent to open ``request``, then writes the dump; again for every request."""
    while True:
        try:
            fd = os.open(request, os.O_RDONLY)  # blocks until the agent opens it to write
            try:
                while os.read(fd, 4096):
                    pass
            finally:
                os.close(fd)
        except OSError:
            return
        write(dump, collect())


def collect() -> Json:
    """This process's flight-recorder dumps, parsed: ``{"backends": {"gloo": {...}, "nccl":
    {...}}}``, with ``"error"`` saying why there is none (torch.distributed not in use)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return {"error": "torch.distributed is not initialized in this process"}
    c10d: Any = sys.modules.get("torch._C._distributed_c10d")
    if c10d is None:
        return {"error": "torch._C._distributed_c10d is not loaded"}
    backends: Dict[str, Any] = {}
    errors = []
    default = str(dist.get_backend())
    # (includeCollectives, onlyActive): every entry still in the ring buffer, completed ones
    # too (the last one a rank finished is what the agent names).
    dumpers = [("gloo", "_dump_fr_trace_json")]
    if "nccl" in default:
        dumpers.append(("nccl", "_dump_nccl_trace_json"))
    for name, fn in dumpers:
        try:
            raw = getattr(c10d, fn)(True, False)
            backends[name] = json.loads(raw)
        except Exception as e:  # noqa: BLE001 - a dump that fails is said, not raised
            errors.append(f"{fn}: {e}")
    out: Json = {"backends": backends}
    if errors:
        out["error"] = "; ".join(errors)
    return out


def write(path: str, value: Json) -> None:
    """Writes ``value`` as JSON to ``path`` atomically (a temporary file renamed into place)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(value, f)
        os.replace(tmp, path)
    except OSError:
        pass
