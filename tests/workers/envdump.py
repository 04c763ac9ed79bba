"""Test worker: dump the environment and process identity to OUTDIR/env_<RANK>.json.

Usage: envdump.py OUTDIR [extra args...]
"""

import json
import os
import sys

# `--run-path` runs this file through runpy.run_path, which (unlike `python FILE`) does not put
# the script's directory on sys.path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from atomic import write_atomic  # noqa: E402


def main():
    outdir = sys.argv[1]
    rank = os.environ.get("RANK", "none")
    os.makedirs(outdir, exist_ok=True)
    record = {
        "env": dict(os.environ),
        "argv": sys.argv,
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "sid": os.getsid(0),
        "executable": sys.executable,
    }
    write_atomic(os.path.join(outdir, f"env_{rank}.json"), json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
