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

import hashlib
import json
import operator
import os
import random
import socket
import tempfile
import time

from ._version import __version__

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

PROTOCOL = 2
"""Version of the agent's worker API this helper speaks (``drun``'s ``ckpt::api::PROTOCOL``).
Checked once per connection (``hello``); a mismatch raises :class:`DrunError`."""

_CHUNK = 1 << 20


class DrunError(RuntimeError):
    """The agent refused a request (stale generation, misaligned data, ...)."""


def available():
    """True when running under a drun agent that offers the worker API."""
    return bool(os.environ.get("DRUN_AGENT_SOCK"))


class _Client:
    """One connection to the agent, opened on first use; requests are answered in order."""

    def __init__(self):
        self._sock = None
        self._file = None
        self._path = None

    def request(self, msg, timeout=None):
        path = os.environ.get("DRUN_AGENT_SOCK")
        if not path:
            raise DrunError("not running under drun (DRUN_AGENT_SOCK is unset)")
        if self._sock is None or self._path != path:
            self.close()
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            self._sock, self._file, self._path = s, s.makefile("rb"), path
            self._hello()
        return self._exchange(msg, timeout)

    def _hello(self):
        try:
            answer = self._exchange({"op": "hello", "protocol": PROTOCOL}, 30.0)
        except DrunError as e:
            self.close()
            raise DrunError(_mismatch(None, str(e))) from e
        theirs = answer.get("protocol")
        if theirs != PROTOCOL:
            self.close()
            raise DrunError(_mismatch(theirs, answer.get("agent")))

    def _exchange(self, msg, timeout):
        self._sock.settimeout(timeout)
        try:
            self._sock.sendall(json.dumps(msg).encode() + b"\n")
            line = self._file.readline()
        except OSError as e:  # includes socket.timeout
            self.close()
            raise DrunError("no answer from the drun agent to %s: %s" % (msg.get("op"), e)) from e
        if not line:
            self.close()
            raise DrunError("the drun agent closed the connection")
        answer = json.loads(line)
        if not answer.get("ok"):
            raise DrunError(answer.get("error", "refused"))
        return answer

    def close(self):
        for c in (self._file, self._sock):
            if c is not None:
                try:
                    c.close()
                except OSError:
                    pass
        self._sock = self._file = None


def _mismatch(theirs, detail):
    """The line for a helper/agent protocol mismatch."""
    if theirs is None:
        agent = "an older drun agent (%s)" % detail
    else:
        agent = "drun %s, whose worker API is protocol %s" % (detail, theirs)
    return ("this drun helper (%s) speaks worker-API protocol %d but runs under %s: install the "
            "helper that ships with the drun running this job (pip install the drun wheel of "
            "the same version, or pip install . from its source tree)"
            % (os.path.dirname(os.path.abspath(__file__)), PROTOCOL, agent))


_client = _Client()
_digests = {}
# When this rank began saving the checkpoint it commits next (ms since the Unix epoch): the
# first atomic_save() or True should_save() answer since the last commit. Sent with the commit;
# the seal measures the save cost from it (--ckpt-interval auto).
_save_started_ms = None


def _note_save_start():
    global _save_started_ms
    if _save_started_ms is None:
        _save_started_ms = int(time.time() * 1000)


def _step(step):
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


def _env_int(name, default=None):
    v = os.environ.get(name)
    return default if v in (None, "") else int(v)


def resume_info():
    """What every rank resumes from, or None to start fresh.

    Returns a dict: ``step``, ``generation`` (that saved it), ``world_size`` (that saved it),
    ``path`` (directory holding its files), ``manifest`` (path of the manifest file, which lists
    every file with size and SHA-256), ``epoch`` and ``global_samples`` (samples of that epoch's
    permutation already consumed, counted over all ranks), and ``cursor`` (the full cursor as
    committed, when the manifest file is readable).
    """
    step = _env_int("DRUN_RESUME_STEP")
    if step is None:
        return None
    info = {
        "step": step,
        "generation": _env_int("DRUN_RESUME_GENERATION", 0),
        "world_size": _env_int("DRUN_RESUME_WORLD_SIZE", 0),
        "path": os.environ.get("DRUN_RESUME_PATH"),
        "manifest": os.environ.get("DRUN_RESUME_MANIFEST"),
        "epoch": _env_int("DRUN_DATA_EPOCH", 0),
        "global_samples": _env_int("DRUN_GLOBAL_SAMPLES", 0),
        "cursor": None,
    }
    if info["manifest"]:
        try:
            with open(info["manifest"]) as f:
                info["cursor"] = json.load(f).get("cursor")
        except (OSError, ValueError):
            pass
    return info


def sha256_file(path):
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


def shard_path(step, name=None, rank=None):
    """Where this rank's file of ``step`` goes:
    ``<DRUN_CKPT_DIR>/<DRUN_RUN_ID>/step-<step>-g<generation>/<name>``.

    ``name`` defaults to ``rank<RANK>.pt``. The run id keeps runs sharing a checkpoint directory
    apart; the generation keeps a re-run of a step after a re-form from overwriting a checkpoint
    still in use. Outside drun the directory is ``./checkpoints/local``.
    """
    rank = _env_int("RANK", 0) if rank is None else rank
    base = os.environ.get("DRUN_CKPT_DIR") or "checkpoints"
    run = os.environ.get("DRUN_RUN_ID") or "local"
    gen = _env_int("DRUN_GENERATION", 0)
    return os.path.join(os.path.abspath(base), run, "step-%08d-g%d" % (step, gen),
                        name or "rank%d.pt" % rank)


def step_dir(step):
    """The directory every rank writes ``step``'s checkpoint into (created if missing):
    ``<DRUN_CKPT_DIR>/<DRUN_RUN_ID>/step-<step>-g<generation>``, the directory of
    :func:`shard_path`. Hand it to a writer that names its own files (``torch.distributed.checkpoint``
    with ``checkpoint_id=drun.step_dir(step)``), then :func:`commit` what this rank wrote.
    Outside drun: ``./checkpoints/local/step-<step>-g0``.
    """
    d = os.path.dirname(shard_path(step))
    os.makedirs(d, exist_ok=True)
    return d


def atomic_save(path, write):
    """Writes a file atomically and returns ``(sha256, bytes)``.

    ``write(f)`` gets a binary file object (a temporary file in the same directory), e.g.
    ``lambda f: torch.save(state, f)``. The file is flushed and fsynced, hashed (from the page
    cache), renamed into place and its directory fsynced, so a rank killed mid-write leaves no
    file at ``path``. The digest is remembered for :func:`commit`.
    """
    _note_save_start()
    path = os.path.abspath(path)
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-" + os.path.basename(path) + "-")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        digest = sha256_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    st = os.stat(path)
    _digests[path] = (st.st_mtime_ns, st.st_size, digest[0])
    return digest


def _file_record(path):
    path = os.path.abspath(path)
    st = os.stat(path)
    known = _digests.get(path)
    if known and known[0] == st.st_mtime_ns and known[1] == st.st_size:
        sha = known[2]
    else:
        sha, _ = sha256_file(path)
    return {"path": path, "bytes": st.st_size, "sha256": sha}


def commit(step, paths=(), cursor=None, timeout=600.0):
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
    msg = {
        "op": "commit",
        "rank": _env_int("RANK", 0),
        "generation": _env_int("DRUN_GENERATION", 0),
        "step": _step(step),
        "files": [_file_record(p) for p in paths],
    }
    if cursor is not None:
        msg["cursor"] = cursor
    global _save_started_ms
    if _save_started_ms is not None:
        msg["save_started_ms"] = _save_started_ms
    _save_started_ms = None
    return _client.request(msg, timeout=timeout)


def should_save(sync=True):
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
        local = bool(_client.request({"op": "should_save", "rank": _env_int("RANK", 0)},
                                     timeout=30.0)["save"])
    if local:
        _note_save_start()
    if not sync:
        return local
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return local
    if not (dist.is_available() and dist.is_initialized()):
        return local
    device = "cpu"
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([1 if local else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def progress(step, samples=None):
    """Step beacon: lets drun report how much work a re-form loses and this rank's seconds per
    step (``drun_rank_step_seconds`` with ``drun --metrics-port``). Cheap; call every step.

    ``samples``: how many samples this rank processes per step (optional); with it drun also
    reports ``drun_rank_samples_per_second``.
    """
    if available():
        req = {"op": "progress", "rank": _env_int("RANK", 0), "step": _step(step)}
        if samples is not None:
            req["samples"] = int(samples)
        answer = _client.request(req, timeout=30.0)
        _register_hang_dump(answer.get("hang_dump_signal"))


_hang_dump_signal = None


def _register_hang_dump(signum):
    """With ``drun --hang-timeout``: dump every thread's stack to stderr on ``signum``, which drun
    sends to a rank it judged hung (unless ``py-spy`` is on its PATH)."""
    global _hang_dump_signal
    if signum is None or signum == _hang_dump_signal:
        return
    import faulthandler

    try:
        faulthandler.register(int(signum), all_threads=True)
        _hang_dump_signal = signum
    except (ValueError, RuntimeError, OSError, AttributeError):
        pass


def _permutation(n, seed, epoch, shuffle):
    if not shuffle:
        return list(range(n))
    try:
        import torch
    except ImportError:
        order = list(range(n))
        random.Random(seed + epoch).shuffle(order)
        return order
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return torch.randperm(n, generator=g).tolist()


class ElasticSampler:
    """A ``DistributedSampler`` that resumes at drun's global data cursor.

    The permutation of epoch ``e`` is ``torch.randperm(dataset_len)`` seeded with ``seed + e``,
    exactly as ``DistributedSampler`` draws it, and rank ``r`` of ``W`` takes positions
    ``r, r + W, r + 2W, ...`` — the same indices ``DistributedSampler(shuffle=True, seed=seed)``
    yields when ``dataset_len`` is a multiple of ``global_batch``. Each optimizer step consumes
    ``global_batch`` consecutive positions of the permutation over all ranks, so after a re-form
    with another world size the remaining suffix is re-split and no sample is skipped or repeated.
    A trailing partial global batch is dropped. Without torch, ``random.Random(seed + epoch)``
    shuffles instead (same guarantees, different order).

    ``rank``/``world_size`` default to ``RANK``/``WORLD_SIZE``; the resume point to
    ``DRUN_DATA_EPOCH``/``DRUN_GLOBAL_SAMPLES`` (pass ``resume=False`` to ignore it).
    ``global_batch`` must be a multiple of every world size the job may run at (e.g. with
    ``--nnodes 1:3 --nproc-per-node 2``, a multiple of 2, 4 and 6). Iterate epochs from
    ``sampler.epoch`` (the resumed one): ``for epoch in range(sampler.epoch, epochs)``.
    """

    def __init__(self, dataset_len, seed=0, global_batch=1, shuffle=True, rank=None,
                 world_size=None, resume=True):
        self.dataset_len = int(dataset_len)
        self.seed = int(seed)
        self.global_batch = int(global_batch)
        self.shuffle = shuffle
        self.rank = _env_int("RANK", 0) if rank is None else int(rank)
        self.world_size = _env_int("WORLD_SIZE", 1) if world_size is None else int(world_size)
        if self.global_batch <= 0 or self.global_batch % self.world_size:
            raise ValueError("global_batch %d must be a positive multiple of the world size %d"
                             % (self.global_batch, self.world_size))
        if not 0 <= self.rank < self.world_size:
            raise ValueError("rank %d out of range for world size %d"
                             % (self.rank, self.world_size))
        self.local_batch = self.global_batch // self.world_size
        self.steps_per_epoch = self.dataset_len // self.global_batch
        self.usable = self.steps_per_epoch * self.global_batch
        self._resume_epoch, self._resume_offset = 0, 0
        info = resume_info() if resume else None
        if info is not None:
            self._resume_epoch, self._resume_offset = info["epoch"], info["global_samples"]
            saved = info.get("cursor") or {}
            for key, mine in (("dataset_len", self.dataset_len), ("seed", self.seed),
                              ("global_batch", self.global_batch)):
                if saved.get(key) and saved[key] != mine:
                    raise ValueError(
                        "the checkpoint's data cursor has %s=%s but this sampler %s=%s: the "
                        "global sample offset would not mean the same samples" %
                        (key, saved[key], key, mine))
        self.epoch = self._resume_epoch

    def set_epoch(self, epoch):
        """Like ``DistributedSampler.set_epoch``; the resume offset applies to its own epoch only."""
        self.epoch = int(epoch)

    @property
    def start(self):
        """Samples of this epoch's permutation consumed before this sampler's first index."""
        return self._resume_offset if self.epoch == self._resume_epoch else 0

    @property
    def start_step(self):
        """Optimizer steps of this epoch already done before this sampler's first batch."""
        return self.start // self.global_batch

    def indices(self):
        """This rank's indices for the current epoch, in order."""
        perm = _permutation(self.dataset_len, self.seed, self.epoch, self.shuffle)
        return [perm[p] for p in range(self.start + self.rank, self.usable, self.world_size)]

    def __iter__(self):
        return iter(self.indices())

    def __len__(self):
        return len(range(self.start + self.rank, self.usable, self.world_size))

    def cursor(self, batches_done):
        """The global cursor after ``batches_done`` optimizer steps of this sampler's epoch.

        Counted from where this sampler started (so pass the steps done since the resume).
        Identical on every rank, which is what :func:`commit` expects.
        """
        consumed = self.start + int(batches_done) * self.global_batch
        epoch = self.epoch
        if consumed > self.usable:
            raise ValueError(
                "%d batches after sample %d run past the end of epoch %d (%d samples per epoch); "
                "count the batches of the current epoch only" %
                (batches_done, self.start, epoch, self.usable))
        if consumed == self.usable:
            epoch, consumed = epoch + 1, 0
        return {
            "epoch": epoch,
            "consumed_in_epoch": consumed,
            "consumed_total": epoch * self.usable + consumed,
            "seed": self.seed,
            "dataset_len": self.dataset_len,
            "global_batch": self.global_batch,
        }
