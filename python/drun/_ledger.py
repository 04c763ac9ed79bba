"""The checkpoint ledger, worker side: the resume point every rank shares, where checkpoint files
go, atomic writes, and the commits, save requests and step beacons sent to the agent.

Outside drun every function degrades to "start fresh, nothing to commit"."""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import operator
import os
import sys
import tempfile
import time
from typing import (Any, BinaryIO, Callable, Dict, Iterable, Iterator, List, Mapping,
                    Optional, SupportsIndex, SupportsInt, Tuple, Union)

from ._agent import Client, DrunError, Json, available
from ._env import env_int
from ._flight import FlightDump
from ._hang import HangDump
from ._stage import MappedFile, Spares, fits_share

PathArg = Union[str, "os.PathLike[str]"]
"""A file's path, absolute or relative to the working directory."""

Step = Union[SupportsIndex, float]
"""A step number: an int, a NumPy integer, an integer tensor, or a float without a fraction."""

_CHUNK = 1 << 20


class State:
    """What this process keeps between calls: its connection to the agent (shared by every
    request of the training thread), the digests :func:`atomic_save` computed, when the
    checkpoint it commits next began saving, and its hang dumps (stacks, flight recorder)."""

    def __init__(self) -> None:
        self.client = Client()
        # abspath -> (st_mtime_ns, st_size, sha256) of each file atomic_save wrote: commit()
        # hashes again only a file changed since.
        self.digests: Dict[str, Tuple[int, int, str]] = {}
        # When this rank began saving the checkpoint it commits next (ms since the Unix epoch):
        # the first atomic_save() or True should_save() answer since the last commit. Sent with
        # the commit; the seal measures the save cost from it (--ckpt-interval auto).
        self.save_started_ms: Optional[int] = None
        self.hang_dump = HangDump()
        self.flight_dump = FlightDump()
        # abspath -> bytes of each file atomic_save staged in the agent's memory
        # (DRUN_CKPT_STAGE_DIR) instead of writing it at its path; commit() reports it staged,
        # and the agent hashes it as it persists it.
        self.staged: Dict[str, int] = {}
        # Whether the one "cannot stage, saving straight to disk" warning was printed.
        self.stage_warned = False
        # Bytes this rank staged for the step it last committed: a rank whose step does not
        # fit its share of the agent's --ckpt-memory budget (DRUN_CKPT_STAGE_SHARE) saves the
        # next ones straight to --ckpt-dir (:func:`_staged_place`).
        self.last_staged_bytes = 0
        # Whether the one "larger than this rank's share" line was printed.
        self.share_warned = False
        # The agent's answer, since the last commit, to whether this rank's next staged save
        # has room in its memory (None: not asked yet; :func:`_room_in_memory`).
        self.room: Optional[bool] = None
        # The staging memory allocated and mapped ahead for this rank's next staged save.
        self.spare = Spares()

    def note_save_start(self) -> None:
        """A save begins now, unless one began since the last commit."""
        if self.save_started_ms is None:
            self.save_started_ms = int(time.time() * 1000)


STATE = State()


def _step(step: Step) -> int:
    """``step`` as an int: an int, a NumPy integer, an integer tensor, or a float without a
    fraction. A fractional or negative step raises ValueError (it would name another step)."""
    if isinstance(step, float):
        if not step.is_integer():
            raise ValueError(f"drun: step must be a whole number, got {step!r}")
        step = int(step)
    try:
        n = operator.index(step)
    except TypeError:
        raise ValueError(f"drun: step must be a whole number, got {step!r}") from None
    if n < 0:
        raise ValueError(f"drun: step must be 0 or more, got {n}")
    return n


def resume_info() -> Optional[Dict[str, Any]]:
    """What every rank resumes from, or None to start fresh.

    Returns a dict: ``step``, ``generation`` (that saved it), ``world_size`` (that saved it),
    ``path`` (directory holding its files), ``manifest`` (path of the manifest file, which lists
    every file with size and SHA-256), ``epoch`` and ``global_samples`` (samples of that epoch's
    permutation already consumed, counted over all ranks), and ``cursor`` (the full cursor as
    committed, when the manifest file is readable).
    """
    step = env_int("DRUN_RESUME_STEP")
    if step is None:
        return None
    info: Dict[str, Any] = {
        "step": step,
        "generation": env_int("DRUN_RESUME_GENERATION", 0),
        "world_size": env_int("DRUN_RESUME_WORLD_SIZE", 0),
        "path": os.environ.get("DRUN_RESUME_PATH"),
        "manifest": os.environ.get("DRUN_RESUME_MANIFEST"),
        "epoch": env_int("DRUN_DATA_EPOCH", 0),
        "global_samples": env_int("DRUN_GLOBAL_SAMPLES", 0),
        "cursor": None,
    }
    if info["manifest"]:
        try:
            with open(info["manifest"]) as f:
                info["cursor"] = json.load(f).get("cursor")
        except (OSError, ValueError):
            pass
    return info


def sha256_file(path: PathArg) -> Tuple[str, int]:
    """(sha256 hex digest, size in bytes) of a file."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(_CHUNK)
            if not b:
                break
            h.update(b)
            n += len(b)
    return h.hexdigest(), n


def shard_path(step: int, name: Optional[str] = None, rank: Optional[int] = None) -> str:
    """Where this rank's file of ``step`` goes:
    ``<DRUN_CKPT_DIR>/<DRUN_RUN_ID>/step-<step>-g<generation>/<name>``.

    ``name`` defaults to ``rank<RANK>.pt``. The run id keeps runs sharing a checkpoint directory
    apart; the generation keeps a re-run of a step after a re-form from overwriting a checkpoint
    still in use. Outside drun the directory is ``./checkpoints/local``.
    """
    rank = env_int("RANK", 0) if rank is None else rank
    base = os.environ.get("DRUN_CKPT_DIR") or "checkpoints"
    run = os.environ.get("DRUN_RUN_ID") or "local"
    gen = env_int("DRUN_GENERATION", 0)
    return os.path.join(os.path.abspath(base), run, "step-%08d-g%d" % (step, gen),
                        name or "rank%d.pt" % rank)


def step_dir(step: int) -> str:
    """The directory every rank writes ``step``'s checkpoint into (created if missing):
    ``<DRUN_CKPT_DIR>/<DRUN_RUN_ID>/step-<step>-g<generation>``, the directory of
    :func:`shard_path`. Hand it to a writer that names its own files (``torch.distributed.checkpoint``
    with ``checkpoint_id=drun.step_dir(step)``), then :func:`commit` what this rank wrote.
    Outside drun: ``./checkpoints/local/step-<step>-g0``.
    """
    d = os.path.dirname(shard_path(step))
    os.makedirs(d, exist_ok=True)
    return d


def save_into(step: int, write: Callable[[str], object]) -> Tuple[str, str]:
    """Runs ``write(directory)``, a writer that names its own files (DCP, Lightning, Accelerate),
    for ``step``'s directory, and returns ``(written, final)``: where it wrote, and the step's
    directory in ``--ckpt-dir`` (:func:`step_dir`), which the commit names.

    Under ``drun --ckpt-memory`` (``DRUN_CKPT_STAGE_DIR`` set) ``written`` is the step's staged
    directory in the agent's memory (the same place under the staging directory as ``final``
    under ``DRUN_CKPT_DIR``): the writer writes memory, and :func:`staged_files` notes what it
    wrote as staged, so the commit returns at once and the agent persists the files behind the
    training. When writing there fails (a full tmpfs), ``write`` runs again into ``final`` after
    one warning line. Otherwise ``written`` is ``final``.
    """
    final = os.path.dirname(shard_path(step))
    staged = _staged_place(final)
    if staged is not None and not _room_in_memory():
        staged = None
    if staged is not None:
        try:
            os.makedirs(staged, exist_ok=True)
            with _no_zip_crc():
                write(staged)
        except Exception as e:  # noqa: BLE001 - a full tmpfs: save to disk instead
            _stage_failed(staged, e)
        else:
            return staged, final
    write(step_dir(step))
    return final, final


def staged_files(written: str, final: str, paths: Iterable[PathArg]) -> List[str]:
    """The places in ``final`` of ``paths``, files a writer wrote under ``written``
    (:func:`save_into`); when ``written`` is the staged directory each is noted staged with its
    size, so :func:`commit` reports it staged (the agent hashes it as it persists it)."""
    out: List[str] = []
    for p in paths:
        target = os.path.join(final, os.path.relpath(os.path.abspath(p), written))
        if written != final:
            STATE.staged[target] = os.path.getsize(p)
        out.append(target)
    return out


def _stage_failed(staged: str, e: BaseException) -> None:
    """The one warning line of a save that could not be staged and goes straight to disk."""
    if not STATE.stage_warned:
        STATE.stage_warned = True
        sys.stderr.write("drun: warning: cannot stage the checkpoint in memory (%s): %s; "
                         "saving it straight to --ckpt-dir\n" % (staged, e))


def atomic_save(path: PathArg, write: Callable[[BinaryIO], object]) -> Tuple[str, int]:
    """Writes a file atomically and returns ``(sha256, bytes)``.

    ``write(f)`` gets a binary file object (a temporary file in the same directory), e.g.
    ``lambda f: torch.save(state, f)``. The file is flushed and fsynced, hashed (from the page
    cache), renamed into place and its directory fsynced, so a rank killed mid-write leaves no
    file at ``path``. The digest is remembered for :func:`commit`.

    Under ``drun --ckpt-memory`` (``DRUN_CKPT_STAGE_DIR`` set) a ``path`` inside
    ``DRUN_CKPT_DIR`` is written to the agent's memory instead, at the same place under the
    staging directory, without fsync or hashing (the digest returned is ``""``), and
    ``torch.save`` skips its zip CRC-32s there (the agent's SHA-256 covers the file);
    :func:`commit` reports it staged and returns at once, and the agent writes it to ``path``
    behind the training, hashing it as it copies and verifying the copy on disk. When staging fails (a full or missing
    tmpfs) the file is saved to ``path`` as above, after one warning line.
    """
    STATE.note_save_start()
    path = os.path.abspath(path)
    STATE.staged.pop(path, None)
    staged = _staged_place(path)
    if staged is not None and not _room_in_memory():
        staged = None
    if staged is not None:
        try:
            with _no_zip_crc():
                digest = _write_new(staged, write, sync=False, hash=False, spare=True)
        except Exception as e:  # noqa: BLE001 - a full or missing tmpfs: save to disk instead
            _stage_failed(staged, e)
        else:
            STATE.staged[path] = digest[1]
            return digest
    digest = _write_new(path, write, sync=True, hash=True)
    st = os.stat(path)
    STATE.digests[path] = (st.st_mtime_ns, st.st_size, digest[0])
    return digest


@contextlib.contextmanager
def _no_zip_crc() -> Iterator[None]:
    """While a staged file is written, ``torch.save`` leaves out the CRC-32 of each record of its
    zip file (``torch.utils.serialization.config.save.compute_crc32``, torch 2.5 and later): on
    a 1 GiB state the CRC is about half of the save's time in the training's thread, and the
    agent's SHA-256 of the staged copy, verified again on disk, covers every byte of the file.
    ``torch.load`` does not check the CRCs; the zip records then read 0 (``unzip -t`` reports
    them). Nothing happens when torch is not imported (a writer that does not use it) or has no
    such option; the option is restored afterwards."""
    torch = sys.modules.get("torch")
    save = None
    if torch is not None:
        try:
            from torch.utils.serialization import config
            save = config.save
            before = bool(save.compute_crc32)
        except (ImportError, AttributeError):
            save = None
    if save is None:
        yield
        return
    save.compute_crc32 = False
    try:
        yield
    finally:
        save.compute_crc32 = before


def _staged_place(path: str) -> Optional[str]:
    """Where the file of ``path`` is staged in the agent's memory: at the same place under
    ``DRUN_CKPT_STAGE_DIR`` as ``path`` under ``DRUN_CKPT_DIR`` (``drun --ckpt-memory``); None
    when the agent stages nothing or ``path`` is outside ``DRUN_CKPT_DIR``."""
    stage = os.environ.get("DRUN_CKPT_STAGE_DIR")
    base = os.environ.get("DRUN_CKPT_DIR")
    if not (stage and base and available()):
        return None
    rel = os.path.relpath(path, os.path.abspath(base))
    if rel == os.curdir or rel.split(os.sep)[0] == os.pardir:
        return None
    if not fits_share(STATE.last_staged_bytes):
        # The agent would only send it to disk while the ranks wait, after it took the tmpfs
        # (memory charged to the job) beyond the budget.
        if not STATE.share_warned:
            STATE.share_warned = True
            sys.stderr.write(
                "drun: warning: this rank's last checkpoint step (%d bytes) is larger than its "
                "share of --ckpt-memory (%s bytes, DRUN_CKPT_STAGE_SHARE): its saves go "
                "straight to --ckpt-dir; give a larger --ckpt-memory to stage them\n"
                % (STATE.last_staged_bytes, os.environ.get("DRUN_CKPT_STAGE_SHARE", "?")))
        return None
    return os.path.join(stage, rel)


def _room_in_memory() -> bool:
    """Whether this rank's staged save about to be written stays in the agent's memory: asked
    once per checkpoint step, before its first file is written, for as much as the rank's last
    step took (a first save asks nothing; the agent admits it once written). The agent keeps
    its room until the step arrives; when there is none (the steps before it not on disk yet)
    the save goes straight to ``--ckpt-dir``, and the agent said why in one line: memory never
    holds more than ``--ckpt-memory``."""
    if STATE.room is not None:
        return STATE.room
    room = True
    if STATE.last_staged_bytes > 0:
        try:
            answer = STATE.client.request({
                "op": "stage_room", "rank": env_int("RANK", 0),
                "generation": env_int("DRUN_GENERATION", 0),
                "bytes": STATE.last_staged_bytes}, timeout=30.0)
            room = answer.get("stage") is not False
        except DrunError:
            room = True  # the commit says what is wrong
    STATE.room = room
    return room


def _write_new(path: str, write: Callable[[BinaryIO], object], sync: bool,
               hash: bool, spare: bool = False) -> Tuple[str, int]:
    """Writes ``path`` through a temporary file in its directory renamed into place (flushed,
    and with ``sync`` fsynced with its directory); returns ``(sha256, bytes)`` (the digest ``""``
    without ``hash``). With ``spare`` (a staged save) the temporary file is written over this
    rank's spare staging memory (:func:`over_spare`)."""
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-" + os.path.basename(path) + "-")
    try:
        if spare:
            os.close(fd)
            with over_spare(tmp) as f:
                write(f)
        else:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                if sync:
                    os.fsync(f.fileno())
        digest = sha256_file(tmp) if hash else ("", os.path.getsize(tmp))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if sync:
        dfd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return digest


@contextlib.contextmanager
def over_spare(path: str) -> Iterator[BinaryIO]:
    """A new file at ``path`` in the staging directory for a staged save, written over this
    rank's spare staging memory when one is ready (:class:`drun._stage.Spares`: the spare is
    renamed to ``path`` and written through its mapping, :class:`drun._stage.MappedFile`), else
    a plain file. Afterwards the spare for the next save is prepared in the background, sized by
    this file, and the mapping written through is unmapped there, once the commit returned
(:meth:`drun._stage.Spares.after_save`). A writer that fails leaves
    the file as far as it got (the caller removes it)."""
    spare = STATE.spare.take()
    used: List[mmap.mmap] = []
    size = 0
    try:
        if spare is not None:
            try:
                os.replace(spare.path, path)
            except OSError:
                spare.mapping.close()  # gone: a plain file
                spare = None
        if spare is None:
            with open(path, "wb") as f:
                yield f
            size = os.path.getsize(path)
            return
        fd = os.open(path, os.O_RDWR)
        try:
            mapped = MappedFile(fd, spare)
            try:
                yield mapped  # type: ignore[misc]
            finally:
                used.append(mapped.end())
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
    finally:
        STATE.spare.after_save(size, retire=used)


def file_record(path: PathArg) -> Json:
    """A commit's entry for one file: absolute path, size and SHA-256 (hashed again unless
    :func:`atomic_save` wrote it and it is unchanged since)."""
    path = os.path.abspath(path)
    staged = STATE.staged.get(path)
    if staged is not None:
        return {"path": path, "bytes": staged, "staged": True}
    st = os.stat(path)
    known = STATE.digests.get(path)
    if known and known[0] == st.st_mtime_ns and known[1] == st.st_size:
        sha = known[2]
    else:
        sha, _ = sha256_file(path)
    return {"path": path, "bytes": st.st_size, "sha256": sha}


def commit(step: Step, paths: Union[PathArg, Iterable[PathArg]] = (),
           cursor: Optional[Mapping[str, Any]] = None,
           timeout: Optional[float] = 600.0) -> Optional[Json]:
    """Reports this rank's checkpoint of ``step`` (files already written and renamed).

    A collective, like saving: **every** rank commits every checkpointed step, else the others
    wait (the agent names the missing ranks after 30 s). ``paths`` are the files this rank wrote
    (absolute or relative, inside ``--ckpt-dir``); it may be empty: a rank with nothing of its own
    still takes part. Each file is listed once in the manifest with its size and SHA-256 (a file
    two ranks report is listed under the lower rank). ``cursor`` is the global data cursor after
    ``step`` (see :meth:`ElasticSampler.cursor`), or None for a job without one (the step still
    gets version agreement and verification); every rank must report the same one, or the step
    is refused as misaligned data. Blocks until every rank of this node has reported ``step`` and
    the node's record is stored (at most ``timeout`` seconds). Returns the agent's answer:
    ``sealed`` is true on the ranks of the node whose record completed the checkpoint (then
    ``manifest`` is its manifest file); the others see ``waiting_for`` (nodes yet to report).
    Outside drun returns None.

    Raises :class:`DrunError` when refused — a stale generation (the group re-formed), a file
    whose size changed or outside ``--ckpt-dir``, a step not after the last one, misaligned
    cursors (naming the ranks) — or when the agent does not answer within ``timeout``.
    """
    if not available():
        return None
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    msg: Json = {
        "op": "commit",
        "rank": env_int("RANK", 0),
        "generation": env_int("DRUN_GENERATION", 0),
        "step": _step(step),
        "files": [file_record(p) for p in paths],
    }
    if cursor is not None:
        msg["cursor"] = cursor
    if STATE.save_started_ms is not None:
        msg["save_started_ms"] = STATE.save_started_ms
    STATE.save_started_ms = None
    STATE.room = None
    staged_bytes = 0
    for f in msg["files"]:
        if STATE.staged.pop(f["path"], None) is not None:
            staged_bytes += int(f["bytes"])
    if staged_bytes:
        STATE.last_staged_bytes = staged_bytes
    answer = None
    try:
        answer = STATE.client.request(msg, timeout=timeout)
        return answer
    finally:
        STATE.spare.start(answer)


def should_save(sync: bool = True) -> bool:
    """True when drun asks for a coordinated checkpoint (``--on-preempt checkpoint`` after a
    preemption warning, ``--on-scale-up checkpoint`` before admitting a new node, or
    ``--ckpt-interval`` when the interval since the last seal has passed): save and
    :func:`commit` now, at the same step on every rank.

    With ``sync`` (default) and ``torch.distributed`` initialized, the answers of all ranks are
    combined with an ``all_reduce(MAX)`` so every rank decides the same at the same step: it is
    then a collective, call it on every rank at the same point of the step. Outside drun: False.
    """
    local = False
    if available():
        local = bool(STATE.client.request({"op": "should_save", "rank": env_int("RANK", 0)},
                                          timeout=30.0)["save"])
    if local:
        STATE.note_save_start()
    if not sync:
        return local
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return local
    if not (dist.is_available() and dist.is_initialized()):
        return local
    device: Union[str, torch.device] = "cpu"
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([1 if local else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def progress(step: Step, samples: Optional[SupportsInt] = None) -> None:
    """Step beacon: lets drun report how much work a re-form loses and this rank's seconds per
    step (``drun_rank_step_seconds`` with ``drun --metrics-port``). Cheap; call every step.

    ``samples``: how many samples this rank processes per step (optional); with it drun also
    reports ``drun_rank_samples_per_second``.
    """
    if available():
        req: Json = {"op": "progress", "rank": env_int("RANK", 0), "step": _step(step)}
        if samples is not None:
            req["samples"] = int(samples)
        answer = STATE.client.request(req, timeout=30.0)
        STATE.hang_dump.register(answer.get("hang_dump_signal"))
        STATE.flight_dump.register(answer.get("flight_recorder"))
