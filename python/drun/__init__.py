"""Worker-side helper for drun's checkpoint ledger. Standard library only.

Under drun every rank learns the same resume point (the newest sealed, verified checkpoint) and
the same *global* data cursor; this module reads them, commits checkpoints through the agent
(``DRUN_AGENT_SOCK``, newline-delimited JSON), and provides :class:`ElasticSampler`, a drop-in
for ``torch.utils.data.DistributedSampler`` that resumes at the global cursor whatever the new
world size. Outside drun (plain ``torchrun`` or ``python``) every function degrades to "start
fresh, nothing to commit", so scripts keep running unchanged.

Typical use::

    import drun
    sampler = drun.ElasticSampler(len(ds), seed=0, global_batch=256)
    loader = DataLoader(ds, batch_size=sampler.local_batch, sampler=sampler)
    info = drun.resume_info()          # None: start fresh
    ...
    path = drun.shard_path(step)       # <DRUN_CKPT_DIR>/step-<step>-g<generation>/rank<r>.pt
    drun.atomic_save(path, lambda f: torch.save(state, f))
    drun.commit(step, [path], sampler.cursor(batches_done))

With ``torch.distributed.checkpoint`` use :mod:`drun.dcp` (``drun.dcp.save(state, step)``,
``drun.dcp.load(state)``); with Lightning :mod:`drun.lightning`; with Accelerate
:mod:`drun.accelerate`.
"""

from ._agent import PROTOCOL, DrunError, available
from ._ledger import (STATE as _STATE, atomic_save, commit, progress, resume_info, sha256_file,
                      shard_path, should_save, step_dir)
from ._sampler import ElasticSampler
from ._sampler import _permutation as _permutation  # the unit tests compare with it
from ._version import __version__ as __version__

# The package's modules: _agent (the connection to the node agent and its protocol), _ledger
# (resume point, checkpoint paths, atomic writes, commits, save requests, step beacons), _stage
# (the spare staging memory a staged save is written through), _sampler
# (ElasticSampler), _hang (the hang's stack dump), _flight (the hang's flight-recorder dump), _env
# (integers from the environment); dcp, lightning and accelerate (the checkpointing recipes) and
# preflight (``drun --preflight``, run as a script).

__all__ = [
    "DrunError",
    "ElasticSampler",
    "PROTOCOL",
    "atomic_save",
    "available",
    "commit",
    "progress",
    "resume_info",
    "sha256_file",
    "shard_path",
    "should_save",
    "step_dir",
]

# This process's connection to the agent (the unit tests close it between tests).
_client = _STATE.client
