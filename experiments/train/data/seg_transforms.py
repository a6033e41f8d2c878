"""The paper's segmentation augmentation and evaluation, as joint ``(image, target)`` transforms.

InPlace-ABN §4.2 trains its segmentation networks on random crops of images that were flipped
horizontally (probability 0.5) and rescaled by a random factor in ``[0.7, 2.0]``;
:class:`SegmentationTrain` does that, in that order, to an image and its label map together:

1. flip both left-right with probability ``flip``;
2. scale both by ``s ~ U(scale)`` (the image bilinearly, the label map with nearest neighbour,
   so labels stay labels), sizes rounded, at least one pixel;
3. normalise the image by the per-channel ``mean`` and ``std``;
4. take a ``crop`` x ``crop`` window at a uniformly random position. Along a side where the
   scaled image is shorter than ``crop``, the whole side is kept, placed at a random offset,
   and the rest is padded: the image with zeros after normalisation (the mean colour, as the
   CIFAR recipe of :mod:`.transforms` pads) and the target with the void id 255, so the padding
   adds no loss.

It returns ``(float32 tensor (3, crop, crop), int64 tensor (crop, crop))``, ready to batch.
Random numbers come from torch's global generator (the loaders of :mod:`.loaders` seed it per
sample, so the augmentation is a function of the run's seed, the epoch and the sample).
:class:`SegmentationEval` only normalises: the whole image, at its own size, with its target.

Both take the image as a PIL image (converted to RGB) and the target as a ``uint8`` array or a
PIL image of the same size, as :class:`~.segmentation.SegmentationDataset` hands them over.
Both are module-level classes, so datasets holding them pickle into DataLoader workers.
"""
import numbers

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import functional as F

from .segmentation import IGNORE_INDEX
from .transforms import IMAGENET_MEAN, IMAGENET_STD


def _check_stats(mean, std):
    mean, std = tuple(mean), tuple(std)
    for name, v in (("mean", mean), ("std", std)):
        if len(v) != 3 or not all(isinstance(x, numbers.Real) for x in v):
            raise ValueError(f"{name} must be 3 numbers (R, G, B), got {v!r}")
    if not all(x > 0 for x in std):
        raise ValueError(f"std must be positive, got {std!r}")
    return tuple(map(float, mean)), tuple(map(float, std))


def _inputs(image, target):
    """``(RGB PIL image, uint8 (H, W) array)``, checked to be the same size."""
    if not isinstance(image, Image.Image):
        raise TypeError(f"image must be a PIL image, got {type(image).__name__}")
    image = image.convert("RGB")
    target = np.asarray(target)
    if target.ndim != 2 or target.dtype != np.uint8:
        raise ValueError(f"target must be a uint8 map of shape (H, W), got {target.dtype} "
                         f"{target.shape}")
    if target.shape != (image.height, image.width):
        raise ValueError(f"target is {target.shape[1]}x{target.shape[0]} but the image is "
                         f"{image.width}x{image.height} (width x height)")
    return image, target


def _window(size, crop):
    """``(source start, destination start, length)`` of a random crop along one side."""
    if size >= crop:
        return int(torch.randint(size - crop + 1, ()).item()), 0, crop
    return 0, int(torch.randint(crop - size + 1, ()).item()), size


class SegmentationTrain:
    """Flip, random scale, normalise, random ``crop`` x ``crop`` crop padded with the mean
    colour and void (see the module docstring). ``scale`` is ``(min, max)``, ``0 < min <=
    max``; ``flip`` the flip probability in ``[0, 1]``."""

    def __init__(self, crop, scale=(0.7, 2.0), flip=0.5, mean=IMAGENET_MEAN, std=IMAGENET_STD):
        if not isinstance(crop, int) or isinstance(crop, bool) or crop < 1:
            raise ValueError(f"crop must be a positive int, got {crop!r}")
        try:
            lo, hi = scale
        except (TypeError, ValueError):
            raise ValueError(f"scale must be a pair (min, max), got {scale!r}") from None
        if not (isinstance(lo, numbers.Real) and isinstance(hi, numbers.Real)
                and 0 < lo <= hi < float("inf")):
            raise ValueError(f"scale must be (min, max) with 0 < min <= max, got {scale!r}")
        if not isinstance(flip, numbers.Real) or not 0 <= flip <= 1:
            raise ValueError(f"flip must be a probability in [0, 1], got {flip!r}")
        self.crop = crop
        self.scale = (float(lo), float(hi))
        self.flip = float(flip)
        self.mean, self.std = _check_stats(mean, std)

    def __call__(self, image, target):
        image, target = _inputs(image, target)
        if torch.rand(()).item() < self.flip:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            target = target[:, ::-1]
        lo, hi = self.scale
        s = lo + (hi - lo) * torch.rand(()).item()
        w, h = image.size
        size = (max(1, round(w * s)), max(1, round(h * s)))
        if size != (w, h):
            image = image.resize(size, Image.Resampling.BILINEAR)
            target = np.asarray(Image.fromarray(np.ascontiguousarray(target)).resize(
                size, Image.Resampling.NEAREST))
        x = F.normalize(F.to_tensor(image), self.mean, self.std)
        t = torch.from_numpy(np.array(target, dtype=np.int64))
        sy, dy, lh = _window(size[1], self.crop)
        sx, dx, lw = _window(size[0], self.crop)
        out_x = torch.zeros(3, self.crop, self.crop, dtype=torch.float32)
        out_t = torch.full((self.crop, self.crop), IGNORE_INDEX, dtype=torch.int64)
        out_x[:, dy:dy + lh, dx:dx + lw] = x[:, sy:sy + lh, sx:sx + lw]
        out_t[dy:dy + lh, dx:dx + lw] = t[sy:sy + lh, sx:sx + lw]
        return out_x, out_t

    def __repr__(self):
        return f"SegmentationTrain(crop={self.crop}, scale={self.scale}, flip={self.flip})"


class SegmentationEval:
    """The whole image normalised by ``mean``/``std`` (float32 ``(3, H, W)``) with its target
    as int64 ``(H, W)``; no resizing, no cropping."""

    def __init__(self, mean=IMAGENET_MEAN, std=IMAGENET_STD):
        self.mean, self.std = _check_stats(mean, std)

    def __call__(self, image, target):
        image, target = _inputs(image, target)
        x = F.normalize(F.to_tensor(image), self.mean, self.std)
        return x, torch.from_numpy(np.array(target, dtype=np.int64))

    def __repr__(self):
        return "SegmentationEval()"


__all__ = ["SegmentationEval", "SegmentationTrain"]
