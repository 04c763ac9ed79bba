"""A gloo job checkpointing with torch.distributed.checkpoint through drun.dcp (tests/ckpt/dcp.rs).

The data of step s depends on s only (no sampler, no cursor), so a run that resumes from a
checkpoint ends with the same model as one that never failed. Environment:

  DCP_OUT       directory for events.jsonl and final.pt (rank 0)
  DCP_STEPS     steps to train (default 24)
  DCP_EVERY     checkpoint every K steps (default 4)
  DCP_ASYNC     "1": drun.dcp.async_save instead of drun.dcp.save
  DCP_HOLD_AT   in a fresh start (nothing to resume), stop before this step until killed
                (or until DCP_OUT/crash exists: then exit 1)
  DCP_SLOW_STEP with DCP_ASYNC, in a fresh start, the background write of this step never
                finishes (it announces itself with DCP_OUT/writing-<step>-rank<r>)
  DCP_WAIT_HOLD with DCP_ASYNC, "1": wait for the last async_save's commit before holding
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as tdcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import drun  # noqa: E402
import drun.dcp  # noqa: E402

OUT = os.environ["DCP_OUT"]
STEPS = int(os.environ.get("DCP_STEPS", "24"))
EVERY = int(os.environ.get("DCP_EVERY", "4"))
ASYNC = os.environ.get("DCP_ASYNC") == "1"
HOLD_AT = int(os.environ.get("DCP_HOLD_AT", "0"))
SLOW_STEP = int(os.environ.get("DCP_SLOW_STEP", "0"))
WAIT_HOLD = os.environ.get("DCP_WAIT_HOLD") == "1"
GLOBAL_BATCH = 16


def event(**kw):
    kw.update(rank=dist.get_rank(), gen=int(os.environ.get("DRUN_GENERATION", "0")), t=time.time())
    with open(os.path.join(OUT, "events.jsonl"), "a") as f:
        f.write(json.dumps(kw) + "\n")


class SlowWriter(tdcp.FileSystemWriter):
    """Writes one file of DCP_SLOW_STEP's checkpoint, then never finishes (until killed)."""

    def __init__(self, path, step):
        super().__init__(path)
        self.step = step

    def write_data(self, plan, planner):
        if self.step == SLOW_STEP and drun.resume_info() is None:
            with open(os.path.join(self.path, "__%d_0.distcp" % dist.get_rank()), "wb") as f:
                f.write(b"partial")
            open(os.path.join(OUT, "writing-%d-rank%d" % (self.step, dist.get_rank())), "w").close()
            while True:
                time.sleep(1)
        return super().write_data(plan, planner)


def batch(step, rank, world):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, 8, generator=g)
    y = x @ torch.arange(8, dtype=torch.float32).unsqueeze(1) + 0.5
    per = GLOBAL_BATCH // world
    return x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model_sd, optim_sd = get_state_dict(model, opt)  # creates the optimizer's state to load into
    state = {"model": model_sd, "optim": optim_sd}
    start = drun.dcp.load(state)
    if start is not None:
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
    info = drun.resume_info()
    event(event="start", resume_step=start, resume_path=info and info["path"], world=world)
    for step in range((start or 0) + 1, STEPS + 1):
        if start is None and step == HOLD_AT:
            if WAIT_HOLD:
                answer = drun.dcp.wait()
                event(event="committed", step=step - step % EVERY, sealed=answer["sealed"],
                      staged=answer.get("staged", False))
            event(event="holding", step=step)
            while not os.path.exists(os.path.join(OUT, "crash")):
                time.sleep(0.05)
            event(event="crashing", step=step)
            sys.exit(1)
        x, y = batch(step, rank, world)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y) / world
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        drun.progress(step)
        if step % EVERY == 0:
            model_sd, optim_sd = get_state_dict(model, opt)
            state = {"model": model_sd, "optim": optim_sd}
            if ASYNC:
                d = drun.step_dir(step)
                drun.dcp.async_save(state, step, storage_writer=SlowWriter(d, step))
                event(event="async_saved", step=step)
            else:
                answer = drun.dcp.save(state, step)
                event(event="committed", step=step, sealed=answer and answer["sealed"],
                      staged=answer and answer.get("staged", False))
    drun.dcp.wait()
    if rank == 0:
        torch.save({"model": model.state_dict()}, os.path.join(OUT, "final.pt"))
    event(event="done", step=STEPS)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
