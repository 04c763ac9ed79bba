"""PyTorch Lightning through drun's ledger: one callback, no other change to the script.

::

    import drun.lightning
    trainer = L.Trainer(..., callbacks=[drun.lightning.DrunCheckpoint(every_n_train_steps=100)])
    trainer.fit(model, data)        # no ckpt_path: resumes drun's sealed step by itself

Every ``every_n_train_steps`` optimizer steps the callback saves a full Lightning checkpoint
(``trainer.save_checkpoint``, written by global rank 0) to ``drun.step_dir(step)/lightning.ckpt``
and every rank commits the step (rank 0 with the file, the others with none), so the step is
sealed only once the file is complete and every rank got there. Under ``drun --ckpt-memory`` the
file is written to the step's staged directory in the agent's memory instead: the commit returns
at once and the agent persists it to ``--ckpt-dir`` behind the training. After a re-form, ``fit`` resumes
from the sealed step (model, optimizer, loop counters, callbacks): the callback is an
``OnExceptionCheckpoint``, whose ``ckpt_path`` Lightning itself loads when ``fit`` is called
without one; here it is the sealed step's file. Unlike Lightning's, it saves nothing on an
exception (an uncoordinated save is never sealed) and deletes nothing at teardown.

Outside drun (``python script.py``, plain ``torchrun``) checkpoints go to
``./checkpoints/local/`` and a run starts fresh.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

from lightning.pytorch.callbacks import OnExceptionCheckpoint

import drun
from drun import _ledger

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from lightning.pytorch.utilities.types import STEP_OUTPUT

__all__ = ["DrunCheckpoint"]

FILE_NAME = "lightning.ckpt"


class DrunCheckpoint(OnExceptionCheckpoint):
    """Saves and commits every ``every_n_train_steps`` optimizer steps (``trainer.global_step``,
    a positive int); ``fit`` resumes from the step drun seals. ``cursor``: an optional callable
    ``cursor(trainer) -> dict`` giving the global data cursor (e.g. from a
    :class:`drun.ElasticSampler`); without it the step carries none."""

    def __init__(self, every_n_train_steps: int,
                 cursor: Optional[Callable[[pl.Trainer], Dict[str, Any]]] = None) -> None:
        if int(every_n_train_steps) <= 0:
            raise ValueError("every_n_train_steps must be a positive number of optimizer steps, "
                             "got %r" % (every_n_train_steps,))
        super().__init__(dirpath=os.path.dirname(drun.shard_path(0)), filename="unused")
        self.every = int(every_n_train_steps)
        self.cursor = cursor
        self._last: Optional[int] = None

    # Lightning types it str; fit() skips a None (start fresh) when it looks for the one to load.
    @property
    def ckpt_path(self) -> Optional[str]:  # type: ignore[override]
        """The sealed step's checkpoint file every rank resumes from; None to start fresh."""
        info = drun.resume_info()
        if info is None:
            return None
        path: str = os.path.join(info["path"], FILE_NAME)
        if not os.path.exists(path):
            raise drun.DrunError(
                "drun resumes step %d from %s but it holds no %s: was it saved by "
                "drun.lightning.DrunCheckpoint?" % (info["step"], info["path"], FILE_NAME))
        return path

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: STEP_OUTPUT, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step <= 0 or step % self.every or step == self._last:
            return
        self._last = step
        _ledger.STATE.note_save_start()
        # Every rank saves; global rank 0 writes, then a barrier. Under --ckpt-memory into the
        # step's staged directory in memory: the commit returns at once, the agent persists it.
        written, final = _ledger.save_into(
            step, lambda d: trainer.save_checkpoint(os.path.join(d, FILE_NAME)))
        cursor = self.cursor(trainer) if self.cursor else None
        mine = [os.path.join(written, FILE_NAME)] if trainer.is_global_zero else []
        drun.commit(step, _ledger.staged_files(written, final, mine), cursor)

    def on_exception(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        """Saves nothing: a save by some ranks only is never sealed."""

    def teardown(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        """Deletes nothing: sealed checkpoints belong to the ledger (see ``--ckpt-keep-last``)."""
