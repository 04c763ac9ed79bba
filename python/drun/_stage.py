"""Staging memory for the training's saves under ``drun --ckpt-memory``: a spare file per rank
allocated and mapped ahead, off the training's thread (:class:`Spares`), and the file object a
save writes through into it, one memory copy per write (:class:`MappedFile`)."""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
import warnings
from typing import Any, Iterable, List, Optional

from ._env import env_int

_MADV_POPULATE_WRITE = 23
"""Linux's ``madvise`` advice (5.14) that fills a mapping's page tables, writable, ahead of the
writes (:func:`_populate`)."""

_POPULATE_CHUNK = 4 << 20
"""Bytes of a spare's mapping populated by one ``madvise``, which holds the process's mappings
(``mmap_lock``) while it zeroes them: between two, the training's thread can take them (its
allocator maps and unmaps memory). Measured with a thread allocating 8 MiB tensors beside the
populate of 1 GiB of fresh pages: it waited up to 64.6 ms with 64 MiB a call, 5.4 ms with 4 MiB,
the populate as fast; on a host slow to fault pages in, the wait grows with the chunk."""

_libc: Optional[ctypes.CDLL] = None

_PARALLEL_COPY = 64 << 20
"""Writes of at least this many bytes are copied by several threads when the rank's share of
the node's cores allows (:func:`_copy_threads`)."""


class Spare:
    """A staging file allocated and mapped ahead: ``path`` (in the agent's staging directory),
    its first ``size`` bytes allocated (``posix_fallocate``: tmpfs pages allocated and zeroed)
    and mapped shared, page tables filled, in ``mapping``."""

    def __init__(self, path: str, mapping: mmap.mmap, size: int) -> None:
        self.path = path
        self.mapping = mapping
        self.size = size

    def discard(self) -> None:
        """Unmaps and removes it (a save that could not use it)."""
        self.mapping.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


class Spares:
    """This rank's spare staging file: once the commit of a staged save of N bytes returned, a
    background thread allocates a file of about N bytes in the agent's staging directory and
    maps it, and the next staged save of this rank writes over it through the mapping
    (:class:`MappedFile`): neither the allocation of fresh tmpfs pages nor a fault per page nor
    a ``write()`` per chunk happens in the training's thread, only the copy of the bytes (at
    1 GiB, 0.11 s of CPU against 0.42-0.49 s for ``write()`` over an allocated file).

    It costs one more file the size of this rank's last save in the staging tmpfs, gone with the
    agent's directory; it is made only while the tmpfs keeps twice its size free
    (:func:`leaves_room`), and it becomes the next step's staged file, counted by
    ``--ckpt-memory`` from then on. The first save of a rank has none."""

    def __init__(self) -> None:
        self.thread: Optional[threading.Thread] = None
        self.ready: Optional[Spare] = None
        # What the saves since the last commit asked for (:meth:`after_save`), started by
        # :meth:`start`: the largest size, and the mappings to unmap.
        self.pending = 0
        self.retire: List[mmap.mmap] = []
        # pending and retire are also swapped from DCP's async commit callback.
        self.lock = threading.Lock()

    @staticmethod
    def path() -> Optional[str]:
        """Where this rank's spare goes (in ``DRUN_CKPT_STAGE_DIR``), or None outside it."""
        stage = os.environ.get("DRUN_CKPT_STAGE_DIR")
        if not stage:
            return None
        return os.path.join(stage, ".spare-rank%d" % env_int("RANK", 0))

    def after_save(self, size: int, retire: Iterable[mmap.mmap] = ()) -> None:
        """A staged save of ``size`` bytes wrote through the mappings ``retire``: the spare for
        the next is prepared from :meth:`start` on, once the commit returned: not while the
        node's other ranks still write theirs (allocating a GiB of tmpfs pages takes CPU
        time from them, and the commit waits for the slowest)."""
        with self.lock:
            self.pending = max(self.pending, size)
            self.retire.extend(retire)

    def start(self, answer: Any = None) -> None:
        """Starts preparing what :meth:`after_save` asked for (``drun.commit`` calls it with the
        agent's ``answer``): no spare when the answer says ``"spares": false``, the agent's
        ``--ckpt-memory`` keeping no room for one beside the checkpoints it holds (the next save
        then allocates its memory as it writes); the last save's mappings are unmapped still."""
        with self.lock:
            size, retire = self.pending, self.retire
            self.pending, self.retire = 0, []
        if isinstance(answer, dict) and answer.get("spares") is False:
            size = 0
        if size or retire:
            self.prepare(size, retire)

    def take(self) -> Optional[Spare]:
        """The spare for a save now (waiting for its preparation when still running), or
        None."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        ready, self.ready = self.ready, None
        return ready

    def prepare(self, size: int, retire: Iterable[mmap.mmap] = ()) -> None:
        """Allocates and maps a spare of ``size`` bytes and a little more (a state that grows a
        bit) in the background, for the next save; first unmaps ``retire`` (the mappings the
        last save wrote through: unmapping a GiB's page tables is the background's work)."""
        old: List[mmap.mmap] = list(retire)
        path = self.path()
        want = size + size // 64 + (1 << 20)
        if path is None or size <= 0 or self.thread is not None \
                or not fits_share(want) \
                or not leaves_room(os.path.dirname(path), want):
            path = None
        if path is None and not old:
            return

        def allocate() -> None:
            for m in old:
                m.close()
            if path is None:
                return
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    os.posix_fallocate(fd, 0, want)
                    mapping = mmap.mmap(fd, want, flags=mmap.MAP_SHARED)
                finally:
                    os.close(fd)
                _populate(mapping, want)
            except (OSError, ValueError):
                try:
                    os.unlink(path)
                except OSError:
                    pass
                return
            self.ready = Spare(path, mapping, want)

        thread = threading.Thread(target=allocate, name="drun-stage-spare", daemon=True)
        if path is not None:
            self.thread = thread
        thread.start()


def fits_share(want: int) -> bool:
    """Whether a spare of ``want`` bytes fits this rank's share of the agent's ``--ckpt-memory``
    budget (``DRUN_CKPT_STAGE_SHARE``): the next save is written over it and counts in the
    budget as it, so a spare the share cannot hold would only count against the budget (a
    64 KiB budget got two 1 MiB spares, and then every save went to disk)."""
    try:
        share = int(os.environ.get("DRUN_CKPT_STAGE_SHARE", "0"))
    except ValueError:
        share = 0
    return share <= 0 or want <= share


def leaves_room(stage: str, want: int) -> bool:
    """Whether a spare of ``want`` bytes leaves the staging tmpfs room for as much again (the
    next save and its step's other copies): a spare never takes the room a save needs."""
    try:
        st = os.statvfs(stage)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize >= 2 * want


def _copy_threads() -> int:
    """How many threads copy one large write: this rank's share of the cores it may run on
    (``LOCAL_WORLD_SIZE`` ranks share them), 1 to 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(8, cores // max(1, env_int("LOCAL_WORLD_SIZE", 1))))


def _populate(mapping: mmap.mmap, size: int) -> None:
    """Fills the page tables of a spare's ``mapping`` (and the tmpfs pages behind them, which
    ``posix_fallocate`` only reserves: the first touch zeroes them) so that a save writing
    through it takes no fault per page, without holding the GIL: ``madvise`` through ctypes,
    which lets go of it, a chunk at a time (:data:`_POPULATE_CHUNK`). ``mmap``'s
    ``MAP_POPULATE`` held the GIL for the whole call: the training's thread of that rank could
    not run a line of Python for it (7.5 s for 1 GiB of fresh pages on a busy two-core machine;
    0.6 s for 2 GiB alone). Where
    the kernel has no ``MADV_POPULATE_WRITE`` (before 5.14) the rest is written with zeros
    (``memset``, also through ctypes), which faults the pages in: the next save writes over
    them."""
    global _libc
    if not sys.platform.startswith("linux"):
        return
    if _libc is None:
        _libc = ctypes.CDLL(None)
    view = (ctypes.c_char * size).from_buffer(mapping)
    try:
        base, advise = ctypes.addressof(view), True
        for off in range(0, size, _POPULATE_CHUNK):
            n = min(_POPULATE_CHUNK, size - off)
            if advise and _libc.madvise(ctypes.c_void_p(base + off), ctypes.c_size_t(n),
                                        _MADV_POPULATE_WRITE) == 0:
                continue
            advise = False
            ctypes.memset(base + off, 0, n)
    finally:
        del view  # the mapping can be closed once no ctypes view holds it


def _address(b: memoryview) -> Optional[int]:
    """The address of a contiguous buffer's first byte, or None when it cannot be had without
    a copy (a read-only buffer while torch is not loaded: the caller copies by slicing)."""
    if not b.readonly:
        return ctypes.addressof(ctypes.c_char.from_buffer(b))
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the given buffer is not writable": it is only read
        return int(torch.frombuffer(b, dtype=torch.uint8).data_ptr())


def _copy(dst: int, src: int, n: int, threads: int) -> None:
    """``memmove`` of ``n`` bytes, split among ``threads`` threads (ctypes lets go of the GIL
    while each copies)."""
    if threads <= 1 or n < _PARALLEL_COPY:
        ctypes.memmove(dst, src, n)
        return
    part = -(-n // threads)
    part += -part % 4096
    workers = [threading.Thread(target=ctypes.memmove, args=(dst + o, src + o, min(part, n - o)),
                                name="drun-stage-copy", daemon=True)
               for o in range(part, n, part)]
    for w in workers:
        w.start()
    ctypes.memmove(dst, src, min(part, n))
    for w in workers:
        w.join()


class MappedFile:
    """The binary file a staged save writes through (``torch.save(state, f)``): the temporary
    file of the save, whose first ``spare.size`` bytes are the spare's mapped memory. A
    ``write`` there is one memory copy (large ones by several threads, without the GIL); beyond
    it, a ``pwrite`` that grows the file (a save larger than its spare). The file's length is the
    furthest byte written, however the writer seeks (:meth:`end` cuts the spare's allocated
    tail). A writer that takes the descriptor (``fileno()``, writing around this object) first
    has the file cut to what was written and its offset set to the position: from then on this
    object writes through the descriptor too, as a plain file would."""

    def __init__(self, fd: int, spare: Spare) -> None:
        self._fd = fd
        self._map: Optional[mmap.mmap] = spare.mapping
        self._view: Optional[Any] = (ctypes.c_char * spare.size).from_buffer(spare.mapping)
        self._base = ctypes.addressof(self._view)
        self._limit = spare.size  # bytes at the start of the file written through the mapping
        self._pos = 0
        self._high = 0
        self._own = False  # the writer took the descriptor: plain writes at its offset
        self._threads = _copy_threads()
        self.closed = False

    def write(self, b: Any) -> int:
        mv = memoryview(b).cast("B")
        n = len(mv)
        if self._own:
            return os.write(self._fd, mv)
        pos, end = self._pos, self._pos + n
        inside = max(0, min(end, self._limit) - pos)
        if inside:
            src = _address(mv) if inside >= 4096 else None
            if src is None:
                assert self._map is not None
                self._map[pos:pos + inside] = mv[:inside]
            else:
                _copy(self._base + pos, src, inside, self._threads)
        rest = n - inside
        while rest:
            rest -= os.pwrite(self._fd, mv[n - rest:], end - rest)
        self._pos = end
        self._high = max(self._high, end)
        return n

    def writelines(self, lines: Iterable[Any]) -> None:
        for b in lines:
            self.write(b)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if self._own:
            return os.lseek(self._fd, offset, whence)
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._high}[whence]
        if base + offset < 0:
            raise OSError(22, "negative seek position %d" % (base + offset))
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return os.lseek(self._fd, 0, os.SEEK_CUR) if self._own else self._pos

    def truncate(self, size: Optional[int] = None) -> int:
        size = self.tell() if size is None else size
        os.ftruncate(self._fd, size)
        if not self._own:
            self._high = size
            self._limit = min(self._limit, size)  # never write mapped pages past the end
        return size

    def fileno(self) -> int:
        if not self._own:
            os.ftruncate(self._fd, self._high)
            os.lseek(self._fd, self._pos, os.SEEK_SET)
            self._limit = 0
            self._own = True
        return self._fd

    def flush(self) -> None:
        pass

    def close(self) -> None:
        """Nothing to release before :meth:`end` (the caller owns the descriptor)."""
        self.closed = True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def end(self) -> mmap.mmap:
        """Cuts the file to the furthest byte written (unless the writer took the descriptor:
        then the file's length is already its own) and hands back the mapping, to be unmapped
        (:meth:`Spares.prepare`)."""
        if not self._own:
            os.ftruncate(self._fd, self._high)
        self._view = None  # the mapping can be closed once no ctypes view holds it
        m, self._map = self._map, None
        self.closed = True
        assert m is not None
        return m
