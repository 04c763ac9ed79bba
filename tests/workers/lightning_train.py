"""A plain PyTorch Lightning DDP script on CPU whose only drun line is the callback
(tests/ckpt/frameworks.rs). `Probe` is the test's instrumentation, not part of the recipe.

  FW_OUT      directory for events.jsonl
  FW_STEPS    max_steps (default 16)
  FW_HOLD_AT  in a fresh start, stop after this step until killed
"""

import json
import os
import sys
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import drun  # noqa: E402
import drun.lightning  # noqa: E402

OUT = os.environ["FW_OUT"]
STEPS = int(os.environ.get("FW_STEPS", "16"))
HOLD_AT = int(os.environ.get("FW_HOLD_AT", "0"))


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class Probe(L.Callback):
    """Test instrumentation: records starts and ends, holds a fresh run at FW_HOLD_AT."""

    def event(self, trainer, **kw):
        kw.update(rank=trainer.global_rank, pid=os.getpid(), step=trainer.global_step,
                  gen=int(os.environ.get("DRUN_GENERATION", "0")))
        with open(os.path.join(OUT, "events.jsonl"), "a") as f:
            f.write(json.dumps(kw) + "\n")

    def on_train_start(self, trainer, pl_module):
        info = drun.resume_info()
        self.fresh = info is None
        self.event(trainer, event="start", resume_step=info and info["step"],
                   resume_path=info and info["path"],
                   weight=pl_module.net.weight.detach().flatten().tolist())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step % 4 == 0:
            self.event(trainer, event="at", weight=pl_module.net.weight.detach().flatten().tolist())
        if self.fresh and trainer.global_step == HOLD_AT:
            self.event(trainer, event="holding")
            while True:
                time.sleep(1)

    def on_train_end(self, trainer, pl_module):
        self.event(trainer, event="done")


def main():
    torch.manual_seed(0)
    x = torch.randn(512, 8)
    y = x @ torch.arange(8, dtype=torch.float32).unsqueeze(1)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    trainer = L.Trainer(
        accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        strategy="ddp", max_steps=STEPS, logger=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[drun.lightning.DrunCheckpoint(every_n_train_steps=4), Probe()])
    trainer.fit(Model(), loader)


if __name__ == "__main__":
    main()
