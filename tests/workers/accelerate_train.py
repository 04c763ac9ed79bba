"""A plain Hugging Face Accelerate loop on CPU with drun's recipe (drun.accelerate.load_state /
save_state) (tests/ckpt/frameworks.rs). `event` and the hold are the test's instrumentation.

  FW_OUT      directory for events.jsonl
  FW_STEPS    steps (default 16)
  FW_HOLD_AT  in a fresh start, stop after this step until killed
"""

import json
import os
import sys
import time

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import drun  # noqa: E402
import drun.accelerate  # noqa: E402

OUT = os.environ["FW_OUT"]
STEPS = int(os.environ.get("FW_STEPS", "16"))
HOLD_AT = int(os.environ.get("FW_HOLD_AT", "0"))


def event(accelerator, **kw):
    kw.update(rank=accelerator.process_index, pid=os.getpid(),
              gen=int(os.environ.get("DRUN_GENERATION", "0")))
    with open(os.path.join(OUT, "events.jsonl"), "a") as f:
        f.write(json.dumps(kw) + "\n")


def main():
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    x = torch.randn(512, 8)
    y = x @ torch.arange(8, dtype=torch.float32).unsqueeze(1)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    start = drun.accelerate.load_state(accelerator) or 0
    info = drun.resume_info()
    event(accelerator, event="start", step=start, resume_step=start or None,
          resume_path=info and info["path"],
          world=accelerator.num_processes,
          weight=accelerator.unwrap_model(model).weight.detach().flatten().tolist())
    step = start
    batches = iter(loader)
    while step < STEPS:
        try:
            xb, yb = next(batches)
        except StopIteration:
            batches = iter(loader)
            continue
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        accelerator.backward(loss)
        opt.step()
        step += 1
        if step % 4 == 0:
            drun.accelerate.save_state(accelerator, step)
            event(accelerator, event="at", step=step,
                  weight=accelerator.unwrap_model(model).weight.detach().flatten().tolist())
        if start == 0 and step == HOLD_AT:
            event(accelerator, event="holding", step=step)
            while True:
                time.sleep(1)
    event(accelerator, event="done", step=step)


if __name__ == "__main__":
    main()
