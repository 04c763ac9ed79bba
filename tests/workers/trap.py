"""Test worker: records the signals it receives and "saves" on a terminating one.

Usage: trap.py OUTDIR SAVE_SECONDS

Writes OUTDIR/ready_<RANK> (its pid) once the handlers are installed. Every
signal received is appended to OUTDIR/signals_<RANK>, one name per line.
SIGUSR1/SIGUSR2 are only recorded. The first SIGTERM/SIGINT/SIGHUP/SIGQUIT
starts a "save": sleep SAVE_SECONDS (still recording further signals), then
write OUTDIR/saved_<RANK> and exit 0. Without a signal it runs up to 600 s.
"""

import os
import signal
import sys
import time

from atomic import write_atomic

WATCHED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
TERMINATING = {"SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"}

outdir = ""
rank = ""
stop_requested = False


def on_signal(signum, _frame):
    global stop_requested
    name = signal.Signals(signum).name
    # One O_APPEND write per signal keeps lines whole even if handlers nest.
    fd = os.open(os.path.join(outdir, f"signals_{rank}"),
                 os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (name + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    if name in TERMINATING:
        stop_requested = True


def sleep_steps(seconds, stop_early):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if stop_early and stop_requested:
            return
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


def main():
    global outdir, rank
    outdir = sys.argv[1]
    save_seconds = float(sys.argv[2])
    rank = os.environ.get("RANK", "none")
    os.makedirs(outdir, exist_ok=True)
    for name in WATCHED:
        signal.signal(getattr(signal, name), on_signal)
    write_atomic(os.path.join(outdir, f"ready_{rank}"), str(os.getpid()))

    sleep_steps(600, stop_early=True)
    if not stop_requested:
        return 0
    # Simulate writing a checkpoint; further signals are only recorded.
    sleep_steps(save_seconds, stop_early=False)
    write_atomic(os.path.join(outdir, f"saved_{rank}"), str(os.getpid()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
