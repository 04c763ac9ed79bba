""":class:`ElasticSampler`: a ``DistributedSampler`` that resumes at drun's global data cursor,
whatever the new world size."""

from __future__ import annotations

import random
from typing import Dict, Iterator, List, Optional

from ._env import env_int
from ._ledger import resume_info


def _permutation(n: int, seed: int, epoch: int, shuffle: bool) -> List[int]:
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
    perm: List[int] = torch.randperm(n, generator=g).tolist()
    return perm


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

    def __init__(self, dataset_len: int, seed: int = 0, global_batch: int = 1,
                 shuffle: bool = True, rank: Optional[int] = None,
                 world_size: Optional[int] = None, resume: bool = True) -> None:
        self.dataset_len = int(dataset_len)
        self.seed = int(seed)
        self.global_batch = int(global_batch)
        self.shuffle = shuffle
        self.rank = env_int("RANK", 0) if rank is None else int(rank)
        self.world_size = env_int("WORLD_SIZE", 1) if world_size is None else int(world_size)
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

    def set_epoch(self, epoch: int) -> None:
        """Like ``DistributedSampler.set_epoch``; the resume offset applies to its own epoch only."""
        self.epoch = int(epoch)

    @property
    def start(self) -> int:
        """Samples of this epoch's permutation consumed before this sampler's first index."""
        return self._resume_offset if self.epoch == self._resume_epoch else 0

    @property
    def start_step(self) -> int:
        """Optimizer steps of this epoch already done before this sampler's first batch."""
        return self.start // self.global_batch

    def indices(self) -> List[int]:
        """This rank's indices for the current epoch, in order."""
        perm = _permutation(self.dataset_len, self.seed, self.epoch, self.shuffle)
        return [perm[p] for p in range(self.start + self.rank, self.usable, self.world_size)]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices())

    def __len__(self) -> int:
        return len(range(self.start + self.rank, self.usable, self.world_size))

    def cursor(self, batches_done: int) -> Dict[str, int]:
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
