"""Worker for benches/gpu/proof.sh: one CUDA rank (or a CPU rank in the dry run).

    worker.py first-op OUT      time from DRUN_PROOF_T0 (the launch, epoch ns) to the first CUDA op
    worker.py restart OUT       fails once after its first CUDA op; after the restart, the time
                                from that failure to the restarted worker's first CUDA op
    worker.py hang OUT          steps with beacons, then spins in a CUDA kernel until stopped
    worker.py hold OUT          holds 8 GiB of GPU memory and steps until stopped

Each writes `OUT/<mode>_rank<RANK>_<restart>.txt` with `key value` lines.
"""

import os
import sys
import time

import torch

mode, out = sys.argv[1], sys.argv[2]
rank = int(os.environ.get("RANK", "0"))
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
cpu = os.environ.get("DRUN_GPU_PROOF_CPU") == "1"


def record(**kv):
    path = os.path.join(out, f"{mode}_rank{rank}_{restart}.txt")
    with open(path + ".tmp", "w") as f:
        for k, v in kv.items():
            f.write(f"{k} {v}\n")
    os.replace(path + ".tmp", path)


def first_op():
    if cpu:
        x = torch.ones(1)
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        x = torch.ones(1, device="cuda")
        torch.cuda.synchronize()
    return x, time.time_ns()


if mode == "first-op":
    _, t = first_op()
    record(first_op_s=(t - int(os.environ["DRUN_PROOF_T0"])) / 1e9)
elif mode == "restart":
    failed = os.path.join(out, "restart_failed_at")
    _, t = first_op()
    if restart == 0:
        with open(failed, "w") as f:
            f.write(str(time.time_ns()))
        sys.exit(3)
    at = int(open(failed).read())
    record(restart_to_first_op_s=(t - at) / 1e9)
elif mode == "hang":
    import drun
    import torch.distributed as dist

    x, _ = first_op()
    # A process group, so that the flight recorder has collectives to show.
    dist.init_process_group("gloo" if cpu else "nccl")
    for step in range(1, 6):
        dist.all_reduce(x)
        drun.progress(step)
        time.sleep(0.2)
    record(hanging_since=time.time_ns())
    if cpu:
        while True:
            time.sleep(1)
    while True:
        torch.cuda._sleep(2_000_000_000)  # about a second of spinning per launch
        torch.cuda.synchronize()
elif mode == "hold":
    x, _ = first_op()
    if not cpu:
        x = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
    record(pid=os.getpid(), holding=1)
    while True:
        time.sleep(0.5)
else:
    sys.exit(f"unknown mode {mode}")
