"""ImageNet (ILSVRC-2012) as an ImageFolder tree, validated before training.

The layout is the one the InPlace-ABN authors' ``scripts/train_imagenet.py`` reads through
``torchvision.datasets.ImageFolder`` (their README, "Data preparation")::

    root/train/<wnid>/*.JPEG        one folder per class, e.g. train/n01440764/n01440764_10026.JPEG
    root/val/<wnid>/*.JPEG          the same class folders; the 50,000 validation images must be
                                    sorted into them (the archive ships them in one flat folder)

Classes are the sorted folder names of ``train/``; a label is the index of its folder's name
in that list, for both splits, so ``val/`` must have exactly the class folders of ``train/``
(a folder that is not a training class would be a label outside the class list). Images are
found as ``ImageFolder`` finds them (files with one of its extensions, case-insensitive, in a
class folder and its sub-folders, sorted), so the samples, their order and their labels are
those of ``ImageFolder`` on the same tree.

What is checked when :class:`ImageNet` is built, each failure a
:class:`~experiments.train.data.errors.DatasetLayoutError` naming the path and the layout: the
root and split folders exist; the split has class folders (and no loose images beside them,
the unsorted-validation mistake); no class folder is empty; the class folders of ``val/`` are
those of ``train/``. Decoding every image here would mean opening each of the 1.28 million
training files before the first step, so images are only decoded when read: an image that
cannot be decoded raises the same error naming the file (``verify=True`` checks every file's
header at construction instead, for small trees).
"""
import os
from pathlib import Path

import torch
from PIL import Image
from torchvision.datasets.folder import IMG_EXTENSIONS
from torchvision.transforms.functional import to_tensor

from .errors import DatasetLayoutError

SPLITS = ("train", "val")

EXPECTED_LAYOUT = ("ROOT/train/<wnid>/<image>.JPEG and ROOT/val/<wnid>/<image>.JPEG "
                   "(torchvision ImageFolder): one folder per class in each split, the same "
                   "class folders in val/ as in train/, each holding at least one readable "
                   f"image ({', '.join(IMG_EXTENSIONS)})")


def _is_image(name):
    return name.lower().endswith(IMG_EXTENSIONS)


def _class_folders(split_dir):
    """Sorted class folder names of a split; errors for a missing, empty or unsorted split."""
    if not split_dir.is_dir():
        raise DatasetLayoutError.at(split_dir, "no such folder", EXPECTED_LAYOUT)
    entries = list(os.scandir(split_dir))
    classes = sorted(e.name for e in entries if e.is_dir())
    loose = sorted(e.name for e in entries if e.is_file() and _is_image(e.name))
    if loose:
        raise DatasetLayoutError.at(
            split_dir, f"holds {len(loose)} image files directly (e.g. {loose[0]}) instead of "
            "in class folders; sort them into <wnid>/ folders (the ILSVRC-2012 validation "
            "archive must be rearranged so)", EXPECTED_LAYOUT)
    if not classes:
        raise DatasetLayoutError.at(split_dir, "has no class folders", EXPECTED_LAYOUT)
    return classes


def _images(class_dir):
    """Image paths under a class folder, in ImageFolder's order (sorted walk, sorted names)."""
    paths = []
    for dirpath, _, names in sorted(os.walk(class_dir, followlinks=True)):
        paths.extend(os.path.join(dirpath, n) for n in sorted(names) if _is_image(n))
    return paths


def _open_rgb(path):
    """Decode ``path`` into an RGB PIL image (grayscale and CMYK JPEGs are converted)."""
    try:
        with open(path, "rb") as f:
            image = Image.open(f)
            return image.convert("RGB")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise DatasetLayoutError.at(path, f"cannot read or decode the image ({type(exc).__name__}: "
                                    f"{exc})", EXPECTED_LAYOUT) from exc


def _verify(path):
    try:
        with Image.open(path) as image:
            image.verify()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise DatasetLayoutError.at(path, f"not a readable image ({type(exc).__name__}: "
                                    f"{exc})", EXPECTED_LAYOUT) from exc


class ImageNet(torch.utils.data.Dataset):
    """One split (``"train"`` or ``"val"``) of an ImageNet-layout tree under ``root``.

    The tree is validated here (see the module docstring). ``classes`` are the class folder
    names (wnids) of ``root/train``, ``class_to_idx`` maps them to labels, ``samples`` lists
    ``(path, label)`` pairs and ``targets`` the labels, as in ``ImageFolder``. An item is
    ``(image, label)``: ``transform(PIL RGB image)`` if a transform is given, else the image as
    a float tensor ``(3, H, W)`` in ``[0, 1]`` (images keep their own sizes). ``verify=True``
    also opens every file's header now (``PIL.Image.verify``) so a corrupt file fails before
    training; otherwise it fails when it is read, with the same error.
    """

    def __init__(self, root, split, transform=None, *, verify=False):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.root = Path(root)
        self.split = split
        self.transform = transform
        if not self.root.is_dir():
            raise DatasetLayoutError.at(self.root, "no such folder", EXPECTED_LAYOUT)
        self.classes = _class_folders(self.root / "train")
        if split != "train":
            split_classes = _class_folders(self.root / split)
            if split_classes != self.classes:
                extra = sorted(set(split_classes) - set(self.classes))
                missing = sorted(set(self.classes) - set(split_classes))
                problems = []
                if extra:
                    problems.append(f"{len(extra)} class folders that are not training classes "
                                    f"(labels outside the class list), e.g. {extra[:3]}")
                if missing:
                    problems.append(f"no folder for {len(missing)} training classes, e.g. "
                                    f"{missing[:3]}")
                raise DatasetLayoutError.at(self.root / split, "; ".join(problems),
                                            EXPECTED_LAYOUT)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.samples = []
        for name in self.classes:
            class_dir = self.root / split / name
            paths = _images(class_dir)
            if not paths:
                raise DatasetLayoutError.at(class_dir, "empty class folder (no image files)",
                                            EXPECTED_LAYOUT)
            label = self.class_to_idx[name]
            self.samples.extend((p, label) for p in paths)
        self.targets = [label for _, label in self.samples]
        if verify:
            for path, _ in self.samples:
                _verify(path)

    def verify(self):
        """Decode every image (hours for the full training split): a corrupt file fails now,
        with the error its read would raise, rather than in the middle of training."""
        for path, _ in self.samples:
            _open_rgb(path)

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path, label = self.samples[index]
        image = _open_rgb(path)
        if self.transform is None:
            return to_tensor(image), label
        return self.transform(image), label

    def __repr__(self):
        return (f"ImageNet(root={str(self.root)!r}, split={self.split!r}, "
                f"images={len(self)}, classes={len(self.classes)})")


__all__ = ["EXPECTED_LAYOUT", "ImageNet", "SPLITS"]
