"""Benchmark worker (benches/ckpt.rs part 4, optional): DLRover's flash checkpoint
(``DdpCheckpointer.save_checkpoint(..., StorageType.DISK)``: the state is copied into shared
memory and DLRover's agent writes it to the checkpoint directory behind the training) for the
same state as drun's row, against ``torch.save`` + fsync to the same directory in the same
worker. Run under ``dlrover-run --standalone --nproc_per_node 2`` (benches/workers/dlrover_run.py).
Arguments: MB per rank, SAVES, the checkpoint directory. Rank 0 prints one JSON line (``cpu``:
the CPU time the training's thread spent in the save)."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from dlrover.trainer.torch.flash_checkpoint.ddp import DdpCheckpointer, StorageType

mb, saves, ckdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(1)
os.makedirs(ckdir, exist_ok=True)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
state = {"w": torch.randn(mb * (1 << 18))}
# Every rank saves a state of its own (not one replicated model): a shard per rank.
ck = DdpCheckpointer(ckdir, local_shard_num=world, global_shard_num=world)
base, ours, lag, cpu = [], [], [], []
for s in range(1, saves + 1):
    p = os.path.join(ckdir, "baseline-%d.pt" % rank)
    t = time.perf_counter()
    with open(p, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    base.append(time.perf_counter() - t)
    os.unlink(p)
    dist.barrier()
    t, c = time.perf_counter(), time.thread_time()
    ck.save_checkpoint(s, state, os.path.join(ckdir, "%d" % s, "rank_%d.pt" % rank),
                       storage_type=StorageType.DISK)
    done = time.perf_counter()
    ours.append(done - t)
    cpu.append(time.thread_time() - c)
    # DLRover's agent records the newest step written to the directory.
    tracker = os.path.join(ckdir, "dlrover_latest.txt")
    while time.perf_counter() - done < 300:
        try:
            with open(tracker) as f:
                if f.read().strip() == str(s):
                    break
        except OSError:
            pass
        time.sleep(0.005)
    lag.append(time.perf_counter() - done)
    dist.barrier()


def med(v):
    return sorted(v)[len(v) // 2]


if rank == 0:
    print(json.dumps({"base": med(base), "ours": med(ours), "first": ours[0], "cpu": med(cpu),
                      "lag": med(lag),
                      "load": os.getloadavg()[0]}), flush=True)
dist.destroy_process_group()
