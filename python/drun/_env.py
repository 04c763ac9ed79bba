"""Integers from the environment drun sets for its workers (``RANK``, ``DRUN_GENERATION``, ...)."""

from __future__ import annotations

import os
from typing import Optional, overload


@overload
def env_int(name: str) -> Optional[int]: ...


@overload
def env_int(name: str, default: int) -> int: ...


def env_int(name: str, default: Optional[int] = None) -> Optional[int]:
    """``int(os.environ[name])``, or ``default`` when it is unset or empty; a value that is not an
    integer raises ValueError."""
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    return int(v)
