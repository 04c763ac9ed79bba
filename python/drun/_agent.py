"""The connection to the node agent: newline-delimited JSON over ``DRUN_AGENT_SOCK``, one answer
line per request, in order, after a ``hello`` that checks both sides speak the same
:data:`PROTOCOL` (the agent's side: ``launcher/src/ckpt/api.rs``)."""

from __future__ import annotations

import json
import os
import socket
from typing import Any, BinaryIO, Dict, List, Mapping, Optional, Union

PROTOCOL = 2
"""Version of the agent's worker API this helper speaks (``drun``'s ``ckpt::api::PROTOCOL``).
Checked once per connection (``hello``); a mismatch raises :class:`DrunError`."""

Json = Dict[str, Any]
"""A request or answer line: a JSON object."""


class DrunError(RuntimeError):
    """The agent refused a request (stale generation, misaligned data, ...)."""


def available() -> bool:
    """True when running under a drun agent that offers the worker API."""
    return bool(os.environ.get("DRUN_AGENT_SOCK"))


class Client:
    """One connection to the agent, opened on first use; requests are answered in order."""

    def __init__(self) -> None:
        self._sock: Optional[socket.socket] = None
        self._file: Optional[BinaryIO] = None
        self._path: Optional[str] = None

    def request(self, msg: Mapping[str, Any], timeout: Optional[float] = None) -> Json:
        """Sends ``msg`` and returns the agent's answer; raises :class:`DrunError` when it is
        refused or does not come within ``timeout`` seconds (None: no limit). Connects (and says
        ``hello``) first when not connected, or when ``DRUN_AGENT_SOCK`` changed."""
        path = os.environ.get("DRUN_AGENT_SOCK")
        if not path:
            raise DrunError("not running under drun (DRUN_AGENT_SOCK is unset)")
        if self._sock is None or self._path != path:
            self.close()
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            self._sock, self._file, self._path = s, s.makefile("rb"), path
            self._hello()
        return self._exchange(msg, timeout)

    def _hello(self) -> None:
        try:
            answer = self._exchange({"op": "hello", "protocol": PROTOCOL}, 30.0)
        except DrunError as e:
            self.close()
            raise DrunError(_mismatch(None, str(e))) from e
        theirs = answer.get("protocol")
        if theirs != PROTOCOL:
            self.close()
            raise DrunError(_mismatch(theirs, answer.get("agent")))

    def _exchange(self, msg: Mapping[str, Any], timeout: Optional[float]) -> Json:
        sock, file = self._sock, self._file
        assert sock is not None and file is not None, "request() connects before any exchange"
        sock.settimeout(timeout)
        try:
            sock.sendall(json.dumps(msg).encode() + b"\n")
            line = file.readline()
        except OSError as e:  # includes socket.timeout
            self.close()
            raise DrunError("no answer from the drun agent to %s: %s" % (msg.get("op"), e)) from e
        if not line:
            self.close()
            raise DrunError("the drun agent closed the connection")
        answer: Json = json.loads(line)
        if not answer.get("ok"):
            raise DrunError(answer.get("error", "refused"))
        return answer

    def close(self) -> None:
        """Closes the connection (if open); the next request opens a new one."""
        open_: List[Optional[Union[BinaryIO, socket.socket]]] = [self._file, self._sock]
        for c in open_:
            if c is not None:
                try:
                    c.close()
                except OSError:
                    pass
        self._sock = self._file = None


def _mismatch(theirs: object, detail: object) -> str:
    """The line for a helper/agent protocol mismatch."""
    if theirs is None:
        agent = "an older drun agent (%s)" % detail
    else:
        agent = "drun %s, whose worker API is protocol %s" % (detail, theirs)
    return ("this drun helper (%s) speaks worker-API protocol %d but runs under %s: install the "
            "helper that ships with the drun running this job (pip install the drun wheel of "
            "the same version, or pip install . from its source tree)"
            % (os.path.dirname(os.path.abspath(__file__)), PROTOCOL, agent))
