"""``torch.distributed.checkpoint`` (DCP) through drun's ledger.

Every rank calls :func:`save` (or :func:`async_save`) with the same step; DCP writes the step's
directory (:func:`drun.step_dir`), each rank commits the files it wrote (``__<rank>_<n>.distcp``,
and rank 0 the shared ``.metadata``; a rank DCP gave nothing to write commits none), and the step
is sealed once every rank of every node has committed it. :func:`load` loads the sealed step
every rank resumes from, in place, whatever the world size that saved it (DCP re-shards)::

    import drun.dcp
    state = {"model": model.state_dict(), "optim": optim.state_dict()}
    start = drun.dcp.load(state)        # None: start fresh
    if start is not None:
        model.load_state_dict(state["model"]); optim.load_state_dict(state["optim"])
    for step in range((start or 0) + 1, steps + 1):
        ...
        if step % every == 0:
            drun.dcp.save({"model": model.state_dict(), "optim": optim.state_dict()}, step)

A ``torchdata.stateful_dataloader.StatefulDataLoader`` passed as ``loader=`` has its per-rank
state saved with the step (``loader-rank<r>.pt``) and restored by :func:`load`; that state does
not re-split when the world size changes (``load`` then raises), use
:class:`drun.ElasticSampler` and its ``cursor`` for elastic jobs.

Outside drun the checkpoint is written to ``./checkpoints/local/step-<step>-g0`` and nothing is
committed; :func:`load` returns None.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Protocol, Union

from . import _agent, _ledger
from ._agent import DrunError, available
from ._env import env_int as _env_int
from ._ledger import resume_info

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = ["async_save", "files_of_rank", "load", "save", "wait"]

_DISTCP = re.compile(r"^__(\d+)_\d+\.distcp$")
_LOADER = re.compile(r"^loader-rank(\d+)\.pt$")

_StateDict = Dict[str, Any]
"""What DCP saves and loads (``torch.distributed.checkpoint``'s ``STATE_DICT_TYPE``)."""


class _Stateful(Protocol):
    """A data loader whose state is saved with the step (``torchdata``'s
    ``StatefulDataLoader``)."""

    def state_dict(self) -> Dict[str, Any]: ...

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None: ...


class _Saves:
    """The :func:`async_save` in flight (one at a time, as DCP asks) and the gloo group its
    background collectives run on."""

    def __init__(self) -> None:
        self.pending: Optional[concurrent.futures.Future[Optional[_agent.Json]]] = None
        # new_group's type admits its non-member sentinel (an int), never returned here: every
        # rank is a member.
        self.group: Optional[Union[ProcessGroup, int]] = None


_SAVES = _Saves()


def files_of_rank(directory: str, rank: int) -> List[str]:
    """The files of DCP's checkpoint ``directory`` that ``rank`` wrote, sorted: its
    ``__<rank>_<n>.distcp`` files and ``loader-rank<rank>.pt``; rank 0 also owns every other
    file (DCP's ``.metadata``, written by the coordinator). Temporary ``*.tmp`` files and
    ``drun-manifest-*`` files are nobody's. Each file is thus listed under exactly one rank.
    """
    out: List[str] = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if not os.path.isfile(path) or name.endswith(".tmp") or name.startswith(
                ("drun-manifest-", ".tmp-")):
            continue
        m = _DISTCP.match(name) or _LOADER.match(name)
        owner = int(m.group(1)) if m else 0
        if owner == rank:
            out.append(path)
    return out


def _rank() -> int:
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except ImportError:
        pass
    return _env_int("RANK", 0)


def _save_loader(directory: str, loader: Optional[_Stateful], rank: int) -> None:
    """Writes ``loader``'s state into ``directory`` atomically: the step's directory (fsynced),
    or its staged copy in the agent's memory (``--ckpt-memory``: no fsync)."""
    if loader is None:
        return
    import torch

    _ledger._write_new(os.path.join(directory, "loader-rank%d.pt" % rank),
                       lambda f: torch.save(loader.state_dict(), f), sync=not _in_stage(directory),
                       hash=False)


def _in_stage(directory: str) -> bool:
    """Whether ``directory`` is inside the agent's staging directory (``DRUN_CKPT_STAGE_DIR``)."""
    stage = os.environ.get("DRUN_CKPT_STAGE_DIR")
    if not stage:
        return False
    return os.path.abspath(directory).startswith(os.path.abspath(stage) + os.sep)


def _staged_writer(directory: str) -> Any:
    """DCP's ``FileSystemWriter`` for a staged ``directory``, its data file written over this
    rank's spare staging memory, allocated and mapped ahead as :func:`drun.atomic_save`'s is
    (:class:`drun._stage.Spares`; the first of the rank's ``.distcp`` files per save, other
    files as DCP writes them); each save prepares the spare for the next from its data file's
    size."""
    import contextlib

    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import FileSystem

    class OverSpare(FileSystem):
        @contextlib.contextmanager
        def create_stream(self, path: Union[str, "os.PathLike[str]"],
                          mode: str) -> Iterator[Any]:
            if mode != "wb" or not str(path).endswith(".distcp"):
                with super().create_stream(path, mode) as stream:
                    yield stream
                return
            with _ledger.over_spare(str(path)) as stream:
                yield stream

    writer = FileSystemWriter(directory)
    writer.fs = OverSpare()
    return writer


def _commit(client: _agent.Client, step: int, written: str, final: str, rank: int,
            cursor: Optional[Dict[str, Any]], started_ms: Optional[int]) -> Optional[_agent.Json]:
    """Commits the files ``rank`` wrote under ``written`` (the step's directory ``final``, or
    its staged copy in memory: then they are committed staged, by their places in ``final``);
    ``started_ms``: when this rank began saving the step (the save cost of
    ``--ckpt-interval auto`` is measured from it)."""
    if not available():
        return None
    paths = _ledger.staged_files(written, final, files_of_rank(written, rank))
    msg: _agent.Json = {
        "op": "commit",
        "rank": _env_int("RANK", rank),
        "generation": _env_int("DRUN_GENERATION", 0),
        "step": int(step),
        "files": [_ledger.file_record(p) for p in paths],
    }
    staged_bytes = sum(_ledger.STATE.staged.pop(p, 0) for p in paths)
    if staged_bytes:
        _ledger.STATE.last_staged_bytes = staged_bytes
    _ledger.STATE.room = None
    if cursor is not None:
        msg["cursor"] = cursor
    if started_ms is not None:
        msg["save_started_ms"] = started_ms
    answer = None
    try:
        answer = client.request(msg, timeout=600.0)
        return answer
    finally:
        _ledger.STATE.spare.start(answer)


def save(state_dict: _StateDict, step: int, cursor: Optional[Dict[str, Any]] = None,
         loader: Optional[_Stateful] = None, **dcp_kwargs: Any) -> Optional[_agent.Json]:
    """Saves ``state_dict`` with ``torch.distributed.checkpoint.save`` into
    ``drun.step_dir(step)`` and commits this rank's files; returns the agent's answer (see
    :func:`drun.commit`), or None outside drun.

    A collective: every rank calls it with the same ``step``. ``cursor``: the global data cursor
    (:meth:`drun.ElasticSampler.cursor`) or None. ``loader``: a ``StatefulDataLoader`` whose
    ``state_dict()`` is saved with the step. ``dcp_kwargs`` go to DCP's ``save`` (e.g.
    ``planner``, ``storage_writer``; ``checkpoint_id`` is always the step's directory).

    Under ``drun --ckpt-memory`` DCP writes the step's staged directory in the agent's memory
    instead (:func:`drun._ledger.save_into`): the commit returns at once and the agent persists
    the files to ``drun.step_dir(step)`` behind the training; the step seals once they are there.

    Raises :class:`drun.DrunError` when the agent refuses the commit.
    """
    import torch.distributed.checkpoint as dcp

    wait()
    rank = _rank()
    _ledger.STATE.note_save_start()

    def write(directory: str) -> None:
        _save_loader(directory, loader, rank)
        kwargs = dict(dcp_kwargs)
        if _in_stage(directory) and "storage_writer" not in kwargs:
            kwargs["storage_writer"] = _staged_writer(directory)
        dcp.save(state_dict, checkpoint_id=directory, **kwargs)

    written, final = _ledger.save_into(step, write)
    started, _ledger.STATE.save_started_ms = _ledger.STATE.save_started_ms, None
    return _commit(_ledger.STATE.client, step, written, final, rank, cursor, started)


def _checkpoint_group() -> Optional[Union[ProcessGroup, int]]:
    """A gloo group for DCP's background collectives, so they never interleave with the
    training's on the default group (created once, collectively)."""
    import torch.distributed as dist

    if _SAVES.group is None and dist.is_available() and dist.is_initialized():
        _SAVES.group = dist.new_group(backend="gloo")
    return _SAVES.group


def async_save(state_dict: _StateDict, step: int, cursor: Optional[Dict[str, Any]] = None,
               loader: Optional[_Stateful] = None,
               **dcp_kwargs: Any) -> concurrent.futures.Future[Optional[_agent.Json]]:
    """Like :func:`save` with ``torch.distributed.checkpoint.async_save``: returns once the state
    is staged (copied), writes in the background and commits when DCP's future resolves, so the
    step is sealed only after every rank's write finished. A write that never finishes (the node
    died) is never committed, never sealed, never resumed from.

    Returns a ``concurrent.futures.Future`` resolving to the agent's answer (None outside drun),
    or raising DCP's error or :class:`drun.DrunError`. Waits for the previous one first (one
    async save in flight, as DCP asks); :func:`wait` waits for the last one, call it before exit.
    A collective, like :func:`save`; the first call creates a gloo group on every rank.

    Under ``drun --ckpt-memory`` the background write goes to the step's staged directory in the
    agent's memory (as :func:`save`), so it finishes sooner and the agent persists the files
    behind the training; a background write that fails there is not retried on disk (the future
    raises it, as a failed disk write would).
    """
    import torch.distributed.checkpoint as dcp

    wait()
    rank = _rank()
    _ledger.STATE.note_save_start()
    started, _ledger.STATE.save_started_ms = _ledger.STATE.save_started_ms, None
    dcp_kwargs.setdefault("process_group", _checkpoint_group())
    pending: List[Any] = []

    def write(directory: str) -> None:
        _save_loader(directory, loader, rank)
        pending.append(dcp.async_save(state_dict, checkpoint_id=directory, **dcp_kwargs))

    directory, final = _ledger.save_into(step, write)
    written = pending[-1]
    if not isinstance(written, concurrent.futures.Future):  # AsyncSaveResponse (staging too)
        written = written.upload_completion
    done: concurrent.futures.Future[Optional[_agent.Json]] = concurrent.futures.Future()

    def committed(f: concurrent.futures.Future[Any]) -> None:
        try:
            f.result()
            client = _agent.Client()  # its own connection: the training thread uses the shared one
            try:
                done.set_result(_commit(client, step, directory, final, rank, cursor, started))
            finally:
                client.close()
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on `done`
            done.set_exception(e)

    written.add_done_callback(committed)
    _SAVES.pending = done
    return done


def wait(timeout: Optional[float] = None) -> Optional[_agent.Json]:
    """Waits for the last :func:`async_save` to be written and committed; returns its answer
    (None when there is none). Raises what it raised."""
    f, _SAVES.pending = _SAVES.pending, None
    return None if f is None else f.result(timeout)


def load(state_dict: _StateDict, loader: Optional[_Stateful] = None,
         **dcp_kwargs: Any) -> Optional[int]:
    """Loads the sealed step every rank resumes from into ``state_dict`` in place (with
    ``torch.distributed.checkpoint.load``) and returns its step, or None to start fresh (nothing
    sealed yet, or outside drun). ``drun.resume_info()["path"]`` is that step's directory.

    ``loader``: the ``StatefulDataLoader`` given to :func:`save`; its state is restored.

    Raises ``ValueError`` when ``loader`` is given and the world size changed since the save
    (its per-rank state cannot be re-split: use :class:`drun.ElasticSampler`); DCP's errors when
    the checkpoint does not fit ``state_dict``.
    """
    info = resume_info()
    if info is None:
        return None
    import torch.distributed.checkpoint as dcp

    dcp.load(state_dict, checkpoint_id=info["path"], **dcp_kwargs)
    if loader is not None:
        _load_loader(info, loader)
    step: int = info["step"]
    return step


def _load_loader(info: Dict[str, Any], loader: _Stateful) -> None:
    import torch

    world = _env_int("WORLD_SIZE", 1)
    if info["world_size"] and info["world_size"] != world:
        raise ValueError(
            "step %d was saved by %d ranks, this generation has %d: a StatefulDataLoader's "
            "per-rank state cannot be re-split; use drun.ElasticSampler (global cursor) for jobs "
            "whose world size changes" % (info["step"], info["world_size"], world))
    path = os.path.join(info["path"], "loader-rank%d.pt" % _rank())
    if not os.path.exists(path):
        raise DrunError("step %d has no data loader state for rank %d (%s): was it saved with "
                        "drun.dcp.save(..., loader=loader)?" % (info["step"], _rank(), path))
    loader.load_state_dict(torch.load(path, weights_only=False))
