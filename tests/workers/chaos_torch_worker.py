"""Torch (gloo, CPU) worker for chaos runs: the history of chaos_worker.py, with a real model.

Fits a linear regression (float64, 8 features, SGD with momentum) to a synthetic dataset drawn
from a fixed seed, through drun.ElasticSampler, at a FIXED GLOBAL BATCH whatever the world size:
each rank sums the squared errors of its global_batch/world samples of the step, the gradients
are summed over ranks with a gloo all_reduce and divided by the global batch, so the update of
a step is the same at every world size (up to float64 summation order). A commit every
CHAOS_EVERY steps saves the model and the optimizer state (momentum buffers) through drun's
checkpoint API (every rank its own file, drun.shard_path); a resumed generation loads rank 0's
file of the checkpoint drun names. The rank 0 that finishes writes $CHAOS_OUT/final.json:
{"gen", "step", "params": [floats]} (weight then bias), which the chaos runner compares with a
fault-free run.

History records, knobs and CHAOS_BREAK_OFFSET: those of chaos_worker.py (same checker).
Test-only switch: CHAOS_BREAK_MOMENTUM=1 makes a resumed worker drop the optimizer state it
loaded (a deliberately lost momentum that the runner's model comparison must catch).
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import drun  # noqa: E402

OUT = os.environ["CHAOS_OUT"]
RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
GEN = int(os.environ.get("DRUN_GENERATION", "0"))
NODE = int(os.environ.get("CHAOS_NODE", "0"))
N = int(os.environ.get("CHAOS_DATASET", "192"))
GB = int(os.environ.get("CHAOS_GB", "24"))
EPOCHS = int(os.environ.get("CHAOS_EPOCHS", "3"))
EVERY = int(os.environ.get("CHAOS_EVERY", "2"))
SLEEP = float(os.environ.get("CHAOS_SLEEP", "0.15"))
SEED = int(os.environ.get("CHAOS_SEED", "7"))
FEATURES = 8
LR, MOMENTUM = 0.05, 0.9


def log(kind, **kw):
    kw.update(kind=kind, gen=GEN, rank=RANK, world=WORLD, node=NODE, pid=os.getpid(),
              t=time.time())
    fd = os.open(os.path.join(OUT, "history.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, (json.dumps(kw) + "\n").encode())
    os.close(fd)


def dataset():
    """y = x.w + 0.3 + noise, the same on every rank and in every run."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(N, FEATURES, generator=g, dtype=torch.float64)
    w = torch.randn(FEATURES, generator=g, dtype=torch.float64)
    y = x @ w + 0.3 + 0.1 * torch.randn(N, generator=g, dtype=torch.float64)
    return x, y


def save(step, model, opt):
    path = drun.shard_path(step)
    drun.atomic_save(path, lambda f: torch.save(
        {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, f))
    return path


def main():
    torch.set_num_threads(1)
    dist.init_process_group(backend="gloo", init_method="env://")
    x, y = dataset()
    torch.manual_seed(0)  # the same initial parameters on every rank
    model = torch.nn.Linear(FEATURES, 1, dtype=torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    info = drun.resume_info()
    sampler = drun.ElasticSampler(N, seed=SEED, global_batch=GB)
    if os.environ.get("CHAOS_BREAK_OFFSET") == "1" and info:
        sampler._resume_offset += WORLD
    if info:
        state = torch.load(os.path.join(info["path"], "rank0.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        if os.environ.get("CHAOS_BREAK_MOMENTUM") != "1":
            opt.load_state_dict(state["optimizer"])
    log("start", resume=info and {"step": info["step"], "generation": info["generation"],
                                  "epoch": info["epoch"], "samples": info["global_samples"]})
    step = info["step"] if info else 0
    for epoch in range(sampler.epoch, EPOCHS):
        sampler.set_epoch(epoch)
        if RANK == 0:
            log("perm", epoch=epoch, perm=drun._permutation(N, SEED, epoch, True))
        mine = sampler.indices()
        lb = sampler.local_batch
        for b in range(len(mine) // lb):
            step += 1
            idx = mine[b * lb:(b + 1) * lb]
            opt.zero_grad(set_to_none=True)
            ((model(x[idx]).squeeze(1) - y[idx]) ** 2).sum().backward()
            for p in model.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad /= GB
            opt.step()
            time.sleep(SLEEP)
            log("step", step=step, epoch=epoch, idx=idx)
            if step % EVERY:
                continue
            cursor = sampler.cursor(b + 1)
            path = save(step, model, opt)
            try:
                answer = drun.commit(step, [path], cursor, timeout=60)
            except drun.DrunError as e:
                log("refused", step=step, error=str(e))
                sys.exit(3)
            log("commit", step=step, cursor={"epoch": cursor["epoch"],
                                             "samples": cursor["consumed_in_epoch"]},
                sealed=bool(answer and answer.get("sealed")))
    log("done", step=step)
    if RANK == 0:
        params = model.weight.detach().flatten().tolist() + model.bias.detach().tolist()
        final = os.path.join(OUT, "final.json")
        with open(final + ".tmp", "w") as f:
            json.dump({"gen": GEN, "step": step, "params": params}, f)
        os.replace(final + ".tmp", final)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
