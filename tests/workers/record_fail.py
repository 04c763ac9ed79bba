"""Test worker: emulates torch's @record error-file reporting without importing torch.

Usage: record_fail.py

RANK 1 raises ValueError("boom from rank 1") after 0.3 s; a wrapper writes the
torchelastic-style JSON to $TORCHELASTIC_ERROR_FILE (if set) and re-raises, so
the process exits 1 with a traceback on stderr. Other ranks sleep up to 600 s.
"""

import functools
import os
import sys
import time
import traceback

from atomic import write_json


def record(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            path = os.environ.get("TORCHELASTIC_ERROR_FILE", "")
            if path:
                payload = {
                    "message": {
                        "message": f"{type(e).__name__}: {e}",
                        "extraInfo": {
                            "py_callstack": traceback.format_exc(),
                            "timestamp": str(int(time.time())),
                        },
                    }
                }
                write_json(path, payload)
            raise

    return wrapper


@record
def main():
    rank = os.environ.get("RANK", "")
    if rank == "1":
        time.sleep(0.3)
        raise ValueError(f"boom from rank {rank}")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        time.sleep(0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
