"""Hugging Face Accelerate through drun's ledger: ``accelerator.save_state``/``load_state`` into
the step's directory, committed by every process.

::

    import drun.accelerate
    model, optim, loader = accelerator.prepare(model, optim, loader)
    start = drun.accelerate.load_state(accelerator) or 0     # the sealed step, or 0
    for step in range(start + 1, steps + 1):
        ...
        if step % every == 0:
            drun.accelerate.save_state(accelerator, step)

``save_state`` writes ``accelerator.save_state(drun.step_dir(step))`` (the main process writes
the model, optimizer, scheduler and sampler files; every process its
``random_states_<i>.pkl``), waits for every process, then each commits the files it wrote.
``load_state`` loads the sealed step every rank resumes from. Under ``drun --ckpt-memory``
``save_state`` writes the step's staged directory in the agent's memory instead: the commit
returns at once and the agent persists the files to ``--ckpt-dir`` behind the training. Outside drun: saves into
``./checkpoints/local/`` and starts fresh.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import drun
from drun import _ledger

if TYPE_CHECKING:
    from accelerate import Accelerator

__all__ = ["files_of_process", "load_state", "save_state"]

_RNG = re.compile(r"^random_states_(\d+)\.pkl$")


def files_of_process(directory: str, index: int) -> List[str]:
    """Files under ``directory`` (recursively, sorted) that process ``index`` wrote:
    ``random_states_<index>.pkl``; process 0 also owns every other file (the main process writes
    the model, optimizer and scheduler state). Each file belongs to exactly one process."""
    out: List[str] = []
    for root, _, names in os.walk(directory):
        for name in names:
            if name.startswith(("drun-manifest-", ".tmp-")):
                continue
            m = _RNG.match(name)
            if (int(m.group(1)) if m else 0) == index:
                out.append(os.path.join(root, name))
    return sorted(out)


def save_state(accelerator: Accelerator, step: int, cursor: Optional[Dict[str, Any]] = None,
               **save_kwargs: Any) -> Optional[Dict[str, Any]]:
    """``accelerator.save_state(drun.step_dir(step))`` and a commit of each process's files;
    returns the agent's answer (None outside drun). A collective: every process calls it with
    the same ``step``. ``cursor``: the global data cursor or None. Under ``drun --ckpt-memory``
    the state is written to memory and persisted by the agent behind the training. Raises
    :class:`drun.DrunError` when the agent refuses the commit."""
    _ledger.STATE.note_save_start()
    written, final = _ledger.save_into(
        step, lambda d: accelerator.save_state(d, **save_kwargs))
    accelerator.wait_for_everyone()
    mine = files_of_process(written, accelerator.process_index)
    return drun.commit(step, _ledger.staged_files(written, final, mine), cursor)


def load_state(accelerator: Accelerator, **load_kwargs: Any) -> Optional[int]:
    """Loads the sealed step every rank resumes from (``accelerator.load_state``) and returns
    its step, or None to start fresh."""
    info = drun.resume_info()
    if info is None:
        return None
    accelerator.load_state(info["path"], **load_kwargs)
    step: int = info["step"]
    return step
