"""DataLoaders for training and evaluation: one process or torch.distributed ranks, reproducible.

:func:`make_loader` picks the sampler:

- training: ``DistributedSampler(shuffle=True, seed=seed, drop_last=True)`` over the ranks of
  an initialised process group (one "rank" of one without a group), and batches of exactly
  ``batch_size`` (the per-rank batch; the last incomplete batch is dropped, so every rank runs
  the same number of steps and no BN layer sees a batch of one). ``train_sampler`` replaces
  the ``DistributedSampler`` by another per-rank sampler with ``set_epoch``, e.g. the
  class-uniform sampling of segmentation (:class:`~.class_uniform.ClassUniformSampler`);
- evaluation: :class:`ShardSampler`, rank ``r`` of ``world`` takes indices ``r::world``,
  unpadded, so every sample is evaluated exactly once (``DistributedSampler`` would repeat
  samples to even out the ranks and bias the error), as the authors' ``TestDistributedSampler``
  (mapillary/inplace_abn ``scripts/dataset/sampler.py``).

**Reproducibility.** The order is a function of ``(seed, epoch)`` (``DistributedSampler``'s
shuffle). Augmentation is made a function of ``(seed, epoch, sample index)`` too: the sampler
is wrapped in :class:`SeededSampler`, which hands each index over with its own seed, and the
dataset in :class:`SeededDataset`, which runs the item's transform with torch's, numpy's and
Python's generators seeded from it (restoring them afterwards when it runs in the training
process). So batches do not depend on the number of workers, on which worker gets which
batch, or on what else consumed random numbers in the process (with ``workers=0`` the
transform runs in the training process, beside dropout and initialisation); a run resumed at
epoch ``e`` sees exactly the batches it would have seen. The epoch is the one given to
``loader.sampler.set_epoch(epoch)``; without calls it counts the passes over the loader (0,
1, 2, ...), so a loader built once per epoch with ``seed + epoch`` and a loader reused with
``set_epoch`` are both deterministic. Workers also get the usual deterministic seeding (the
loader's generator seeded from ``seed``, ``worker_init_fn`` seeding numpy and ``random`` from
the worker's torch seed) for datasets that draw random numbers outside ``__getitem__``.

Memory is pinned when the device is CUDA; workers persist across epochs when there are any.
"""
import random

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, Sampler

_MASK64 = (1 << 64) - 1


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def sample_seed(seed, epoch, index, occurrence=0):
    """A 64-bit seed for one sample's augmentation, mixed from ``(seed, epoch, index)``.

    ``occurrence`` (``k`` for the ``k+1``-th appearance of ``index`` in one epoch, for samplers
    that repeat indices) is mixed in too when it is not 0, so repetitions are augmented
    differently; 0 gives the seed of ``(seed, epoch, index)`` alone.
    """
    h = 0
    for v in (seed, epoch, index):
        h = _splitmix64(h ^ (int(v) & _MASK64))
    if occurrence:
        h = _splitmix64(h ^ (int(occurrence) & _MASK64))
    return h


class ShardSampler(Sampler):
    """Rank ``rank`` of ``num_replicas`` takes indices ``rank, rank + num_replicas, ...``.

    Unpadded: the shards partition ``range(len(dataset))``, so over all ranks every index is
    visited exactly once (shard sizes differ by at most one). ``data`` is a dataset or a
    length; ``num_replicas`` and ``rank`` default to the initialised process group's, or one
    process.
    """

    def __init__(self, data, num_replicas=None, rank=None):
        self.length = data if isinstance(data, int) else len(data)
        self.num_replicas, self.rank = _world(num_replicas, rank)

    def __iter__(self):
        return iter(range(self.rank, self.length, self.num_replicas))

    def __len__(self):
        return len(range(self.rank, self.length, self.num_replicas))


class SeededSampler(Sampler):
    """Yields ``(index, sample_seed(seed, epoch, index))`` for each index of ``sampler``.

    ``set_epoch(e)`` sets the epoch (and the wrapped sampler's, if it has ``set_epoch``); each
    further pass without a new ``set_epoch`` counts one epoch on, for both. A wrapped sampler
    that can repeat an index within an epoch may have an ``occurrences()`` method, called after
    its ``set_epoch``: per index it will yield, the number of earlier appearances of that index
    in the epoch (over all ranks); those go into :func:`sample_seed` so that each repetition
    gets its own augmentation.
    """

    def __init__(self, sampler, seed):
        self.sampler = sampler
        self.seed = int(seed)
        self.epoch = 0
        self._passes = 0

    def set_epoch(self, epoch):
        self.epoch = int(epoch)
        self._passes = 0

    def __iter__(self):
        epoch = self.epoch + self._passes
        self._passes += 1
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
        if hasattr(self.sampler, "occurrences"):
            for index, k in zip(self.sampler, self.sampler.occurrences(), strict=True):
                yield index, sample_seed(self.seed, epoch, index, k)
            return
        for index in self.sampler:
            yield index, sample_seed(self.seed, epoch, index)

    def __len__(self):
        return len(self.sampler)


class SeededDataset(torch.utils.data.Dataset):
    """``dataset[index]`` computed with the generators seeded from the item's own seed.

    Items are requested as ``(index, seed)`` (from :class:`SeededSampler`); torch's CPU
    generator, numpy's global and Python's ``random`` are seeded from ``seed`` for the call; in
    the main process (no workers) they are restored after it, so the training process's random
    streams are untouched. ``dataset`` is the wrapped data set; ``len`` is its length.
    """

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, item):
        index, seed = item
        if torch.utils.data.get_worker_info() is not None:
            # A worker's generators serve only its data set: no need to restore them.
            _seed_all(seed)
            return self.dataset[index]
        py_state, np_state = random.getstate(), np.random.get_state()
        try:
            with torch.random.fork_rng(devices=[]):
                _seed_all(seed)
                return self.dataset[index]
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


def _seed_all(seed):
    # The CPU generator only: torch.manual_seed would also queue a seeding of every lazily
    # initialised accelerator, at a cost per call (and per item).
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)


def _world(num_replicas, rank):
    """``(num_replicas, rank)``: the given ones, else the process group's, else ``(1, 0)``."""
    if num_replicas is None or rank is None:
        grouped = dist.is_available() and dist.is_initialized()
        if num_replicas is None:
            num_replicas = dist.get_world_size() if grouped else 1
        if rank is None:
            rank = dist.get_rank() if grouped else 0
    if not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"num_replicas must be a positive int, got {num_replicas!r}")
    if not isinstance(rank, int) or not 0 <= rank < num_replicas:
        raise ValueError(f"rank must be an int in [0, {num_replicas}), got {rank!r}")
    return num_replicas, rank


def seed_worker(worker_id):
    """``worker_init_fn``: seed numpy and ``random`` from the worker's torch seed (which the
    DataLoader derives from its seeded generator), as PyTorch's reproducibility notes do."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def make_loader(dataset, batch_size, *, train, workers, seed, device, num_replicas=None,
                rank=None, train_sampler=None):
    """A DataLoader over ``dataset`` for training (``train=True``) or evaluation.

    ``batch_size`` is the per-rank batch; ``workers`` the worker processes (0: load in this
    process); ``seed`` fixes order and augmentation (see the module docstring; pass
    ``seed + epoch`` or call ``loader.sampler.set_epoch(epoch)``); ``device`` (``"cpu"``,
    ``"cuda"``, ``"cuda:1"``, a ``torch.device``) decides pinned memory. ``num_replicas`` and
    ``rank`` default to the initialised process group (else one process). Items are those of
    ``dataset``; ``loader.dataset.dataset`` is ``dataset`` itself and ``loader.sampler.sampler``
    the ``DistributedSampler`` (or ``train_sampler``'s sampler) or :class:`ShardSampler`.

    ``train_sampler`` (training only): a callable ``(num_replicas, rank, seed) -> sampler``
    whose sampler yields this rank's indices into ``dataset`` and has ``set_epoch(epoch)``
    (its order must be a function of ``seed`` and the epoch, the same on every rank, for the
    run to stay reproducible); it is used instead of the ``DistributedSampler``, with the same
    check that the rank gets at least one full batch. E.g. ``lambda n, r, s:
    ClassUniformSampler(presence, num_classes, num_replicas=n, rank=r, seed=s)``.
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
        raise ValueError(f"workers must be an int >= 0, got {workers!r}")
    num_replicas, rank = _world(num_replicas, rank)
    if train_sampler is not None and not train:
        raise ValueError("train_sampler replaces the training sampler; evaluation loaders "
                         "(train=False) always shard with ShardSampler")
    if train:
        if train_sampler is None:
            inner = DistributedSampler(dataset, num_replicas=num_replicas, rank=rank,
                                       shuffle=True, seed=int(seed), drop_last=True)
        else:
            inner = train_sampler(num_replicas, rank, int(seed))
            if not callable(getattr(inner, "set_epoch", None)):
                raise TypeError(f"train_sampler returned {type(inner).__name__}, which has no "
                                "set_epoch(epoch) method")
        if len(inner) < batch_size:
            raise ValueError(
                f"the training set has {len(dataset)} samples, {len(inner)} per rank over "
                f"{num_replicas} ranks: fewer than one batch of batch_size={batch_size} "
                "(incomplete batches are dropped)")
    else:
        inner = ShardSampler(dataset, num_replicas, rank)
    generator = torch.Generator()
    generator.manual_seed(int(seed))
    return DataLoader(
        SeededDataset(dataset),
        batch_size=batch_size,
        sampler=SeededSampler(inner, seed),
        drop_last=bool(train),
        num_workers=workers,
        pin_memory=torch.device(device).type == "cuda",
        persistent_workers=workers > 0,
        worker_init_fn=seed_worker,
        generator=generator,
    )


__all__ = ["SeededDataset", "SeededSampler", "ShardSampler", "make_loader", "sample_seed",
           "seed_worker"]
