"""CIFAR-10 and CIFAR-100 read from torchvision's on-disk format, validated before training.

The format is the "python version" of the data sets as released by Krizhevsky and as
``torchvision.datasets.CIFAR10`` / ``CIFAR100`` read them: under ``root``,

- ``cifar-10-batches-py/``: ``data_batch_1`` ... ``data_batch_5`` (training), ``test_batch``,
  ``batches.meta`` (``label_names``: the 10 class names);
- ``cifar-100-python/``: ``train``, ``test``, ``meta`` (``fine_label_names``: 100 names,
  ``coarse_label_names``: 20 names);

each a pickled dict whose ``data`` is a ``uint8`` array of shape ``(N, 3072)`` (one image per
row: the 32x32 red plane, then green, then blue) and whose ``labels`` (CIFAR-10) or
``fine_labels`` and ``coarse_labels`` (CIFAR-100) hold N integers.

:class:`CIFAR` checks all of that when it is built, so a wrong file fails before the first
step rather than as a shape error deep in a model, or silently as a label the loss never
sees: a missing folder or file, a truncated or foreign pickle, a missing key, a wrong dtype or
shape, a label count that does not match the images, a label outside ``[0, classes)`` (the
class count comes from the meta file and must be 10 or 100) each raise
:class:`~experiments.train.data.errors.DatasetLayoutError` naming the file and the expected
layout. The files are pickles: they are read with an unpickler that resolves only what the
format needs (numpy arrays, dtypes and scalars), so a file that refers to anything else is
refused instead of run. torchvision additionally compares MD5 sums with the released files;
this class does not, so the generated data sets of :mod:`.generate` load as the real ones do.
"""
import codecs
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from .errors import DatasetLayoutError

try:  # numpy >= 2
    from numpy._core import multiarray as _multiarray
except ImportError:  # numpy 1.x
    from numpy.core import multiarray as _multiarray


@dataclass(frozen=True)
class _Layout:
    folder: str
    train_files: tuple
    test_files: tuple
    meta_file: str
    names_key: str
    label_key: str
    num_classes: int
    coarse_names_key: str = None
    coarse_label_key: str = None
    num_coarse: int = None


LAYOUTS = {
    "cifar10": _Layout(
        folder="cifar-10-batches-py",
        train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
        test_files=("test_batch",),
        meta_file="batches.meta",
        names_key="label_names",
        label_key="labels",
        num_classes=10),
    "cifar100": _Layout(
        folder="cifar-100-python",
        train_files=("train",),
        test_files=("test",),
        meta_file="meta",
        names_key="fine_label_names",
        label_key="fine_labels",
        num_classes=100,
        coarse_names_key="coarse_label_names",
        coarse_label_key="coarse_labels",
        num_coarse=20),
}

IMAGE_BYTES = 3 * 32 * 32


def expected_layout(variant):
    """The layout :class:`CIFAR` expects for ``variant``, as one line for error messages."""
    lay = LAYOUTS[variant]
    files = ", ".join(lay.train_files + lay.test_files + (lay.meta_file,))
    labels = f"'{lay.label_key}'"
    names = f"'{lay.names_key}' ({lay.num_classes} names)"
    if lay.coarse_label_key:
        labels += f" and '{lay.coarse_label_key}' (in [0, {lay.num_coarse}))"
        names += f" and '{lay.coarse_names_key}' ({lay.num_coarse} names)"
    return (f"ROOT/{lay.folder}/{{{files}}}, torchvision's CIFAR python format: each batch a "
            f"pickled dict with 'data' (uint8 array of shape (N, {IMAGE_BYTES}): 32x32 R, G, B "
            f"planes per row) and {labels} (N integers in [0, {lay.num_classes})); "
            f"{lay.meta_file} a pickled dict with {names}")


class _FormatUnpickler(pickle.Unpickler):
    """Resolves only the globals a CIFAR pickle needs: numpy arrays, dtypes and scalars.

    Old (Python 2) pickles name numpy's ``numpy.core.multiarray``, new ones
    ``numpy._core.multiarray``; both map to the installed numpy.
    """

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"): _multiarray._reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): _multiarray._reconstruct,
        ("numpy.core.multiarray", "scalar"): _multiarray.scalar,
        ("numpy._core.multiarray", "scalar"): _multiarray.scalar,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): codecs.encode,
    }

    def find_class(self, module, name):
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refers to {module}.{name}, which a CIFAR batch does not contain") from None


def _load_pickle(path, variant):
    """Unpickle one CIFAR file (``encoding='latin1'``, as torchvision) into a dict with str keys."""
    if not path.is_file():
        raise DatasetLayoutError.at(path, "missing file", expected_layout(variant))
    try:
        with open(path, "rb") as f:
            obj = _FormatUnpickler(f, encoding="latin1").load()
    except Exception as exc:  # truncated, foreign or corrupt: every unpickling failure
        raise DatasetLayoutError.at(
            path, f"cannot read the pickle ({type(exc).__name__}: {exc}; truncated or not a "
            "CIFAR file?)", expected_layout(variant)) from exc
    if not isinstance(obj, dict):
        raise DatasetLayoutError.at(path, f"holds a {type(obj).__name__}, not a dict",
                                    expected_layout(variant))
    return {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in obj.items()}


def _names(meta, key, count, path, variant):
    if key not in meta:
        raise DatasetLayoutError.at(path, f"no key '{key}' (keys: {sorted(map(str, meta))})",
                                    expected_layout(variant))
    names = meta[key]
    if not isinstance(names, (list, tuple)):
        raise DatasetLayoutError.at(path, f"'{key}' is a {type(names).__name__}, not a list",
                                    expected_layout(variant))
    names = [n.decode("latin1") if isinstance(n, bytes) else n for n in names]
    if len(names) != count or not all(isinstance(n, str) for n in names):
        raise DatasetLayoutError.at(
            path, f"'{key}' has {len(names)} entries, expected {count} class names",
            expected_layout(variant))
    if len(set(names)) != count:
        raise DatasetLayoutError.at(path, f"'{key}' repeats a class name",
                                    expected_layout(variant))
    return names


def _labels(batch, key, rows, count, path, variant):
    if key not in batch:
        raise DatasetLayoutError.at(path, f"no key '{key}' (keys: {sorted(map(str, batch))})",
                                    expected_layout(variant))
    try:
        labels = np.asarray(batch[key])
    except Exception as exc:
        raise DatasetLayoutError.at(path, f"'{key}' is not a list of integers ({exc})",
                                    expected_layout(variant)) from exc
    if labels.ndim != 1 or labels.shape[0] != rows or (
            rows and not np.issubdtype(labels.dtype, np.integer)):
        raise DatasetLayoutError.at(
            path, f"'{key}' must be {rows} integers (one per image), got shape "
            f"{labels.shape} of {labels.dtype}", expected_layout(variant))
    bad = np.flatnonzero((labels < 0) | (labels >= count))
    if bad.size:
        i = int(bad[0])
        raise DatasetLayoutError.at(
            path, f"label {int(labels[i])} of image {i} ('{key}') is outside the {count} "
            f"classes [0, {count}) ({bad.size} such labels)", expected_layout(variant))
    return labels.astype(np.int64)


def _data(batch, path, variant):
    if "data" not in batch:
        raise DatasetLayoutError.at(path, f"no key 'data' (keys: {sorted(map(str, batch))})",
                                    expected_layout(variant))
    data = batch["data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 \
            or data.shape[1] != IMAGE_BYTES:
        what = (f"array of shape {data.shape} and dtype {data.dtype}"
                if isinstance(data, np.ndarray) else type(data).__name__)
        raise DatasetLayoutError.at(path, f"'data' is a {what}, expected uint8 (N, {IMAGE_BYTES})",
                                    expected_layout(variant))
    return data


class CIFAR(torch.utils.data.Dataset):
    """CIFAR-10 (``variant="cifar10"``) or CIFAR-100 (``"cifar100"``) from torchvision's format.

    ``root`` is the folder that contains ``cifar-10-batches-py/`` or ``cifar-100-python/`` (as
    torchvision's ``root``); ``train`` picks the training batches or the test batch. Every file
    is read and validated here (see the module docstring); the images are kept in memory as a
    ``uint8`` array ``data`` of shape ``(N, 32, 32, 3)`` with integer ``targets``.

    An item is ``(image, label)``: ``transform(PIL RGB image)`` when a transform is given (as
    torchvision, so its transforms apply unchanged), otherwise the image as a float tensor of
    shape ``(3, 32, 32)`` in ``[0, 1]``; the label is an ``int`` in ``[0, len(classes))``.
    ``classes`` are the meta file's names, ``class_to_idx`` maps them to labels; CIFAR-100
    also has ``coarse_classes`` and ``coarse_targets`` (its 20 superclasses).
    """

    def __init__(self, root, variant, train, transform=None):
        if variant not in LAYOUTS:
            raise ValueError(f"variant must be one of {sorted(LAYOUTS)}, got {variant!r}")
        lay = LAYOUTS[variant]
        self.root = Path(root)
        self.variant = variant
        self.train = bool(train)
        self.transform = transform
        expected = expected_layout(variant)
        if not self.root.is_dir():
            raise DatasetLayoutError.at(self.root, "no such folder", expected)
        folder = self.root / lay.folder
        if not folder.is_dir():
            raise DatasetLayoutError.at(folder, f"no such folder (for variant {variant!r})",
                                        expected)

        meta_path = folder / lay.meta_file
        meta = _load_pickle(meta_path, variant)
        self.classes = _names(meta, lay.names_key, lay.num_classes, meta_path, variant)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        if lay.coarse_names_key:
            self.coarse_classes = _names(meta, lay.coarse_names_key, lay.num_coarse, meta_path,
                                         variant)

        data, targets, coarse = [], [], []
        for name in lay.train_files if self.train else lay.test_files:
            path = folder / name
            batch = _load_pickle(path, variant)
            rows = _data(batch, path, variant)
            data.append(rows)
            targets.append(_labels(batch, lay.label_key, len(rows), lay.num_classes, path,
                                   variant))
            if lay.coarse_label_key:
                coarse.append(_labels(batch, lay.coarse_label_key, len(rows), lay.num_coarse,
                                      path, variant))
        data = np.concatenate(data)
        if len(data) == 0:
            raise DatasetLayoutError.at(folder, f"the {'training' if self.train else 'test'} "
                                        "batches hold no images", expected)
        # Rows are R, G, B planes; keep images as contiguous HWC uint8, as PIL and torchvision do.
        self.data = np.ascontiguousarray(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        self.targets = np.concatenate(targets).tolist()
        if lay.coarse_label_key:
            self.coarse_targets = np.concatenate(coarse).tolist()

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        image, label = self.data[index], self.targets[index]
        if self.transform is None:
            return torch.from_numpy(image).permute(2, 0, 1).float().div_(255), label
        return self.transform(Image.fromarray(image)), label

    def __repr__(self):
        split = "train" if self.train else "test"
        return (f"CIFAR(root={str(self.root)!r}, variant={self.variant!r}, split={split!r}, "
                f"images={len(self)}, classes={len(self.classes)})")


__all__ = ["CIFAR", "LAYOUTS", "expected_layout"]
