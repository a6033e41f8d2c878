"""The shared base of the semantic-segmentation data sets (InPlace-ABN Table 2).

Cityscapes, COCO-Stuff and Mapillary Vistas differ only in where their files are and in how a
raw label value becomes a training class; everything else is the same and lives here, in
:class:`SegmentationDataset`:

- a list of ``(image_path, label_path)`` samples (``label_path`` is ``None`` where a split has
  no labels, e.g. the test sets: the target is then all :data:`IGNORE_INDEX`);
- the training classes (``classes``, ``num_classes``) and a ``uint8`` lookup table of 256
  entries, raw label value -> train id, or :data:`IGNORE_INDEX` (255) for void: the three
  releases store labels as 8-bit PNGs (single-channel ``"L"`` or palette ``"P"``, whose
  pixel values are read as their palette indices), so one table lookup maps a whole map;
- optionally the raw values the release defines (``valid``, e.g. Cityscapes' labelIds
  0..33): a label map holding any other value is not that release's (a corrupt file, a
  labelTrainIds map saved under the labelIds name) and raises, naming the file and the values,
  where mapping it to void would train and score on wrong labels without a word (the official
  Cityscapes evaluator stops too: "Unknown label with id 250");
- an optional joint ``transform(image, target)``: segmentation augmentation must move the
  image and its label map together (flip, scale, crop; see :mod:`.seg_transforms`).

An item is ``(PIL RGB image, uint8 numpy target of shape (H, W))`` without a transform, else
whatever ``transform(image, target)`` returns for those two. A label map is never resized to
fit its image: one of another size is a wrongly paired or corrupt file and raises
:class:`~experiments.train.data.errors.DatasetLayoutError` naming both files and both sizes, as
does a label map that cannot be decoded or is not an 8-bit map.

:meth:`SegmentationDataset.check_headers` checks every pair's files as far as their headers
tell (the image opens, the label map is an 8-bit map of its image's size), reading headers only
(PIL decodes pixels lazily), so a training point finds a bad file before its first epoch, not
when its first evaluation reads it; :meth:`SegmentationDataset.verify` decodes every image and
label map (and checks the label values), for a tree that may hold corrupt files.

:meth:`SegmentationDataset.class_presence` lists the train ids each sample contains; it reads
every label map once (then caches the answer on the instance) and feeds the class-uniform
sampling of :mod:`.class_uniform`.
"""
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from .errors import DatasetLayoutError

IGNORE_INDEX = 255
LABEL_MODES = ("L", "P")
_READ_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


def _ranges(values):
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    runs, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            runs.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ", ".join(runs)


def make_lut(mapping, num_classes):
    """A ``uint8`` table of 256 entries: ``lut[raw] = mapping[raw]``, :data:`IGNORE_INDEX`
    for every raw value not in ``mapping``. Train ids must lie in ``[0, num_classes)``."""
    lut = np.full(256, IGNORE_INDEX, dtype=np.uint8)
    for raw, train_id in mapping.items():
        if not 0 <= raw < 256:
            raise ValueError(f"raw label value {raw} is not an 8-bit value")
        if not 0 <= train_id < num_classes:
            raise ValueError(f"train id {train_id} (for raw value {raw}) is outside "
                             f"[0, {num_classes})")
        lut[raw] = train_id
    return lut


def read_rgb(path, expected):
    """Decode ``path`` into an RGB PIL image (grayscale and CMYK images are converted)."""
    try:
        with open(path, "rb") as f:
            return Image.open(f).convert("RGB")
    except _READ_ERRORS as exc:
        raise DatasetLayoutError.at(path, f"cannot read or decode the image "
                                    f"({type(exc).__name__}: {exc})", expected) from exc


def read_label(path, expected):
    """The raw label map at ``path`` as a ``uint8`` array ``(H, W)``: the pixel values of an
    ``"L"`` PNG, the palette indices of a ``"P"`` PNG. Anything else is a layout error."""
    try:
        with Image.open(path) as image:
            image.load()
            mode = image.mode
            if mode in LABEL_MODES:
                return np.asarray(image, dtype=np.uint8)
    except _READ_ERRORS as exc:
        raise DatasetLayoutError.at(path, f"cannot read or decode the label map "
                                    f"({type(exc).__name__}: {exc})", expected) from exc
    raise DatasetLayoutError.at(
        path, f"label map has PIL mode {mode!r}, not an 8-bit single-channel ('L') or palette "
        "('P') PNG of label values", expected)


def _header(path, what, expected):
    """``(mode, (width, height))`` of the image file at ``path`` from its header only (PIL
    decodes pixels lazily)."""
    try:
        with Image.open(path) as image:
            return image.mode, image.size
    except _READ_ERRORS as exc:
        raise DatasetLayoutError.at(path, f"cannot read the {what} "
                                    f"({type(exc).__name__}: {exc})", expected) from exc


def checked_root(root, split, splits, expected):
    """``root`` as a ``Path``, after checking that ``split`` is one of ``splits`` (a
    ``ValueError``) and that ``root`` is a folder (a :class:`DatasetLayoutError` naming it)."""
    if split not in splits:
        raise ValueError(f"split must be one of {splits}, got {split!r}")
    root = Path(root)
    if not root.is_dir():
        raise DatasetLayoutError.at(root, "no such folder", expected)
    return root


def partner(path, other, what, expected, required=True):
    """The file ``other`` that goes with ``path`` (its label map, or its image), if it exists;
    else a :class:`DatasetLayoutError` naming ``other`` as the missing ``what`` of ``path``
    (``required``), or ``None``."""
    if other.is_file():
        return other
    if required:
        raise DatasetLayoutError.at(other, f"missing {what} for {path}", expected)
    return None


class SegmentationDataset(torch.utils.data.Dataset):
    """Samples ``(image_path, label_path or None)`` with a label lookup table and class names.

    ``samples`` must not be empty; ``classes`` are the train-id names (``num_classes`` of
    them); ``lut`` a ``uint8`` array of 256 entries, each a train id in ``[0, num_classes)`` or
    :data:`IGNORE_INDEX`; ``root`` and ``expected`` (a one-line description of the layout)
    go into the errors; ``valid`` (``None``: every value) the raw label values the release
    defines, any other one in a label map being an error. Subclasses find and validate their
    samples, then call this.
    """

    IGNORE_INDEX = IGNORE_INDEX

    def __init__(self, samples, classes, lut, transform=None, *, root, expected, valid=None):
        self.root = Path(root)
        self.expected = expected
        self.samples = [(Path(i), None if t is None else Path(t)) for i, t in samples]
        if not self.samples:
            raise DatasetLayoutError.at(self.root, "no samples (no images found)", expected)
        self.classes = list(classes)
        self.num_classes = len(self.classes)
        if not 0 < self.num_classes < IGNORE_INDEX:
            raise ValueError(f"need 1 to {IGNORE_INDEX - 1} classes, got {self.num_classes}")
        lut = np.asarray(lut)
        if lut.shape != (256,) or lut.dtype != np.uint8:
            raise ValueError(f"lut must be a uint8 array of 256 entries, got {lut.dtype} "
                             f"{lut.shape}")
        bad = (lut >= self.num_classes) & (lut != IGNORE_INDEX)
        if bad.any():
            raw = int(np.flatnonzero(bad)[0])
            raise ValueError(f"lut maps raw value {raw} to {int(lut[raw])}, neither a train id "
                             f"in [0, {self.num_classes}) nor {IGNORE_INDEX}")
        self.lut = lut
        self.valid = np.ones(256, bool) if valid is None else np.isin(np.arange(256), list(valid))
        self.transform = transform
        self._presence = None

    def __len__(self):
        return len(self.samples)

    def extend(self, other):
        """Append the samples of ``other``, another split of the same release (the same
        classes and label table), and return ``self``: the training set of a test-set model
        is the training and validation splits together."""
        if other.classes != self.classes or not np.array_equal(other.lut, self.lut):
            raise ValueError(f"{other!r} has other classes or labels than {self!r}")
        self.samples += other.samples
        self._presence = None
        return self

    def raw_ids(self):
        """The release's label value of each train id, ``uint8`` of shape ``(num_classes,)``:
        the inverse of the lookup table, so predictions are written in the ids the release's
        benchmark reads. A train id that no value, or several, map to has no one raw value
        and raises ``ValueError``."""
        raw = np.empty(self.num_classes, np.uint8)
        for train_id in range(self.num_classes):
            values = np.flatnonzero(self.lut == train_id)
            if values.size != 1:
                raise ValueError(f"train id {train_id} ({self.classes[train_id]!r}) is the "
                                 f"image of raw values {values.tolist()}, not of exactly one")
            raw[train_id] = values[0]
        return raw

    def _target(self, index, size):
        """The train-id map of sample ``index``; ``size`` is its image's ``(width, height)``."""
        image_path, label_path = self.samples[index]
        if label_path is None:
            return np.full((size[1], size[0]), IGNORE_INDEX, dtype=np.uint8)
        raw = self._raw_label(label_path)
        self._check_size(image_path, size, label_path, (raw.shape[1], raw.shape[0]))
        return self.lut[raw]

    def _raw_label(self, label_path):
        """The raw label map at ``label_path``, its values checked against ``valid``."""
        raw = read_label(label_path, self.expected)
        values = np.flatnonzero(np.bincount(raw.ravel(), minlength=256))
        bad = values[~self.valid[values]]
        if bad.size:
            raise DatasetLayoutError.at(
                label_path, f"label values {bad.tolist()} are not in the release's label table "
                f"(allowed: {_ranges(np.flatnonzero(self.valid))}): a corrupt map, or a map of "
                "other ids (e.g. train ids) under this name", self.expected)
        return raw

    def _check_size(self, image_path, image_size, label_path, label_size):
        if tuple(label_size) != tuple(image_size):
            raise DatasetLayoutError.at(
                label_path, f"label map is {label_size[0]}x{label_size[1]} (width x height) but "
                f"its image {image_path} is {image_size[0]}x{image_size[1]}; a label map must "
                "match its image pixel for pixel (labels are never resized)", self.expected)

    def check_headers(self):
        """Check every sample from its files' headers (no pixel is decoded): the image opens,
        the label map is an 8-bit (``"L"`` or ``"P"``) map of the image's size. Raises the
        :class:`DatasetLayoutError` its first read would, naming the file."""
        for image_path, label_path in self.samples:
            _, size = _header(image_path, "image", self.expected)
            if label_path is None:
                continue
            mode, label_size = _header(label_path, "label map", self.expected)
            if mode not in LABEL_MODES:
                raise DatasetLayoutError.at(
                    label_path, f"label map has PIL mode {mode!r}, not an 8-bit single-channel "
                    "('L') or palette ('P') PNG of label values", self.expected)
            self._check_size(image_path, size, label_path, label_size)

    def verify(self):
        """Decode every image and label map and check the label values: every error a read
        would raise, before any is read for training."""
        for index in range(len(self)):
            self._target(index, read_rgb(self.samples[index][0], self.expected).size)

    def __getitem__(self, index):
        image = read_rgb(self.samples[index][0], self.expected)
        target = self._target(index, image.size)
        if self.transform is None:
            return image, target
        return self.transform(image, target)

    def class_presence(self):
        """For each sample, the sorted train ids (void excluded) present in its label map.

        Reads every label map on the first call (sizes are not checked here: only the label
        files are opened) and caches the answer on the instance; samples without labels have
        none. Returns a new list of lists each call.
        """
        if self._presence is None:
            presence = []
            for _, label_path in self.samples:
                if label_path is None:
                    presence.append(())
                    continue
                raw = self._raw_label(label_path)
                values = np.flatnonzero(np.bincount(raw.ravel(), minlength=256))
                ids = np.unique(self.lut[values])
                presence.append(tuple(int(c) for c in ids if c != IGNORE_INDEX))
            self._presence = presence
        return [list(p) for p in self._presence]

    def __repr__(self):
        split = getattr(self, "split", None)
        split = "" if split is None else f", split={split!r}"
        return (f"{type(self).__name__}(root={str(self.root)!r}{split}, images={len(self)}, "
                f"classes={self.num_classes})")


__all__ = ["IGNORE_INDEX", "LABEL_MODES", "SegmentationDataset", "checked_root", "make_lut",
           "partner",
           "read_label",
           "read_rgb"]
