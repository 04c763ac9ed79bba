"""Atomic file writes for the test workers: a reader never sees a half-written record.

Each worker imports this from its own directory (a script's directory is first on sys.path).
"""
import json
import os


def write_atomic(path, text):
    """Writes `text` to `path` through a per-process temporary file, fsync and rename."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path, record):
    """Writes `record` as JSON to `path` atomically."""
    write_atomic(path, json.dumps(record))
