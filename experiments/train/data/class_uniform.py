"""Class-uniform sampling of segmentation training images (InPlace-ABN §4.2).

The paper: "we compiled the minibatches per epoch in a way to show all classes uniformly
instead of randomly perturbing the dataset (thus following an oversampling strategy for
underrepresented categories)". :class:`ClassUniformSampler` builds each epoch that way:

- the epoch is a global list of ``length`` image indices (default: one per image). Slot ``j``
  is devoted to class ``order[j % C']``, where ``C'`` are the classes present in at least one
  image and ``order`` is a random permutation of them, drawn afresh for every cycle of ``C'``
  slots; the slot's image is drawn uniformly among the images that contain its class. Over a
  cycle every present class is shown exactly once, so a class in 1% of the images is shown
  as often as one in every image: rare classes are oversampled, images with many classes
  appear more often than images with few, and an image may appear several times in an epoch;
- classes in no image cannot be shown: they are skipped and listed in ``absent_classes``;
- the list is a function of ``(seed, epoch)`` only (numpy's ``Generator`` seeded with
  ``SeedSequence([seed, epoch])``), the same on every rank; it is then sharded as
  ``DistributedSampler(drop_last=True)`` shards: truncated to a multiple of ``num_replicas``,
  rank ``r`` takes slots ``r, r + num_replicas, ...``. ``len(sampler)`` is the rank's share.

``presence`` is one list of train ids per image (what
:meth:`~.segmentation.SegmentationDataset.class_presence` returns). Call ``set_epoch(e)``
before each epoch, as for ``DistributedSampler`` (``make_loader(train_sampler=...)`` does).
Because an image can fill several slots of one epoch, :meth:`occurrences` says, per slot of
the rank, how many earlier slots of the global list hold the same image, so that the loaders
give each repetition its own augmentation seed (see :class:`~.loaders.SeededSampler`).
"""
import numpy as np
from torch.utils.data import Sampler

from .loaders import _world


def _non_negative_int(name, value):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return int(value)


class ClassUniformSampler(Sampler):
    """Per-epoch class-uniform image indices, sharded over ranks (see the module docstring)."""

    def __init__(self, presence, num_classes, *, num_replicas=None, rank=None, seed=0,
                 length=None):
        if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
        presence = [list(p) for p in presence]
        if not presence:
            raise ValueError("presence is empty: no images to sample")
        members = [[] for _ in range(num_classes)]
        for i, ids in enumerate(presence):
            for c in ids:
                if not isinstance(c, (int, np.integer)) or not 0 <= c < num_classes:
                    raise ValueError(f"presence[{i}] holds {c!r}, not a class id in "
                                     f"[0, {num_classes})")
                members[int(c)].append(i)
        self.num_images = len(presence)
        self.num_classes = num_classes
        self.classes = np.array([c for c in range(num_classes) if members[c]], dtype=np.int64)
        self.absent_classes = [c for c in range(num_classes) if not members[c]]
        if not len(self.classes):
            raise ValueError("no image contains any class: nothing to sample class-uniformly")
        # Images of every present class, concatenated; class k of self.classes owns
        # _images[_start[k]:_start[k] + _count[k]] (each image once per class).
        groups = [np.unique(np.array(members[c], dtype=np.int64)) for c in self.classes]
        self._count = np.array([len(g) for g in groups], dtype=np.int64)
        self._start = np.concatenate(([0], np.cumsum(self._count)[:-1]))
        self._images = np.concatenate(groups)
        self.length = self.num_images if length is None else length
        if not isinstance(self.length, int) or isinstance(self.length, bool) or self.length < 1:
            raise ValueError(f"length must be a positive int, got {length!r}")
        self.num_replicas, self.rank = _world(num_replicas, rank)
        self.seed = _non_negative_int("seed", seed)
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = _non_negative_int("epoch", epoch)

    def _draw(self, epoch):
        """``(slot classes as positions in self.classes, image indices)`` of ``epoch``."""
        epoch = self.epoch if epoch is None else _non_negative_int("epoch", epoch)
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, epoch]))
        cycles = -(-self.length // len(self.classes))
        slots = np.concatenate([rng.permutation(len(self.classes)) for _ in range(cycles)])
        slots = slots[:self.length]
        pick = rng.integers(0, self._count[slots])
        return slots, self._images[self._start[slots] + pick]

    def epoch_indices(self, epoch=None):
        """The global list of ``length`` image indices of ``epoch`` (default: the current)."""
        return self._draw(epoch)[1]

    def slot_classes(self, epoch=None):
        """The class each slot of :meth:`epoch_indices` shows (same epoch, same draws)."""
        return self.classes[self._draw(epoch)[0]]

    def _shard(self, values):
        total = self.length - self.length % self.num_replicas
        return values[self.rank:total:self.num_replicas]

    def occurrences(self):
        """For each index this rank yields in the current epoch, how many earlier slots of the
        epoch's global list hold the same image (0 for its first appearance)."""
        indices = self.epoch_indices()
        order = np.argsort(indices, kind="stable")
        sorted_idx = indices[order]
        first = np.searchsorted(sorted_idx, sorted_idx, side="left")
        counts = np.empty_like(indices)
        counts[order] = np.arange(len(indices)) - first
        return self._shard(counts).tolist()

    def __iter__(self):
        return iter(self._shard(self.epoch_indices()).tolist())

    def __len__(self):
        return self.length // self.num_replicas

    def __repr__(self):
        return (f"ClassUniformSampler(images={self.num_images}, classes={len(self.classes)}"
                f"/{self.num_classes}, length={self.length}, rank={self.rank}"
                f"/{self.num_replicas}, seed={self.seed}, epoch={self.epoch})")


__all__ = ["ClassUniformSampler"]
