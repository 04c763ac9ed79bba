"""Test worker: writes long stdout/stderr lines in split chunks to test line buffering.

Usage: printer.py LINES

Prints LINES lines of ~300 chars "out rank=<RANK> i=<i> xxx..." to stdout and
"err rank=<RANK> i=<i> xxx..." to stderr, each written as two flushed halves
with a short random pause between, then writes "tail-without-newline
rank=<RANK>" to stdout without a trailing newline and exits 0.
"""

import os
import random
import sys
import time

LINE_LEN = 300


def make_line(kind, rank, i):
    head = f"{kind} rank={rank} i={i} "
    return head + "x" * max(0, LINE_LEN - len(head)) + "\n"


def write_split(stream, line):
    half = len(line) // 2
    stream.write(line[:half])
    stream.flush()
    time.sleep(random.uniform(0.0, 0.001))
    stream.write(line[half:])
    stream.flush()


def main():
    lines = int(sys.argv[1])
    rank = os.environ.get("RANK", "none")
    for i in range(lines):
        write_split(sys.stdout, make_line("out", rank, i))
        write_split(sys.stderr, make_line("err", rank, i))
    sys.stdout.write(f"tail-without-newline rank={rank}")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
