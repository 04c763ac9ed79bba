"""The hang dump: with ``drun --hang-timeout``, every thread's stack to stderr on the signal drun
sends a rank it judged hung (unless ``py-spy`` is on its PATH). The agent names the signal in its
answer to ``progress``."""

from __future__ import annotations

from typing import Any


class HangDump:
    """The signal this process dumps its stacks on, once registered (None: not yet)."""

    def __init__(self) -> None:
        self.signal: Any = None

    def register(self, signum: Any) -> None:
        """Dumps every thread's stack to stderr on ``signum`` (as the agent sent it: a signal
        number, or None for no dump). Registers once per signal; a signal this platform cannot
        register is ignored."""
        if signum is None or signum == self.signal:
            return
        import faulthandler

        try:
            faulthandler.register(int(signum), all_threads=True)
            self.signal = signum
        except (ValueError, RuntimeError, OSError, AttributeError):
            pass
