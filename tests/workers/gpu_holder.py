"""GPU-memory test worker: it stands for a CUDA process. It and two children (one in its process
group, one in a session of its own, as DataLoader workers or a compiler's pool would be) register
their pids as files in REG; the test's fixture `nvidia-smi --query-compute-apps` lists every
registered process still alive as holding GPU memory, as the driver does for a process with a
CUDA context. Then it writes OUT/ready_<RANK>_<PID> and, by MODE:

  sleep  waits (for a SIGKILL of its agent, or a re-form);
  hang   announces a step every 50 ms with ``drun.progress``; in the first attempt
         (TORCHELASTIC_RESTART_COUNT 0) rank 1 stops at step 20 for good, later attempts end
         after 40 steps.

Usage: gpu_holder.py REG OUT MODE
"""

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import drun  # noqa: E402
from atomic import write_atomic  # noqa: E402


def main():
    reg, out, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    if mode not in ("sleep", "hang"):
        print(f"gpu_holder: unknown MODE {mode!r}", file=sys.stderr)
        return 2
    rank = os.environ["RANK"]
    first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    child = subprocess.Popen(["sleep", "600"])
    setsid_child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    for pid in (os.getpid(), child.pid, setsid_child.pid):
        write_atomic(os.path.join(reg, str(pid)), rank)
    write_atomic(os.path.join(out, f"ready_{rank}_{os.getpid()}"), "")
    if mode == "sleep":
        time.sleep(600)
        return 0
    for step in range(1, 41):
        if first and rank == "1" and step == 20:
            while True:
                time.sleep(3600)
        drun.progress(step)
        time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
